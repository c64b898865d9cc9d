package raftauth

import (
	"testing"

	pb "github.com/lni/dragonboat/v4/raftpb"
)

func entries(from, to, term uint64) []pb.Entry {
	var es []pb.Entry
	for i := from; i <= to; i++ {
		es = append(es, pb.Entry{Index: i, Term: term})
	}
	return es
}

func saved(shard, replica, commit uint64, ents []pb.Entry) pb.Update {
	return pb.Update{ShardID: shard, ReplicaID: replica, State: pb.State{Term: 5, Commit: commit}, EntriesToSave: ents}
}

// heartbeat passes a Heartbeat claiming commit through f and returns the
// commit dragonboat would see.
func heartbeat(t *testing.T, f *Filter, commit uint64) uint64 {
	t.Helper()
	m := msg(pb.Heartbeat)
	m.Commit = commit
	if err := f.Message(anonymous, &m); err != nil {
		t.Fatal(err)
	}
	return m.Commit
}

// Rule 6: a heartbeat never commits beyond what the log holds.
func TestHeartbeatCommitBound(t *testing.T) {
	f := newFilter()
	// A new replica holds nothing: a forged commit of 2^62 becomes 0.
	if got := heartbeat(t, f, MaxIndex); got != 0 {
		t.Fatalf("new replica: commit %d passed, want 0", got)
	}
	// Restarted with entries to 40, committed to 30.
	f.Logs.Started(2, 1, 5, 30, 40)
	if got := heartbeat(t, f, 35); got != 35 {
		t.Fatalf("commit 35 within the log became %d", got)
	}
	if got := heartbeat(t, f, 1000); got != 40 {
		t.Fatalf("commit 1000 became %d, want the log's end 40", got)
	}
	// Entries to 50 saved: the bound follows.
	f.Logs.Saved([]pb.Update{saved(2, 1, 40, entries(41, 50, 5))})
	if got := heartbeat(t, f, 1000); got != 50 {
		t.Fatalf("after a save to 50, commit became %d", got)
	}
	// A Replicate that may truncate the unsaved tail to 45 passes: until
	// a save covers 45, nothing beyond it is committed by a heartbeat.
	r := msg(pb.Replicate)
	r.LogIndex, r.LogTerm, r.Term = 43, 5, 6
	r.Entries = entries(44, 45, 6)
	if err := f.Message(anonymous, &r); err != nil {
		t.Fatal(err)
	}
	if got := heartbeat(t, f, 1000); got != 45 {
		t.Fatalf("after a Replicate ending at 45, commit became %d, want 45", got)
	}
	f.Logs.Saved([]pb.Update{saved(2, 1, 44, entries(44, 45, 6))})
	if got := heartbeat(t, f, 1000); got != 45 {
		t.Fatalf("after the truncating save, commit became %d, want 45", got)
	}
	f.Logs.Saved([]pb.Update{saved(2, 1, 45, entries(46, 60, 6))})
	if got := heartbeat(t, f, 1000); got != 60 {
		t.Fatalf("after a save to 60, commit became %d, want 60", got)
	}
	// A snapshot moves the log to its index.
	f.Logs.Saved([]pb.Update{{ShardID: 2, ReplicaID: 1, Snapshot: pb.Snapshot{Index: 90, Term: 6}}})
	if got := heartbeat(t, f, 1000); got != 90 {
		t.Fatalf("after a snapshot at 90, commit became %d, want 90", got)
	}
	// Another replica's saves do not count for this one.
	f.Logs.Saved([]pb.Update{saved(2, 5, 500, entries(91, 500, 6))})
	if got := heartbeat(t, f, 1000); got != 90 {
		t.Fatalf("another replica's save moved this one's bound to %d", got)
	}
	f.Logs.Removed(2, 1)
	if got := heartbeat(t, f, 1000); got != 0 {
		t.Fatalf("a removed replica's bound is %d, want 0", got)
	}
}

// Rule 6's bound is cleared once the commit index passes a Replicate's
// end, so a stale bound cannot hold commits back for good.
func TestHeartbeatBoundClearsAtCommit(t *testing.T) {
	f := newFilter()
	f.Logs.Started(2, 1, 5, 10, 20)
	r := msg(pb.Replicate)
	r.LogIndex, r.LogTerm = 11, 5
	r.Entries = entries(12, 13, 5) // already held: nothing to save
	if err := f.Message(anonymous, &r); err != nil {
		t.Fatal(err)
	}
	if got := heartbeat(t, f, 20); got != 13 {
		t.Fatalf("commit became %d, want 13", got)
	}
	f.Logs.Saved([]pb.Update{{ShardID: 2, ReplicaID: 1, State: pb.State{Term: 5, Commit: 13}}})
	if got := heartbeat(t, f, 20); got != 20 {
		t.Fatalf("once committed to 13, commit became %d, want 20", got)
	}
}

// Rule 7: an acknowledgement beyond what the replica wrote or sent is
// refused; one within passes, and so does any rejection.
func TestReplicateRespBound(t *testing.T) {
	f := newFilter()
	f.Logs.Started(2, 1, 5, 30, 40)
	ack := func(index uint64, reject bool) error {
		m := msg(pb.ReplicateResp)
		m.LogIndex, m.Reject = index, reject
		return f.Message(anonymous, &m)
	}
	if err := ack(40, false); err != nil {
		t.Fatalf("ack of 40: %v", err)
	}
	if err := ack(41, false); err == nil {
		t.Fatal("ack of 41 beyond the log passed")
	}
	if err := ack(1<<40, true); err != nil {
		t.Fatalf("a rejection: %v", err)
	}
	// The leader sends entries to 45 before it writes them.
	f.Logs.Sent(&pb.MessageBatch{Requests: []pb.Message{{Type: pb.Replicate, ShardID: 2, From: 1, To: 2, LogIndex: 40, Entries: entries(41, 45, 5)}}})
	if err := ack(45, false); err != nil {
		t.Fatalf("ack of sent 45: %v", err)
	}
	if err := ack(46, false); err == nil {
		t.Fatal("ack of 46 passed")
	}
}
