package datadir

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lni/vfs"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/mesh"
)

func memDir(t *testing.T) Dir {
	t.Helper()
	d := Dir{FS: vfs.NewMem(), Path: "/data"}
	if err := d.Create(); err != nil {
		t.Fatal(err)
	}
	return d
}

// twoPeers is a layout of cluster 7 over peers a and b.
func twoPeers() *layout.Placement {
	return &layout.Placement{
		Epoch: 3, ClusterID: 7, Shards: 1, RF: 2,
		Peers: []layout.Peer{{Name: "a", NodeHostID: "nh-a"}, {Name: "b", NodeHostID: "nh-b"}},
		Replicas: map[uint64][]layout.Replica{
			layout.MetaShard: {{ID: 1, Peer: "a"}, {ID: 2, Peer: "b"}},
			2:                {{ID: 3, Peer: "a"}, {ID: 4, Peer: "b"}},
		},
		NextReplicaID: 5,
	}
}

// The data dir and what is written in it are readable by their owner
// only, also when the dir existed with a wider mode.
func TestCreateAndWriteArePrivate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "data")
	if err := os.Mkdir(path, 0o755); err != nil {
		t.Fatal(err)
	}
	d := Dir{FS: vfs.Default, Path: path}
	if err := d.Create(); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != DirMode {
		t.Fatalf("dir: %v %v, want mode %v", st.Mode().Perm(), err, os.FileMode(DirMode))
	}
	if err := d.WriteDurably("f", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(filepath.Join(path, "f")); err != nil || st.Mode().Perm() != FileMode {
		t.Fatalf("file: %v %v, want mode %v", st.Mode().Perm(), err, os.FileMode(FileMode))
	}
	if _, err := os.Stat(filepath.Join(path, "f.tmp")); !os.IsNotExist(err) {
		t.Fatalf("the temporary file is left: %v", err)
	}
}

func TestReadSmall(t *testing.T) {
	d := memDir(t)
	if raw, err := d.ReadSmall("none"); raw != nil || err != nil {
		t.Fatalf("a missing file: %q, %v; want nil, nil", raw, err)
	}
	if err := d.WriteDurably("f", []byte("one")); err != nil {
		t.Fatal(err)
	}
	if err := d.WriteDurably("f", []byte("two")); err != nil {
		t.Fatal(err)
	}
	if raw, err := d.ReadSmall("f"); string(raw) != "two" || err != nil {
		t.Fatalf("rewritten file: %q, %v; want the second write", raw, err)
	}
	if err := d.WriteDurably("big", make([]byte, MaxFile+1)); err != nil {
		t.Fatal(err)
	}
	if raw, err := d.ReadSmall("big"); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("a file over MaxFile: %d bytes, %v; want refused", len(raw), err)
	}
}

func TestRecordRoundTripAndRefusals(t *testing.T) {
	d := memDir(t)
	if p, err := d.LoadRecord("a", "nh-a", false); p != nil || err != nil {
		t.Fatalf("no record: %v, %v; want nil, nil", p, err)
	}
	want := twoPeers()
	if err := d.SaveRecord(want); err != nil {
		t.Fatal(err)
	}
	got, err := d.LoadRecord("a", "nh-a", false)
	if err != nil || got.ClusterID != want.ClusterID || got.Epoch != want.Epoch || len(got.Peers) != 2 {
		t.Fatalf("record read back: %+v, %v", got, err)
	}
	for _, tc := range []struct {
		name, peer, nodeHostID string
		joining                bool
		wantErr                string // "" for no error
	}{
		{"a peer it does not list", "c", "nh-c", false, `does not list peer "c"`},
		{"a joiner it does not list yet", "c", "nh-c", true, ""},
		{"another data dir's identity", "a", "nh-x", false, "delete the whole data dir"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := d.LoadRecord(tc.peer, tc.nodeHostID, tc.joining)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("err %v, want %q", err, tc.wantErr)
			}
		})
	}
	if err := d.WriteDurably(RecordFile, []byte{0xc1}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.LoadRecord("a", "nh-a", false); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("a corrupt record: %v, want refused as corrupt", err)
	}
}

func TestKnownPeers(t *testing.T) {
	var logs bytes.Buffer
	d := memDir(t)
	d.Log = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if got := d.LoadKnownPeers(); got != nil {
		t.Fatalf("no file: %v", got)
	}
	addrs := []string{"10.0.0.1:7946", "10.0.0.2:7946"}
	if err := d.SaveKnownPeers(addrs); err != nil {
		t.Fatal(err)
	}
	if got := d.LoadKnownPeers(); !slices.Equal(got, addrs) {
		t.Fatalf("read back %v, want %v", got, addrs)
	}
	if logs.Len() != 0 {
		t.Fatalf("warned on a good file: %s", logs.String())
	}
	// A file it cannot read is a cache to ignore, never a reason to refuse
	// to start: nothing is returned and a warning says why.
	for name, content := range map[string][]byte{
		"torn":          {0x82, 0xa1, 0x76},                       // a map cut short
		"newer release": {0x82, 0xa1, 'v', 0x09, 0xa1, 'a', 0x90}, // version 9
		"too large":     make([]byte, MaxFile+1),
	} {
		t.Run(name, func(t *testing.T) {
			logs.Reset()
			if err := d.WriteDurably(KnownPeersFile, content); err != nil {
				t.Fatal(err)
			}
			if got := d.LoadKnownPeers(); got != nil {
				t.Fatalf("read %v from an unreadable file", got)
			}
			if !strings.Contains(logs.String(), "ignoring the known peers file") {
				t.Fatalf("no warning; logged %q", logs.String())
			}
		})
	}
}

func TestClusterAddrs(t *testing.T) {
	p := twoPeers()
	alive := func(name, addr string, cluster uint64) mesh.Member {
		return mesh.Member{Name: name, Addr: addr, State: mesh.StateAlive, Meta: mesh.Meta{Cluster: cluster}}
	}
	dead := alive("d", "10.0.0.4:1", 7)
	dead.State = mesh.StateDead
	members := []mesh.Member{
		alive("self", "10.0.0.9:1", 7), // this peer
		alive("b", "10.0.0.2:1", 0),    // listed, not gossiping the id yet
		alive("j", "10.0.0.3:1", 7),    // a joiner of the cluster, not listed yet
		alive("x", "10.0.0.5:1", 8),    // another cluster's
		alive("noaddr", "", 7),         // no address to join through
		dead,                           // not alive
		alive("a", "10.0.0.1:1", 7),    // listed
	}
	want := []string{"10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1"}
	if got := ClusterAddrs("self", p, members); !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

func TestJoinAddrs(t *testing.T) {
	got := JoinAddrs([]string{"s1", "s2"}, []string{"k1", "s2", "k2"})
	if want := []string{"s1", "s2", "k1", "k2"}; !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	// Config.Join is never written through: its spare capacity too.
	join := make([]string, 1, 4)
	join[0] = "s1"
	_ = JoinAddrs(join, []string{"k1"})
	if spare := join[:2]; spare[1] != "" {
		t.Fatalf("Config.Join's array was written: %v", spare)
	}
}
