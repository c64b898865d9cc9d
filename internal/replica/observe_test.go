package replica

import (
	"bytes"
	"testing"
	"time"

	sm "github.com/lni/dragonboat/v4/statemachine"

	"github.com/lockmesh/lockmesh/lockfsm"
)

// clockedLock is a lock replica on a clock the test moves, and a way to
// apply one command per entry.
type clockedLock struct {
	t     *testing.T
	s     *Lock
	now   time.Time
	index uint64
}

func newClockedLock(t *testing.T, replayedTo uint64) *clockedLock {
	c := &clockedLock{t: t, now: time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)}
	c.s = NewLock(LockConfig{Shard: 1, Now: func() time.Time { return c.now }, ReplayedTo: func() uint64 { return replayedTo }})
	return c
}

func (c *clockedLock) apply(cmd lockfsm.Command) lockfsm.Result {
	c.t.Helper()
	c.index++
	data, err := lockfsm.EncodeCommands([]lockfsm.Command{cmd})
	if err != nil {
		c.t.Fatal(err)
	}
	r, err := c.s.Update(sm.Entry{Index: c.index, Cmd: data})
	if err != nil {
		c.t.Fatal(err)
	}
	res, err := lockfsm.DecodeResults(r.Data)
	if err != nil || len(res) != 1 {
		c.t.Fatalf("results %v %v", res, err)
	}
	return res[0]
}

func (c *clockedLock) lookup(q Query) Answer {
	c.t.Helper()
	v, err := c.s.Lookup(q)
	if err != nil {
		c.t.Fatal(err)
	}
	return v.(Answer)
}

// TestLockDatesHoldsAndWaits runs a key through a hold, two waiters and a
// hand-off on a test clock, and checks what QueryKey with Ages and
// QueryTop answer: each hold and wait dated by when it was applied, and
// the key counted in the summary with its waiter's wait.
func TestLockDatesHoldsAndWaits(t *testing.T) {
	c := newClockedLock(t, 0)
	for _, owner := range []string{"a", "b", "c"} {
		c.apply(lockfsm.Command{Op: lockfsm.OpOpenSession, Owner: owner, TTLMillis: 10000})
	}
	if r := c.apply(lockfsm.Command{Op: lockfsm.OpAcquire, Session: 1, Req: 1, Key: "k", Wait: true}); r.Status != lockfsm.StatusGranted {
		t.Fatalf("acquire: %v", r)
	}
	c.now = c.now.Add(time.Second)
	c.apply(lockfsm.Command{Op: lockfsm.OpAcquire, Session: 2, Req: 1, Key: "k", Wait: true})
	c.now = c.now.Add(time.Second)
	c.apply(lockfsm.Command{Op: lockfsm.OpAcquire, Session: 3, Req: 1, Key: "k", Wait: true})
	c.now = c.now.Add(time.Second)

	a := c.lookup(Query{Kind: QueryKey, Key: "k", Ages: true})
	wantH := []Age{{Micros: 3000000, Known: true}}
	wantW := []Age{{Micros: 2000000, Known: true}, {Micros: 1000000, Known: true}}
	if !equalAges(a.HolderAges, wantH) || !equalAges(a.WaiterAges, wantW) {
		t.Fatalf("ages: holders %+v waiters %+v; want %+v %+v", a.HolderAges, a.WaiterAges, wantH, wantW)
	}
	if a := c.lookup(Query{Kind: QueryKey, Key: "k"}); a.HolderAges != nil || a.WaiterAges != nil {
		t.Fatalf("ages answered unasked (an older peer could not read them): %+v", a)
	}

	c.apply(lockfsm.Command{Op: lockfsm.OpRelease, Session: 1, Req: 2, Target: 1}) // hands k to session 2
	c.now = c.now.Add(500 * time.Millisecond)
	top := c.lookup(Query{Kind: QueryTop, K: 5}).Top
	if top == nil || len(top.Keys) != 1 || len(top.Holds) != 1 {
		t.Fatalf("top: %+v", top)
	}
	want := TopKey{Key: "k", Waiters: 1, OldestWait: Age{Micros: 1500000, Known: true}, Handoffs: 1, WaitMicros: 2000000}
	if top.Keys[0] != want {
		t.Fatalf("top key %+v, want %+v", top.Keys[0], want)
	}
	if h := top.Holds[0]; h.Key != "k" || h.Holder.Session != 2 || h.Age != (Age{Micros: 500000, Known: true}) {
		t.Fatalf("top hold %+v", h)
	}
}

// Entries a restarted replica replays, up to the commit index its Raft
// state recorded, and state loaded from a snapshot are dated "at least".
func TestLockDatesReplayedAndLoadedStateAtLeast(t *testing.T) {
	c := newClockedLock(t, 2)
	c.apply(lockfsm.Command{Op: lockfsm.OpOpenSession, Owner: "a", TTLMillis: 10000})
	c.apply(lockfsm.Command{Op: lockfsm.OpAcquire, Session: 1, Req: 1, Key: "old"}) // index 2: replayed
	c.now = c.now.Add(time.Second)
	c.apply(lockfsm.Command{Op: lockfsm.OpAcquire, Session: 1, Req: 2, Key: "new"}) // index 3: live
	c.now = c.now.Add(time.Second)
	if a := c.lookup(Query{Kind: QueryKey, Key: "old", Ages: true}); !equalAges(a.HolderAges, []Age{{Micros: 2000000, AtLeast: true, Known: true}}) {
		t.Fatalf("replayed hold: %+v", a.HolderAges)
	}
	if a := c.lookup(Query{Kind: QueryKey, Key: "new", Ages: true}); !equalAges(a.HolderAges, []Age{{Micros: 1000000, Known: true}}) {
		t.Fatalf("live hold: %+v", a.HolderAges)
	}

	snap := lockSnapshotOf(t, c.s)
	d := newClockedLock(t, 0)
	d.now = c.now.Add(time.Minute)
	if err := d.s.RecoverFromSnapshot(snap, nil, nil); err != nil {
		t.Fatal(err)
	}
	d.now = d.now.Add(time.Second)
	if a := d.lookup(Query{Kind: QueryKey, Key: "new", Ages: true}); !equalAges(a.HolderAges, []Age{{Micros: 1000000, AtLeast: true, Known: true}}) {
		t.Fatalf("hold loaded from a snapshot: %+v", a.HolderAges)
	}
}

func equalAges(a, b []Age) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func lockSnapshotOf(t *testing.T, s *Lock) *bytes.Reader {
	t.Helper()
	var buf bytes.Buffer
	if err := s.SaveSnapshot(&buf, nil, nil); err != nil {
		t.Fatal(err)
	}
	return bytes.NewReader(buf.Bytes())
}
