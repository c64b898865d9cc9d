package node

import (
	"fmt"
	"os"

	"github.com/lni/vfs"
)

// The data dir holds the Raft logs (every lock, owner and token) and the
// cluster record: only the peer's own user may read it.
const (
	dataDirMode  = 0o700
	dataFileMode = 0o600
)

// restrictDataDir makes the data dir readable by its owner only, also
// when it existed before with a wider mode (the files dragonboat writes
// inside are then out of others' reach whatever their own mode).
func (n *Node) restrictDataDir() error {
	if n.cfg.fs != vfs.Default {
		return nil
	}
	st, err := os.Stat(n.cfg.DataDir)
	if err != nil {
		return fmt.Errorf("data dir %s: %w", n.cfg.DataDir, err)
	}
	if st.Mode().Perm()&^dataDirMode == 0 {
		return nil
	}
	if err := os.Chmod(n.cfg.DataDir, dataDirMode); err != nil {
		return fmt.Errorf("data dir %s is mode %v, readable by others, and cannot be restricted to %v: %w", n.cfg.DataDir, st.Mode().Perm(), os.FileMode(dataDirMode), err)
	}
	n.log.Info("data dir restricted to its owner", "dir", n.cfg.DataDir, "was", st.Mode().Perm().String())
	return nil
}
