package node

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/lni/vfs"

	"github.com/lockmesh/lockmesh/internal/datadir"
)

// The data dir holds every lock, owner and token: a peer makes it
// readable by its own user only, also when it existed with a wider mode,
// and writes its own files 0600 (finding 9 of the security review: the
// dir was 0755 and the files 0644).
func TestDataDirIsPrivate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	peers := startClusterWith(t, clusterOpts{peers: 1, rf: 1, shards: 1}, func(_ int, c *Config) {
		c.DataDir, c.fs = dir, vfs.Default
	})
	lockAndUnlock(t, peers[0].node, "private/a")

	st, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Mode().Perm(); got != 0o700 {
		t.Errorf("data dir mode %v, want 0700", got)
	}
	for _, name := range []string{datadir.RecordFile} {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if got := st.Mode().Perm(); got != 0o600 {
			t.Errorf("%s mode %v, want 0600", name, got)
		}
	}
}
