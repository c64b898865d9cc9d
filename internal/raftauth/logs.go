package raftauth

import (
	"sync"

	pb "github.com/lni/dragonboat/v4/raftpb"
)

// Logs keeps, per local replica, what its Raft log is known to hold: the
// commit index and the last entry of each update dragonboat hands the
// LogDB (Saved), and the end of each Replicate it sends (Sent) or is
// sent (through Filter). Rules 6 and 7 read bounds from it. It is safe
// for concurrent use; the zero value is ready.
//
// The bounds lag the replica's memory by at most one step, and in the
// safe direction: a replica's log only grows between saves, except when
// a Replicate truncates its unsaved tail, and the end of every Replicate
// that passes the filter is kept (pend) until a save has covered it or
// the commit index has passed it.
type Logs struct {
	mu sync.Mutex
	m  map[replicaKey]*logState
}

type replicaKey struct{ shard, replica uint64 }

type logState struct {
	term   uint64 // the replica's term at its last save
	commit uint64 // the replica's commit index at its last save
	last   uint64 // the last index its log holds, at its last save
	pend   uint64 // the lowest end of a Replicate passed since, 0 for none
	sent   uint64 // the highest end of a Replicate it sent
}

func (l *Logs) state(shard, replica uint64) *logState {
	if l.m == nil {
		l.m = map[replicaKey]*logState{}
	}
	k := replicaKey{shard, replica}
	s := l.m[k]
	if s == nil {
		s = &logState{}
		l.m[k] = s
	}
	return s
}

// Started records the state a replica starts from: its term, its commit
// index and the last index of its log (its snapshot's when the log is
// empty).
func (l *Logs) Started(shard, replica, term, commit, last uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	*l.state(shard, replica) = logState{term: term, commit: commit, last: max(last, commit)}
}

// Saved records what updates hand the LogDB: each replica's commit index,
// the last of its new entries, and a snapshot's index.
func (l *Logs) Saved(updates []pb.Update) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range updates {
		u := &updates[i]
		s := l.state(u.ShardID, u.ReplicaID)
		if n := len(u.EntriesToSave); n > 0 {
			s.last = u.EntriesToSave[n-1].Index
			if s.pend != 0 && s.last >= s.pend {
				s.pend = 0
			}
		}
		if !pb.IsEmptySnapshot(u.Snapshot) {
			s.commit = max(s.commit, u.Snapshot.Index)
			s.last = max(s.last, u.Snapshot.Index)
		}
		if !pb.IsEmptyState(u.State) {
			s.term = max(s.term, u.State.Term)
			s.commit = max(s.commit, u.State.Commit)
		}
		s.last = max(s.last, s.commit)
		if s.pend != 0 && s.commit >= s.pend {
			s.pend = 0
		}
	}
}

// Removed forgets a replica whose data is gone.
func (l *Logs) Removed(shard, replica uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.m, replicaKey{shard, replica})
}

// Sent records the Replicate messages of an outbound batch.
func (l *Logs) Sent(b *pb.MessageBatch) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range b.Requests {
		if m := &b.Requests[i]; m.Type == pb.Replicate {
			s := l.state(m.ShardID, m.From)
			s.sent = max(s.sent, end(m))
		}
	}
}

// passed records a Replicate the filter lets through to replica to: once
// applied, its log may end at the Replicate's end.
func (l *Logs) passed(shard, to uint64, m *pb.Message) {
	if len(m.Entries) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.state(shard, to)
	if e := end(m); s.pend == 0 || e < s.pend {
		s.pend = e
	}
}

// TermBound is the highest term a message to replica of shard may carry
// (rule 3): MaxTermJump above the term it last wrote, or MaxTerm when it
// has written none.
func (l *Logs) TermBound(shard, replica uint64) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.state(shard, replica)
	if s.term == 0 || s.term > MaxTerm-MaxTermJump {
		return MaxTerm
	}
	return s.term + MaxTermJump
}

// CommitBound is the highest commit index a Heartbeat may give replica of
// shard: an index its log is known to hold.
func (l *Logs) CommitBound(shard, replica uint64) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.state(shard, replica)
	last := s.last
	if s.pend != 0 {
		last = min(last, s.pend)
	}
	return max(s.commit, last)
}

// AckBound is the highest index a ReplicateResp may acknowledge to
// replica of shard: one its log holds, or it sent.
func (l *Logs) AckBound(shard, replica uint64) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.state(shard, replica)
	return max(s.last, s.sent)
}

func end(m *pb.Message) uint64 { return m.LogIndex + uint64(len(m.Entries)) }
