package replicas

import (
	"fmt"
	"strings"
	"testing"

	"github.com/lni/dragonboat/v4/raftio"
	pb "github.com/lni/dragonboat/v4/raftpb"
)

// recordingLogDB records what reaches dragonboat's LogDB, in order.
type recordingLogDB struct {
	raftio.ILogDB // nil: only the methods below are called
	log           []string
	stored        pb.State // what ReadRaftState answers
}

func (r *recordingLogDB) SaveRaftState(updates []pb.Update, worker uint64) error {
	var parts []string
	for _, u := range updates {
		s := fmt.Sprintf("%d/%d t%d v%d c%d", u.ShardID, u.ReplicaID, u.Term, u.Vote, u.Commit)
		if len(u.EntriesToSave) > 0 {
			s += fmt.Sprintf(" +%d", len(u.EntriesToSave))
		}
		parts = append(parts, s)
	}
	r.log = append(r.log, fmt.Sprintf("save[w%d] %s", worker, strings.Join(parts, ", ")))
	return nil
}

func (r *recordingLogDB) SaveSnapshots(updates []pb.Update) error {
	r.log = append(r.log, fmt.Sprintf("snapshot %d/%d @%d", updates[0].ShardID, updates[0].ReplicaID, updates[0].Snapshot.Index))
	return nil
}

func (r *recordingLogDB) RemoveNodeData(shard, replica uint64) error {
	r.log = append(r.log, fmt.Sprintf("remove %d/%d", shard, replica))
	return nil
}

func (r *recordingLogDB) ReadRaftState(shard, replica, snapshotIndex uint64) (raftio.RaftState, error) {
	r.log = append(r.log, fmt.Sprintf("read %d/%d", shard, replica))
	return raftio.RaftState{State: r.stored, FirstIndex: snapshotIndex + 1}, nil
}

func (r *recordingLogDB) Close() error {
	r.log = append(r.log, "close")
	return nil
}

func state(shard, term, vote, commit uint64) pb.Update {
	return pb.Update{ShardID: shard, ReplicaID: 1, State: pb.State{Term: term, Vote: vote, Commit: commit}}
}

func withEntries(u pb.Update, n int) pb.Update {
	u.EntriesToSave = make([]pb.Entry, n)
	return u
}

func TestCommitLogDefersOnlyCommitIndexMoves(t *testing.T) {
	type step struct {
		name string
		do   func(l *commitLog) error
		want []string // what reached the LogDB in this step
	}
	save := func(us ...pb.Update) func(l *commitLog) error {
		return func(l *commitLog) error { return l.SaveRaftState(us, 1) }
	}
	steps := []step{
		{"a replica's first state is written", save(state(1, 2, 3, 5)),
			[]string{"save[w1] 1/1 t2 v3 c5"}},
		{"a commit index move alone is kept", save(state(1, 2, 3, 6)), nil},
		{"and so is the next; an empty update is nothing", save(state(1, 2, 3, 7), pb.Update{ShardID: 2, ReplicaID: 1}), nil},
		{"entries are written, with the kept state of another replica", save(withEntries(state(2, 1, 1, 4), 1)),
			[]string{"save[w1] 2/1 t1 v1 c4 +1, 1/1 t2 v3 c7"}},
		{"a new term is written at once", save(state(1, 3, 0, 7)),
			[]string{"save[w1] 1/1 t3 v0 c7"}},
		{"a new vote is written at once", save(state(1, 3, 2, 7)),
			[]string{"save[w1] 1/1 t3 v2 c7"}},
		{"a commit move of replica 1 is kept", save(state(1, 3, 2, 9)), nil},
		{"a replica's own newer state replaces its kept one", save(withEntries(state(1, 3, 2, 10), 2)),
			[]string{"save[w1] 1/1 t3 v2 c10 +2"}},
		{"kept again", save(state(1, 3, 2, 11)), nil},
		{"entries without a state of their own carry the kept state", save(withEntries(pb.Update{ShardID: 1, ReplicaID: 1}, 1)),
			[]string{"save[w1] 1/1 t0 v0 c0 +1, 1/1 t3 v2 c11"}},
		{"kept once more", save(state(1, 3, 2, 11)), nil},
		{"a snapshot record waits for the kept states, on the log's own worker", func(l *commitLog) error {
			return l.SaveSnapshots([]pb.Update{{ShardID: 1, ReplicaID: 1, Snapshot: pb.Snapshot{Index: 11}}})
		}, []string{"save[w9] 1/1 t3 v2 c11", "snapshot 1/1 @11"}},
		{"nothing kept, nothing written", func(l *commitLog) error {
			return l.SaveSnapshots([]pb.Update{{ShardID: 2, ReplicaID: 1, Snapshot: pb.Snapshot{Index: 4}}})
		}, []string{"snapshot 2/1 @4"}},
		{"kept for replica 2", save(state(2, 1, 1, 5)), nil},
		{"a removed replica's kept state goes with it", func(l *commitLog) error { return l.RemoveNodeData(2, 1) },
			[]string{"remove 2/1"}},
		{"its next state is a first one again", save(state(2, 4, 4, 0)),
			[]string{"save[w1] 2/1 t4 v4 c0"}},
		{"kept before close", save(state(2, 4, 4, 1)), nil},
		{"close writes what was kept", func(l *commitLog) error { return l.Close() },
			[]string{"save[w9] 2/1 t4 v4 c1", "close"}},
	}
	rec := &recordingLogDB{}
	l := newCommitLog(rec, 9)
	for _, s := range steps {
		before := len(rec.log)
		if err := s.do(l); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		got := rec.log[before:]
		if strings.Join(got, "\n") != strings.Join(s.want, "\n") {
			t.Fatalf("%s: the LogDB got\n  %s\nwant\n  %s", s.name, strings.Join(got, "\n  "), strings.Join(s.want, "\n  "))
		}
	}
}

// A stored commit index below the replica's snapshot, which dragonboat
// would refuse to start with, is read as the snapshot's index.
func TestCommitLogReadsCommitAtLeastTheSnapshot(t *testing.T) {
	rec := &recordingLogDB{stored: pb.State{Term: 3, Vote: 2, Commit: 40}}
	l := newCommitLog(rec, 9)
	if err := l.SaveRaftState([]pb.Update{state(1, 3, 2, 40)}, 1); err != nil {
		t.Fatal(err)
	}
	if err := l.SaveRaftState([]pb.Update{state(1, 3, 2, 45)}, 1); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ snapshot, want uint64 }{{0, 40}, {40, 40}, {44, 44}} {
		rs, err := l.ReadRaftState(1, 1, tc.snapshot)
		if err != nil {
			t.Fatal(err)
		}
		if rs.State.Commit != tc.want || rs.State.Term != 3 || rs.State.Vote != 2 {
			t.Errorf("snapshot at %d: read %+v, want commit %d, term 3, vote 2", tc.snapshot, rs.State, tc.want)
		}
	}
	// The kept state was written before the first read.
	if want := "save[w9] 1/1 t3 v2 c45"; len(rec.log) < 3 || rec.log[1] != want || rec.log[2] != "read 1/1" {
		t.Errorf("LogDB got %q, want the kept state %q written before the read", rec.log, want)
	}
}

// The factory names its LogDB as dragonboat names its default one, whose
// format it writes, so that data dirs of earlier releases open.
func TestLogDBFactoryKeepsDragonboatsName(t *testing.T) {
	if got := (logDBFactory{}).Name(); got != "sharded-pebble" {
		t.Fatalf("LogDB name %q, want dragonboat's default sharded-pebble", got)
	}
	c, err := NodeHostConfig(Config{Dir: t.TempDir(), RaftAddr: "127.0.0.1:1", RTT: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := c.Expert.LogDBFactory.(logDBFactory); !ok {
		t.Fatalf("LogDBFactory %T, want the commitLog's", c.Expert.LogDBFactory)
	}
}
