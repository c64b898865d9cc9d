package node

import (
	"fmt"
	"io/fs"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lni/vfs"
)

// diskStall makes a disk's fsyncs (of files and of directories) block
// while a stall is on, as on a disk that stopped answering; with writes,
// writes and metadata changes block too. It is a vfs.Injector: the disk is
// vfs.Wrap(disk, stall), an *vfs.ErrorFS, the only kind of wrapped file
// system dragonboat accepts (it panics on any other FS type but its own
// MemFS and the OS's). dragonboat's LogDB (pebble), its snapshots and
// lockmesh's own record all go through it, so a stall stops the peer's Raft
// log from becoming durable, and with it every Raft group of the peer's
// NodeHost (one LogDB shard), while every other goroutine of the peer
// (lease expiry, keepalives, RPC, gossip) keeps running: the in-process
// counterpart of a leader whose disk, or whose whole process, stalls.
//
// dragonboat runs in "error injection mode" on an ErrorFS: a step worker
// that panics with an error stops quietly instead of crashing the process.
// diskStall never returns an error, so only a genuine internal failure
// would take that path, and it would show as a liveness violation.
type diskStall struct {
	mu     sync.Mutex
	stall  chan struct{} // closed on Release; nil while not stalled
	writes bool          // writes block too while stalled
	// blocked counts the calls that had to wait for a stall, since the
	// disk was created: a nemesis checks the stall hit something.
	blocked atomic.Int64
}

var _ vfs.Injector = (*diskStall)(nil)

// Stall makes every later fsync (and with writes, every write) block until
// Release.
func (s *diskStall) Stall(writes bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stall == nil {
		s.stall = make(chan struct{})
	}
	s.writes = writes
}

// Release ends a stall: blocked calls go on. Releasing a disk that is not
// stalled does nothing.
func (s *diskStall) Release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stall != nil {
		close(s.stall)
		s.stall = nil
	}
}

// MaybeError blocks an fsync, or a write when writes stall too, while a
// stall is on. It never fails the call.
func (s *diskStall) MaybeError(op vfs.Op) error {
	s.mu.Lock()
	ch := s.stall
	if op == vfs.OpRead || (op == vfs.OpWrite && !s.writes) {
		ch = nil
	}
	s.mu.Unlock()
	if ch != nil {
		s.blocked.Add(1)
		<-ch
	}
	return nil
}

// newPeerDisk is a fault peer's disk: a strict in-memory file system, where
// only what was synced survives ResetToSyncedState (a crash), holding
// dataDir and its parents as synced directories (the operator created the
// data dir before the process ever ran; everything in it is the node's to
// sync).
func newPeerDisk(t testing.TB, dataDir string) *vfs.MemFS {
	t.Helper()
	mem := vfs.NewStrictMem()
	if err := mem.MkdirAll(dataDir, 0o755); err != nil {
		t.Fatalf("create %s: %v", dataDir, err)
	}
	for dir := dataDir; ; dir = mem.PathDir(dir) {
		if err := syncDir(mem, dir); err != nil {
			t.Fatalf("sync %s: %v", dir, err)
		}
		if dir == mem.PathDir(dir) {
			break
		}
	}
	return mem
}

func syncDir(fs vfs.FS, dir string) error {
	d, err := fs.OpenDir(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// diskFiles lists the files under dir with their sizes.
func diskFiles(fs vfs.FS, dir string, out map[string]int64) map[string]int64 {
	if out == nil {
		out = map[string]int64{}
	}
	names, _ := fs.List(dir)
	for _, name := range names {
		path := fs.PathJoin(dir, name)
		fi, err := fs.Stat(path)
		switch {
		case err != nil:
		case fi.IsDir():
			diskFiles(fs, path, out)
		default:
			out[path] = fi.Size()
		}
	}
	return out
}

// diskLoss is what a crash took from a disk.
type diskLoss struct {
	files []string // files that vanished or shrank, with the bytes lost
	bytes int64
}

func (l diskLoss) String() string {
	if len(l.files) == 0 {
		return "nothing"
	}
	return fmt.Sprintf("%d bytes (%s)", l.bytes, strings.Join(l.files, ", "))
}

// crashDisk is what a power cut does to mem: from now on nothing more
// becomes durable (syncs are ignored) while stop shuts the process down,
// then everything not synced before is thrown away: file contents past
// their last fsync, and directory entries (created, renamed or removed
// files) past their directory's last fsync.
func crashDisk(mem *vfs.MemFS, stop func()) diskLoss {
	mem.SetIgnoreSyncs(true)
	stop()
	before := diskFiles(mem, "/", nil)
	mem.ResetToSyncedState()
	mem.SetIgnoreSyncs(false)
	after := diskFiles(mem, "/", nil)
	var loss diskLoss
	paths := make([]string, 0, len(before))
	for path := range before {
		paths = append(paths, path)
	}
	sort.Strings(paths)
	for _, path := range paths {
		size, ok := after[path]
		switch {
		case !ok:
			loss.files = append(loss.files, fmt.Sprintf("%s gone, %d bytes", path, before[path]))
			loss.bytes += before[path]
		case size < before[path]:
			loss.files = append(loss.files, fmt.Sprintf("%s lost %d of %d bytes", path, before[path]-size, before[path]))
			loss.bytes += before[path] - size
		}
	}
	return loss
}

func TestDiskStall(t *testing.T) {
	mem := newPeerDisk(t, "/data/p")
	stall := &diskStall{}
	s := vfs.Wrap(mem, stall)
	f, err := s.Create("/data/p/f")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write([]byte("synced")); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := syncDir(s, "/data/p"); err != nil {
		t.Fatal(err)
	}

	// A stalled Sync returns only after Release; a write does not wait
	// unless asked to.
	stall.Stall(false)
	if _, err := f.Write([]byte(" unsynced")); err != nil {
		t.Fatal(err)
	}
	synced := make(chan error, 1)
	go func() { synced <- f.Sync() }()
	deadline := time.Now().Add(10 * time.Second)
	for stall.blocked.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("Sync never reached the stall")
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case err := <-synced:
		t.Fatalf("Sync returned %v during a stall", err)
	default:
	}

	// A crash during the stall loses what the stalled Sync did not make
	// durable, and files never synced into their directory.
	if _, err := s.Create("/data/p/new"); err != nil {
		t.Fatal(err)
	}
	loss := crashDisk(mem, func() {})
	if len(loss.files) != 2 || loss.bytes != int64(len(" unsynced")) {
		t.Fatalf("crash lost %v, want /data/p/f's last %d bytes and the empty /data/p/new", loss, len(" unsynced"))
	}
	stall.Release()
	if err := <-synced; err != nil {
		t.Fatal(err)
	}
	if _, err := mem.Stat("/data/p/new"); !errorsIs(err, fs.ErrNotExist) {
		t.Fatalf("a file never synced into its directory survived the crash: %v", err)
	}
	g, err := s.Open("/data/p/f")
	if err != nil {
		t.Fatalf("the synced file did not survive the crash: %v", err)
	}
	defer g.Close()
	buf := make([]byte, 64)
	n, _ := g.Read(buf)
	if got := string(buf[:n]); got != "synced" {
		t.Fatalf("after the crash the file holds %q, want %q", got, "synced")
	}

	// Writes stall too when asked. (A handle from before the crash would
	// write past the end of what is left: the crashed process's handles
	// are gone.)
	w, err := s.Create("/data/p/w")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	stall.Stall(true)
	wrote := make(chan struct{})
	before := stall.blocked.Load()
	go func() {
		_, _ = w.Write([]byte("x"))
		close(wrote)
	}()
	for stall.blocked.Load() == before {
		if time.Now().After(deadline) {
			t.Fatal("Write never reached the stall")
		}
		time.Sleep(time.Millisecond)
	}
	stall.Release()
	<-wrote
}
