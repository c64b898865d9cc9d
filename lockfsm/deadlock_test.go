package lockfsm

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func waitDL(c Command) Command {
	c.Wait = true
	c.Flags |= FlagDeadlock
	return c
}

var deadlocked = Result{Status: StatusDeadlock, Err: "*"}

func TestDeadlockTable(t *testing.T) {
	limit2 := func(sess, req uint64, key string) Command {
		return Command{Op: OpAcquire, Session: sess, Req: req, Key: key, Wait: true, Limit: 2}
	}
	runTable(t, []tcase{
		// Issue 31, case 1: an edge to holders alone misses it.
		{name: "a wait queued behind a group that waits for the waiter's key", steps: []step{
			one(acq(A, 1, "x", true), granted(1), g("x", A, 1, 1)),
			{cmds: group(waitDL(acq(B, 1, "x", true)), waitDL(acq(B, 2, "y", true))), want: []Result{queued, queued}},
			one(waitDL(acq(A, 2, "y", true)), deadlocked),
			// A, refused, waits for nothing: its release hands B the group.
			one(rel(A, 1), okTok(1), handed("x", B, 1, 2), handed("y", B, 2, 3)),
		}},
		{name: "a group that would wait behind its own session's holder", steps: []step{
			one(acq(A, 1, "x", true), granted(1), g("x", A, 1, 1)),
			one(acq(B, 1, "y", true), granted(2), g("y", B, 1, 2)),
			one(waitDL(acq(B, 2, "x", true)), queued),
			{cmds: group(waitDL(acq(A, 2, "y", true)), waitDL(acq(A, 3, "z", true))), want: []Result{deadlocked, deadlocked}},
		}},
		{name: "semaphore: a wait for permits the session holds itself", steps: []step{
			one(permits(A, 1, "s", 3, 2, true), granted(1), g("s", A, 1, 1)),
			one(waitDL(permits(A, 2, "s", 3, 2, true)), deadlocked),
			// Another session's permits come back: that wait is no deadlock.
			one(permits(B, 1, "s", 3, 1, true), granted(2), g("s", B, 1, 2)),
			one(waitDL(permits(C, 1, "s", 3, 1, true)), queued),
		}},
		{name: "semaphore: a cycle through every holder of a semaphore", steps: []step{
			one(permits(A, 1, "s", 2, 1, true), granted(1), g("s", A, 1, 1)),
			one(permits(B, 1, "s", 2, 1, true), granted(2), g("s", B, 1, 2)),
			one(acq(C, 1, "x", true), granted(3), g("x", C, 1, 3)),
			one(waitDL(acq(A, 2, "x", true)), queued),
			one(waitDL(acq(B, 2, "x", true)), queued),
			one(waitDL(permits(C, 2, "s", 2, 1, true)), deadlocked),
		}},
		{name: "read/write: a reader is not held back by a reader ahead of it", steps: []step{
			one(wlock(A, 1, "x", true), granted(1), g("x", A, 1, 1)),
			one(acq(B, 1, "y", true), granted(2), g("y", B, 1, 2)),
			one(waitDL(rlock(B, 2, "x", true)), queued),
			// C's read would share with B's once A releases; A waits for
			// nothing of C's.
			one(acq(C, 1, "z", true), granted(3), g("z", C, 1, 3)),
			one(waitDL(rlock(C, 2, "x", true)), queued),
			one(waitDL(acq(A, 2, "z", true)), deadlocked),
		}},
		// Issue 31, case 6: a mutex of limit 2 whose blocked group head
		// leaves with its session hands on to the waiter behind it.
		{name: "session end: a mutex of limit 2 hands on when a group head leaves", steps: []step{
			one(limit2(A, 1, "m"), granted(1), g("m", A, 1, 1)),
			one(acq(C, 1, "y", true), granted(2), g("y", C, 1, 2)),
			{cmds: group(limit2(B, 1, "m"), acq(B, 2, "y", true)), want: []Result{queued, queued}},
			one(limit2(C, 2, "m"), queued),
			one(closeS(B), ok, handed("m", C, 2, 3)),
		}},
	})
}

// A refusal names sessions by their Session's ID (the label), and a wait
// for the session's own hold says so.
func TestDeadlockNamesSessionIDs(t *testing.T) {
	c := newChecker()
	c.apply(Command{Op: OpOpenSession, Owner: "na", TTLMillis: 5000, Label: 71})
	c.apply(Command{Op: OpOpenSession, Owner: "nb", TTLMillis: 5000, Label: 72})
	c.apply(acq(A, 1, "x", true))
	c.apply(acq(B, 1, "y", true))
	c.apply(waitDL(acq(A, 2, "y", true)))
	rs, _, err := c.apply(waitDL(acq(B, 2, "x", true)))
	if err != nil || rs[0].Status != StatusDeadlock {
		t.Fatalf("%+v %v", rs, err)
	}
	if want := `Acquire "x": waiting would deadlock: session 72 (nb) waits for "x", held by session 71 (na); session 71 (na) waits for "y", held by session 72 (nb)`; rs[0].Err != want {
		t.Errorf("refusal\n%s\nwant\n%s", rs[0].Err, want)
	}
	rs, _, _ = c.apply(waitDL(permits(A, 3, "s", 1, 1, true)))
	rs, _, _ = c.apply(waitDL(permits(A, 4, "s", 1, 1, true)))
	if rs[0].Status != StatusDeadlock || !strings.Contains(rs[0].Err, `session 71 (na) waits for "s", held by itself, session 71 (na)`) {
		t.Errorf("a wait for its own permit: %+v", rs[0])
	}
}

// waitsForever is the oracle the check is held to: it applies the same
// acquire without FlagDeadlock to a copy of s, then has every session that
// waits for nothing with the flag (the new attempts count as flagged)
// release everything it holds, through Apply itself, until nobody
// releases any more. It reports whether the acquire queued, and whether
// any of its attempts still waits then.
func waitsForever(t *testing.T, s *State, unit []Command) (queued, stuck bool) {
	t.Helper()
	c := New()
	if err := c.Load(bytes.NewReader(snapshot(t, s))); err != nil {
		t.Fatal(err)
	}
	index := c.Index()
	apply := func(cmds ...Command) []Result {
		index++
		rs, _ := c.Apply(index, cmds)
		return rs
	}
	plain := slices.Clone(unit)
	for i := range plain {
		plain[i].Flags &^= FlagDeadlock
	}
	if rs := apply(plain...); rs[0].Status != StatusQueued {
		return false, false
	}
	mine := map[ref]bool{}
	for _, cmd := range unit {
		mine[ref{cmd.Session, cmd.Req}] = true
	}
	blocked := func(sess *session) bool {
		for req, at := range sess.reqs {
			if at.state == ReqWaiting && (at.deadlock || mine[ref{sess.id, req}]) {
				return true
			}
		}
		return false
	}
	for moved := true; moved; {
		moved = false
		ids := make([]uint64, 0, len(c.sessions))
		for id := range c.sessions {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		for _, id := range ids {
			sess := c.sessions[id]
			if blocked(sess) {
				continue
			}
			for _, req := range sess.reqsIn(ReqHeld) {
				apply(rel(id, req))
				moved = true
			}
		}
	}
	for _, cmd := range unit {
		if at := c.sessions[cmd.Session].reqs[cmd.Req]; at.state == ReqWaiting {
			stuck = true
		}
	}
	return true, stuck
}

// deadlockRun plays a random workload of four sessions on five keys of
// every role, and checks each flagged wait's answer against waitsForever:
// refused with StatusDeadlock exactly when it would wait for ever. It
// returns the first disagreement, and counts the waits it refused.
func deadlockRun(t *testing.T, seed uint64, steps int, refused *int, broken brokenRules) error {
	r := rand.New(rand.NewPCG(seed, 31))
	c := newCheckerWith(broken)
	const sessions = 4
	next := map[uint64]uint64{}
	for i := range uint64(sessions) {
		c.apply(Command{Op: OpOpenSession, Owner: fmt.Sprintf("n%d", i), TTLMillis: 5000, Label: 100 + i})
		next[i+1] = 1
	}
	keyCmd := func(sess uint64) Command {
		cmd := Command{Op: OpAcquire, Session: sess, Wait: true}
		switch r.IntN(6) {
		case 0, 1:
			cmd.Key = []string{"m1", "m2"}[r.IntN(2)]
		case 2:
			cmd.Key, cmd.Limit = "m3", 2
		case 3:
			cmd.Key, cmd.Kind = "rw", []Kind{KindRead, KindWrite}[r.IntN(2)]
		default:
			cmd.Key, cmd.Kind, cmd.Limit, cmd.Permits = "s", KindSemaphore, 3, uint32(1+r.IntN(3))
		}
		if r.IntN(8) != 0 {
			cmd.Flags = FlagDeadlock
		}
		return cmd
	}
	live := func(sess uint64, state ReqState) []uint64 { return c.s.sessions[sess].reqsIn(state) }
	for step := range steps {
		sess := uint64(1 + r.IntN(sessions))
		var unit []Command
		switch op := r.IntN(10); {
		case op < 5:
			unit = []Command{keyCmd(sess)}
		case op < 7:
			a, b := keyCmd(sess), keyCmd(sess)
			if a.Key == b.Key {
				continue
			}
			b.Flags, b.Wait = a.Flags, a.Wait
			unit = group(a, b)
		case op < 9:
			if held := live(sess, ReqHeld); len(held) > 0 {
				unit = []Command{rel(sess, held[r.IntN(len(held))])}
			}
		default:
			if waiting := live(sess, ReqWaiting); len(waiting) > 0 {
				unit = []Command{cancel(sess, waiting[r.IntN(len(waiting))])}
			}
		}
		if len(unit) == 0 {
			continue
		}
		for i := range unit {
			if unit[i].Op == OpAcquire {
				unit[i].Req = next[sess]
				next[sess]++
			}
		}
		checked := unit[0].Op == OpAcquire && unit[0].Flags&FlagDeadlock != 0
		var queued, stuck bool
		if checked {
			queued, stuck = waitsForever(t, c.s, unit)
		}
		rs, _, err := c.apply(unit...)
		if err != nil {
			return fmt.Errorf("seed %d step %d: %v", seed, step, err)
		}
		if !checked || rs[0].Status == StatusMismatch || rs[0].Status == StatusLimitMismatch || rs[0].Status == StatusInvalid {
			continue
		}
		if rs[0].Status == StatusDeadlock {
			*refused++
		}
		switch got := rs[0].Status; {
		case got == StatusDeadlock && !stuck:
			return fmt.Errorf("seed %d step %d: %+v refused (%s), but it would have been granted", seed, step, unit, rs[0].Err)
		case got != StatusDeadlock && stuck:
			return fmt.Errorf("seed %d step %d: %+v answered %v, but it would wait for ever", seed, step, unit, got)
		case got == StatusQueued && !queued:
			return fmt.Errorf("seed %d step %d: %+v queued, the copy did not", seed, step, unit)
		}
	}
	return nil
}

// The check refuses exactly the waits that could never be granted, on
// every role, with groups, on random workloads.
func TestDeadlockCheckAgreesWithThePlay(t *testing.T) {
	refused := 0
	for seed := uint64(1); seed <= 300; seed++ {
		if err := deadlockRun(t, seed, 120, &refused, brokenRules{}); err != nil {
			t.Fatal(err)
		}
	}
	// The workloads must reach deadlocks for the agreement to mean much.
	if refused < 300 {
		t.Fatalf("only %d waits refused in 300 workloads", refused)
	}
	t.Logf("%d waits refused as deadlocks in 300 workloads, each agreeing with the play", refused)
}

// A check that lets a new wait jump the queues it joins misses issue 31's
// first case, and the random workloads catch it.
func TestDeadlockBrokenVariantIsCaught(t *testing.T) {
	broken := brokenRules{deadlockIgnoresQueue: true}
	c := newCheckerWith(broken)
	for _, sess := range []uint64{A, B} {
		c.apply(Command{Op: OpOpenSession, Owner: owners[sess], TTLMillis: 5000})
	}
	c.apply(acq(A, 1, "x", true))
	c.apply(group(waitDL(acq(B, 1, "x", true)), waitDL(acq(B, 2, "y", true)))...)
	if rs, _, _ := c.apply(waitDL(acq(A, 2, "y", true))); rs[0].Status != StatusQueued {
		t.Fatalf("the broken check refused the wait behind a group (%+v): it should miss it", rs[0])
	}
	refused := 0
	for seed := uint64(1); seed <= 300; seed++ {
		if err := deadlockRun(t, seed, 120, &refused, broken); err != nil {
			t.Logf("caught: %v", err)
			return
		}
	}
	t.Fatal("300 random workloads missed the broken deadlock check")
}

// BenchmarkDeadlockCheck measures the check of a wait at the end of a
// chain of n sessions, each holding a key and waiting (flagged) for the
// next one's: the play covers the whole chain, the most a check of that
// size does.
func BenchmarkDeadlockCheck(b *testing.B) {
	for _, n := range []int{1, 100, 1000} {
		b.Run(fmt.Sprintf("chain%d", n), func(b *testing.B) {
			s := New()
			apply := applyAt(s)
			ids := make([]uint64, n+1)
			for i := range ids {
				ids[i] = apply(Command{Op: OpOpenSession, Owner: "o", TTLMillis: 1000})[0].Session
				apply(acq(ids[i], 1, fmt.Sprintf("k%d", i), true))
			}
			for i := 0; i < n; i++ {
				apply(waitDL(acq(ids[i], 2, fmt.Sprintf("k%d", i+1), true)))
			}
			sess := s.sessions[ids[n]]
			at := &attempt{key: "k0", permits: 1, deadlock: true}
			b.ResetTimer()
			for b.Loop() {
				if why := s.deadlock(sess, []uint64{3}, []*attempt{at}); why == "" {
					b.Fatal("the chain's closing wait was not found a deadlock")
				}
			}
		})
	}
}

// A refusal that names long keys and owners is cut to MaxErrLen, so its
// entry's results still encode: a replica that could not encode them
// would fail the entry on every replica, and again after every restart.
func TestLongRefusalsStillEncode(t *testing.T) {
	c := newChecker()
	long := func(c byte, n int) string { return strings.Repeat(string(c), n) }
	for _, o := range []string{long('a', MaxOwnerLen), long('b', MaxOwnerLen)} {
		if _, _, err := c.apply(Command{Op: OpOpenSession, Owner: o, TTLMillis: 5000}); err != nil {
			t.Fatal(err)
		}
	}
	x, y, z := long('x', MaxKeyLen), long('y', MaxKeyLen), long('z', MaxKeyLen)
	steps := [][]Command{
		{acq(A, 1, x, true)},
		{acq(B, 1, y, true)},
		{waitDL(acq(A, 2, y, true))},
		group(waitDL(acq(B, 2, z, true)), waitDL(acq(B, 3, x, true))),
	}
	for i, cmds := range steps {
		rs, _, err := c.apply(cmds...)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if i == len(steps)-1 && (rs[0].Status != StatusDeadlock || len(rs[0].Err) > MaxErrLen || !strings.HasPrefix(rs[0].Err, "Acquire of a group")) {
			t.Fatalf("the long refusal: %v, %d bytes", rs[0].Status, len(rs[0].Err))
		}
	}
}

// BenchmarkDeadlockCheckManyHolders measures the check of a semaphore
// wait behind n takes of one session: each hold costs the play O(1), so
// the check grows with n, not n².
func BenchmarkDeadlockCheckManyHolders(b *testing.B) {
	for _, n := range []int{100, 2000, 8000} {
		b.Run(fmt.Sprintf("holders%d", n), func(b *testing.B) {
			s := New()
			apply := applyAt(s)
			holder := apply(Command{Op: OpOpenSession, Owner: "o", TTLMillis: 1000})[0].Session
			waiter := apply(Command{Op: OpOpenSession, Owner: "o", TTLMillis: 1000})[0].Session
			for i := range n {
				apply(permits(holder, uint64(i+1), "s", uint32(n), 1, true))
			}
			sess := s.sessions[waiter]
			at := &attempt{key: "s", kind: KindSemaphore, permits: 1, deadlock: true}
			b.ResetTimer()
			for b.Loop() {
				if why := s.deadlock(sess, []uint64{1}, []*attempt{at}); why != "" {
					b.Fatal(why)
				}
			}
		})
	}
}
