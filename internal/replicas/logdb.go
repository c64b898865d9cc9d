package replicas

import (
	"fmt"
	"sync"
	"time"
	_ "unsafe" // go:linkname, for dragonboat's default LogDB

	"github.com/lni/dragonboat/v4/config"
	"github.com/lni/dragonboat/v4/raftio"
	pb "github.com/lni/dragonboat/v4/raftpb"

	"github.com/lockmesh/lockmesh/internal/raftauth"
)

// newDefaultLogDB is dragonboat's own constructor of its default LogDB
// (pebble, "sharded-pebble"), which dragonboat keeps in an internal
// package and uses when no LogDBFactory is set. lockmesh wraps it rather
// than forking it; the version of dragonboat is pinned in go.mod, and a
// changed signature fails the build, not a run.
//
//go:linkname newDefaultLogDB github.com/lni/dragonboat/v4/internal/logdb.NewDefaultLogDB
func newDefaultLogDB(cfg config.NodeHostConfig, cb config.LogDBCallback, dirs, lldirs []string) (raftio.ILogDB, error)

// defaultLogDBName is the name dragonboat records in a NodeHost's data
// dir for its default LogDB: the wrapper writes the same format under the
// same name, so data dirs of earlier releases open unchanged.
const defaultLogDBName = "sharded-pebble"

// logDBFactory makes dragonboat's default LogDB wrapped in a commitLog,
// which tells onState (if not nil) of the Raft states it reads and
// onSync of how long each synced write took.
type logDBFactory struct {
	onState func(shard, replica, commit uint64)
	onSync  func(time.Duration) // the time of each synced write
	gate    *raftauth.Filter    // told what each replica's log holds; may be nil
}

func (logDBFactory) Name() string { return defaultLogDBName }

func (f logDBFactory) Create(cfg config.NodeHostConfig, cb config.LogDBCallback, dirs, lldirs []string) (raftio.ILogDB, error) {
	// The LogDB keeps a write context per step worker, named by the
	// worker's number; one more is the commitLog's own.
	workers := cfg.Expert.Engine.ExecShards
	cfg.Expert.Engine.ExecShards++
	db, err := newDefaultLogDB(cfg, cb, dirs, lldirs)
	if err != nil {
		return nil, err
	}
	// dragonboat runs this check itself only on its own, unwrapped type.
	if c, ok := db.(interface{ SelfCheckFailed() (bool, error) }); ok {
		failed, err := c.SelfCheckFailed()
		if err == nil && failed {
			err = fmt.Errorf("the Raft log's storage shard count changed since it was written")
		}
		if err != nil {
			db.Close()
			return nil, err
		}
	}
	l := newCommitLog(db, workers+1)
	l.onState, l.onSync = f.onState, f.onSync
	if f.gate != nil {
		l.logs = f.gate.Logs
	}
	return l, nil
}

// replicaKey names a replica in the LogDB.
type replicaKey struct{ shard, replica uint64 }

// commitLog is a LogDB that does not write, and so does not sync, a Raft
// update that only moves the commit index. Raft needs a replica's log
// entries, term and vote on disk before it answers for them, but not its
// commit index, which a restarted replica learns again from the leader
// (etcd's raft has the same rule, MustSync). dragonboat's default LogDB
// syncs every update it is given, so each committed entry cost every
// replica a second fsync, on the path between the commit and the apply.
//
// Such a state is kept and written with the next update that is synced,
// or before anything that needs the commit index on disk: a snapshot
// record (a replica restarting refuses a stored commit index below its
// snapshot's), a log compaction, Close. A replica that crashes in between
// restarts with an older commit index, which Raft allows: it applies the
// entries again from its snapshot, as after any restart, and catches up.
type commitLog struct {
	raftio.ILogDB
	worker  uint64 // the write context of flush, used by no step worker
	onState func(shard, replica, commit uint64)
	onSync  func(time.Duration) // the time of each synced write
	// logs, when not nil, hears what each replica's log holds: the Raft
	// port's filter bounds commits and acknowledgements by it.
	logs *raftauth.Logs

	mu sync.Mutex
	// saved is the term and vote last written per replica; pending the
	// newest state that was not written, per replica.
	saved   map[replicaKey]pb.State
	pending map[replicaKey]pb.State
}

func newCommitLog(db raftio.ILogDB, worker uint64) *commitLog {
	return &commitLog{ILogDB: db, worker: worker, saved: map[replicaKey]pb.State{}, pending: map[replicaKey]pb.State{}}
}

// mustSync reports whether u holds anything Raft needs on disk before it
// acts: log entries, a snapshot, or a new term or vote.
func (l *commitLog) mustSync(u *pb.Update) bool {
	if len(u.EntriesToSave) > 0 || !pb.IsEmptySnapshot(u.Snapshot) {
		return true
	}
	if pb.IsEmptyState(u.State) {
		return false
	}
	s, ok := l.saved[replicaKey{u.ShardID, u.ReplicaID}]
	return !ok || s.Term != u.State.Term || s.Vote != u.State.Vote
}

// SaveRaftState writes updates unless none of them must be synced; then
// it keeps their states for the next write.
func (l *commitLog) SaveRaftState(updates []pb.Update, worker uint64) error {
	if l.logs != nil {
		l.logs.Saved(updates)
	}
	l.mu.Lock()
	sync := false
	for i := range updates {
		if l.mustSync(&updates[i]) {
			sync = true
			break
		}
	}
	if !sync {
		for i := range updates {
			if u := &updates[i]; !pb.IsEmptyState(u.State) {
				l.pending[replicaKey{u.ShardID, u.ReplicaID}] = u.State
			}
		}
		l.mu.Unlock()
		return nil
	}
	updates = l.withPending(updates)
	l.mu.Unlock()
	if l.onSync == nil {
		return l.ILogDB.SaveRaftState(updates, worker)
	}
	start := time.Now()
	err := l.ILogDB.SaveRaftState(updates, worker)
	l.onSync(time.Since(start))
	return err
}

// withPending returns updates followed by the kept states of replicas
// that have no state of their own in it (an update's own state is newer;
// an update with entries and no state change carries none), and records
// every state in it as written. l.mu is held.
func (l *commitLog) withPending(updates []pb.Update) []pb.Update {
	for i := range updates {
		if u := &updates[i]; !pb.IsEmptyState(u.State) {
			k := replicaKey{u.ShardID, u.ReplicaID}
			delete(l.pending, k)
			l.saved[k] = u.State
		}
	}
	if len(l.pending) == 0 {
		return updates
	}
	all := make([]pb.Update, len(updates), len(updates)+len(l.pending))
	copy(all, updates)
	for k, st := range l.pending {
		all = append(all, pb.Update{ShardID: k.shard, ReplicaID: k.replica, State: st})
		l.saved[k] = st
		delete(l.pending, k)
	}
	return all
}

// flush writes the kept states, if any. It holds l.mu while it writes:
// a replica's states come from the one step worker that runs it, whose
// next SaveRaftState waits for l.mu, so a state flush writes is never
// written after a newer one of the same replica.
func (l *commitLog) flush() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.pending) == 0 {
		return nil
	}
	return l.ILogDB.SaveRaftState(l.withPending(nil), l.worker)
}

// ReadRaftState reads a replica's state as written, after the kept ones.
// dragonboat passes the index of the replica's newest snapshot as
// snapshotIndex and refuses to start (panics) on a stored commit index
// below it. Entries up to a snapshot's index committed before the
// snapshot was taken, so a lower stored commit index is raised to it:
// that can only be a state kept in memory when the process died between
// the apply that a snapshot covered and the write of its state.
func (l *commitLog) ReadRaftState(shard, replica, snapshotIndex uint64) (raftio.RaftState, error) {
	if err := l.flush(); err != nil {
		return raftio.RaftState{}, err
	}
	rs, err := l.ILogDB.ReadRaftState(shard, replica, snapshotIndex)
	if err == nil && !pb.IsEmptyState(rs.State) && rs.State.Commit < snapshotIndex {
		rs.State.Commit = snapshotIndex
	}
	if err == nil && l.onState != nil {
		l.onState(shard, replica, rs.State.Commit)
	}
	if err == nil && l.logs != nil {
		last := snapshotIndex
		if rs.EntryCount > 0 {
			last = rs.FirstIndex + rs.EntryCount - 1
		}
		l.logs.Started(shard, replica, rs.State.Term, rs.State.Commit, last)
	}
	return rs, err
}

func (l *commitLog) SaveSnapshots(updates []pb.Update) error {
	if err := l.flush(); err != nil {
		return err
	}
	return l.ILogDB.SaveSnapshots(updates)
}

func (l *commitLog) ImportSnapshot(ss pb.Snapshot, replicaID uint64) error {
	if err := l.flush(); err != nil {
		return err
	}
	return l.ILogDB.ImportSnapshot(ss, replicaID)
}

func (l *commitLog) RemoveEntriesTo(shard, replica, index uint64) error {
	if err := l.flush(); err != nil {
		return err
	}
	return l.ILogDB.RemoveEntriesTo(shard, replica, index)
}

func (l *commitLog) CompactEntriesTo(shard, replica, index uint64) (<-chan struct{}, error) {
	if err := l.flush(); err != nil {
		return nil, err
	}
	return l.ILogDB.CompactEntriesTo(shard, replica, index)
}

// RemoveNodeData forgets what was kept for the replica, whose data goes.
func (l *commitLog) RemoveNodeData(shard, replica uint64) error {
	l.mu.Lock()
	k := replicaKey{shard, replica}
	delete(l.pending, k)
	delete(l.saved, k)
	l.mu.Unlock()
	if l.logs != nil {
		l.logs.Removed(shard, replica)
	}
	return l.ILogDB.RemoveNodeData(shard, replica)
}

func (l *commitLog) Close() error {
	err := l.flush()
	if cerr := l.ILogDB.Close(); err == nil {
		err = cerr
	}
	return err
}
