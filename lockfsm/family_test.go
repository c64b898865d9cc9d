package lockfsm

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func rlock(sess, req uint64, key string, wait bool) Command {
	return Command{Op: OpAcquire, Session: sess, Req: req, Key: key, Wait: wait, Kind: KindRead}
}

func wlock(sess, req uint64, key string, wait bool) Command {
	return Command{Op: OpAcquire, Session: sess, Req: req, Key: key, Wait: wait, Kind: KindWrite}
}

func permits(sess, req uint64, key string, limit, n uint32, wait bool) Command {
	return Command{Op: OpAcquire, Session: sess, Req: req, Key: key, Wait: wait, Kind: KindSemaphore, Limit: limit, Permits: n}
}

// group makes cmds one all-or-nothing group.
func group(cmds ...Command) []Command {
	for i := range cmds {
		cmds[i].Group = uint16(len(cmds))
	}
	return cmds
}

func handed(key string, sess, req, tok uint64) Grant {
	gr := g(key, sess, req, tok)
	gr.HandOff = true
	return gr
}

var mismatch = Result{Status: StatusMismatch, Err: "*"}

func TestFamilyTable(t *testing.T) {
	runTable(t, []tcase{
		{name: "readers share; a writer waits for all of them", steps: []step{
			one(rlock(A, 1, "x", true), granted(1), g("x", A, 1, 1)),
			one(rlock(B, 1, "x", true), granted(2), g("x", B, 1, 2)),
			one(wlock(C, 1, "x", true), queued),
			one(rel(A, 1), okTok(1)),
			one(rel(B, 1), okTok(2), handed("x", C, 1, 3)),
		}},
		{name: "a queued writer blocks readers that come after it", steps: []step{
			one(rlock(A, 1, "x", true), granted(1), g("x", A, 1, 1)),
			one(wlock(B, 1, "x", true), queued),
			one(rlock(C, 1, "x", false), locked),
			one(rlock(C, 2, "x", true), queued),
			one(rel(A, 1), okTok(1), handed("x", B, 1, 2)),
			one(rel(B, 1), okTok(2), handed("x", C, 2, 3)),
		}},
		{name: "a writer's release hands the key to the run of readers at the head, in one entry", steps: []step{
			one(wlock(A, 1, "x", true), granted(1), g("x", A, 1, 1)),
			one(rlock(B, 1, "x", true), queued),
			one(rlock(C, 1, "x", true), queued),
			one(wlock(B, 2, "x", true), queued),
			one(rlock(C, 2, "y", true), granted(2), g("y", C, 2, 2)),
			one(rel(A, 1), okTok(1), handed("x", B, 1, 3), handed("x", C, 1, 4)),
		}, check: func(t *testing.T, s *State) {
			info, _ := s.Key("x")
			if len(info.Holders) != 2 || len(info.Waiters) != 1 || info.Waiters[0].Kind != KindWrite || info.Role != KindWrite {
				t.Errorf("Key(x) = %+v", info)
			}
		}},
		{name: "a writer's token is above every earlier reader's", steps: []step{
			one(rlock(A, 1, "x", true), granted(1), g("x", A, 1, 1)),
			one(rlock(B, 1, "x", true), granted(2), g("x", B, 1, 2)),
			one(wlock(C, 1, "x", true), queued),
			{cmds: []Command{rel(A, 1), rel(B, 1)}, want: []Result{okTok(1), okTok(2)}, grants: []Grant{handed("x", C, 1, 3)}},
		}},
		{name: "semaphore: permits add up to the limit, FIFO, and a large request is not starved", steps: []step{
			one(permits(A, 1, "s", 3, 2, true), granted(1), g("s", A, 1, 1)),
			one(permits(B, 1, "s", 3, 2, true), queued),
			// One permit is free, but B asked first: C queues behind it.
			one(permits(C, 1, "s", 3, 1, false), locked),
			one(permits(C, 2, "s", 3, 1, true), queued),
			one(rel(A, 1), okTok(1), handed("s", B, 1, 2), handed("s", C, 2, 3)),
		}, check: func(t *testing.T, s *State) {
			info, _ := s.Key("s")
			if len(info.Holders) != 2 || info.Holders[0].Permits != 2 || info.Holders[1].Permits != 1 || info.Limit != 3 {
				t.Errorf("Key(s) = %+v", info)
			}
		}},
		{name: "semaphore: a dead holder's permits come back", steps: []step{
			one(permits(A, 1, "s", 2, 2, true), granted(1), g("s", A, 1, 1)),
			one(permits(B, 1, "s", 2, 1, true), queued),
			one(permits(C, 1, "s", 2, 1, true), queued),
			one(expire(A), ok, handed("s", B, 1, 2), handed("s", C, 1, 3)),
		}},
		{name: "roles and limits must agree while a key is in use", steps: []step{
			one(permits(A, 1, "s", 3, 1, true), granted(1), g("s", A, 1, 1)),
			one(permits(B, 1, "s", 5, 1, true), Result{Status: StatusLimitMismatch, Err: "*"}),
			one(acq(B, 2, "s", true), mismatch),
			one(rlock(B, 3, "s", true), mismatch),
			one(rlock(B, 4, "x", true), granted(2), g("x", B, 4, 2)),
			one(acq(C, 1, "x", true), mismatch),
			one(permits(C, 2, "x", 2, 1, true), mismatch),
			// Once idle, a key forgets its role.
			one(rel(B, 4), okTok(2)),
			one(acq(C, 3, "x", true), granted(3), g("x", C, 3, 3)),
		}, check: func(t *testing.T, s *State) {
			if st := s.Stats(); st.Holders != 2 || st.Waiters != 0 {
				t.Errorf("refused acquires left holders or waiters: %+v", st)
			}
		}},
		{name: "bad semaphore and read/write input", steps: []step{
			one(permits(A, 1, "s", 0, 1, true), bad),
			one(permits(A, 2, "s", 2, 3, true), bad),
			one(Command{Op: OpAcquire, Session: A, Req: 3, Key: "x", Kind: KindRead, Limit: 2}, bad),
			one(Command{Op: OpAcquire, Session: A, Req: 4, Key: "x", Permits: 2}, bad),
			one(Command{Op: OpAcquire, Session: A, Req: 5, Key: "x", Kind: maxKind + 1}, bad),
			one(Command{Op: OpAcquire, Session: A, Req: 6, Key: "x", Flags: 0x80}, bad),
		}, check: func(t *testing.T, s *State) {
			if st := s.Stats(); st.Keys != 0 {
				t.Errorf("refused acquires left keys: %+v", st)
			}
		}},
		{name: "group: granted whole when every key is free", steps: []step{
			{cmds: group(acq(A, 1, "x", true), wlock(A, 2, "y", true), permits(A, 3, "s", 2, 2, true)),
				want:   []Result{granted(1), granted(2), granted(3)},
				grants: []Grant{g("x", A, 1, 1), g("y", A, 2, 2), g("s", A, 3, 3)}},
		}},
		{name: "group: TryLockAll refused whole, nothing held or left behind", steps: []step{
			one(acq(B, 1, "y", true), granted(1), g("y", B, 1, 1)),
			{cmds: group(acq(A, 1, "x", false), acq(A, 2, "y", false)), want: []Result{locked, locked}},
			one(acq(C, 1, "x", false), granted(2), g("x", C, 1, 2)),
		}},
		{name: "group: waits whole, blocks its free key, and is granted in one entry", steps: []step{
			one(acq(B, 1, "y", true), granted(1), g("y", B, 1, 1)),
			{cmds: group(acq(A, 1, "x", true), acq(A, 2, "y", true)), want: []Result{queued, queued}},
			// x is free, but the group stands first in its queue.
			one(acq(C, 1, "x", true), queued),
			one(rel(B, 1), okTok(1), handed("x", A, 1, 2), handed("y", A, 2, 3)),
			one(rel(A, 1), okTok(2), handed("x", C, 1, 4)),
		}},
		{name: "group: cancelling one attempt withdraws the whole group", steps: []step{
			one(acq(B, 1, "y", true), granted(1), g("y", B, 1, 1)),
			{cmds: group(acq(A, 1, "x", true), acq(A, 2, "y", true)), want: []Result{queued, queued}},
			one(acq(C, 1, "x", true), queued),
			one(cancel(A, 2), cancelled, handed("x", C, 1, 2)),
			one(rel(B, 1), okTok(1)),
		}, check: func(t *testing.T, s *State) {
			for _, req := range []uint64{1, 2} {
				if info, _ := s.Request(A, req); info.State != ReqCancelled {
					t.Errorf("group attempt %d: %v, want Cancelled", req, info.State)
				}
			}
		}},
		{name: "group: a retry answers every attempt", steps: []step{
			{cmds: group(acq(A, 1, "x", true), acq(A, 2, "y", true)), want: []Result{granted(1), granted(2)},
				grants: []Grant{g("x", A, 1, 1), g("y", A, 2, 2)}},
			{cmds: group(acq(A, 1, "x", true), acq(A, 2, "y", true)), want: []Result{granted(1), granted(2)}},
		}},
		{name: "group: bad groups are refused whole and change nothing", steps: []step{
			{cmds: group(acq(A, 1, "x", true), acq(A, 2, "x", true)), want: []Result{bad, bad}},
			{cmds: group(acq(A, 3, "x", true), acq(A, 4, "y", false)), want: []Result{bad, bad}},
			// Request ids that do not follow: each is a group of one.
			{cmds: group(acq(A, 5, "x", true), acq(A, 7, "y", true)), want: []Result{bad, bad}},
			{cmds: []Command{{Op: OpAcquire, Session: A, Req: 8, Key: "x", Group: 3}, {Op: OpAcquire, Session: A, Req: 9, Key: "y", Group: 3}}, want: []Result{bad, bad}},
			{cmds: []Command{{Op: OpAcquire, Session: A, Req: 10, Key: "x", Group: 1}}, want: []Result{bad}},
		}, check: func(t *testing.T, s *State) {
			if st := s.Stats(); st.Keys != 0 {
				t.Errorf("bad groups left keys: %+v", st)
			}
		}},
		{name: "deadlock: the wait that closes a cycle is refused, naming it", steps: []step{
			one(acq(A, 1, "x", true), granted(1), g("x", A, 1, 1)),
			one(acq(B, 1, "y", true), granted(2), g("y", B, 1, 2)),
			one(Command{Op: OpAcquire, Session: A, Req: 2, Key: "y", Wait: true, Flags: FlagDeadlock}, queued),
			one(Command{Op: OpAcquire, Session: B, Req: 2, Key: "x", Wait: true, Flags: FlagDeadlock}, Result{Status: StatusDeadlock, Err: "*"}),
			// Without the flag the same wait queues (a shared session).
			one(acq(B, 3, "x", true), queued),
		}},
		{name: "deadlock: a three-session cycle through a read/write lock", steps: []step{
			one(rlock(A, 1, "x", true), granted(1), g("x", A, 1, 1)),
			one(acq(B, 1, "y", true), granted(2), g("y", B, 1, 2)),
			one(acq(C, 1, "z", true), granted(3), g("z", C, 1, 3)),
			one(Command{Op: OpAcquire, Session: A, Req: 2, Key: "y", Wait: true, Flags: FlagDeadlock}, queued),
			one(Command{Op: OpAcquire, Session: B, Req: 2, Key: "z", Wait: true, Flags: FlagDeadlock}, queued),
			one(Command{Op: OpAcquire, Session: C, Req: 2, Key: "x", Wait: true, Kind: KindWrite, Flags: FlagDeadlock}, Result{Status: StatusDeadlock, Err: "*"}),
			// The refused wait left nothing: C waits for nothing, so A may wait for C.
			one(Command{Op: OpAcquire, Session: C, Req: 3, Key: "w", Wait: true, Flags: FlagDeadlock}, granted(4), g("w", C, 3, 4)),
			one(Command{Op: OpAcquire, Session: A, Req: 3, Key: "w", Wait: true, Flags: FlagDeadlock}, queued),
		}},
		{name: "deadlock: a semaphore wait another holder's release ends", steps: []step{
			one(permits(A, 1, "s", 2, 1, true), granted(1), g("s", A, 1, 1)),
			one(permits(B, 1, "s", 2, 1, true), granted(2), g("s", B, 1, 2)),
			one(acq(C, 1, "x", true), granted(3), g("x", C, 1, 3)),
			one(Command{Op: OpAcquire, Session: A, Req: 2, Key: "x", Wait: true, Flags: FlagDeadlock}, queued),
			one(Command{Op: OpAcquire, Session: C, Req: 2, Key: "s", Wait: true, Kind: KindSemaphore, Limit: 2, Permits: 1, Flags: FlagDeadlock}, queued),
		}},
	})
}

// runTable runs table cases: each starts with sessions A, B and C open,
// and checks every step's results and grants. A grant is a hand-off
// unless it answers an Acquire of the same step that was granted.
func runTable(t *testing.T, cases []tcase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newChecker()
			for _, sess := range []uint64{A, B, C} {
				rs, _, err := c.apply(Command{Op: OpOpenSession, Owner: owners[sess], TTLMillis: 5000})
				if err != nil || !reflect.DeepEqual(rs[0], Result{Status: StatusOK, Session: sess}) {
					t.Fatalf("open session: %+v %v", rs, err)
				}
			}
			for i, st := range tc.steps {
				rs, gs, err := c.apply(st.cmds...)
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				for j, r := range rs {
					w := st.want[j]
					if w.Err == "*" && r.Err != "" {
						w.Err = r.Err
					}
					if !reflect.DeepEqual(r, w) {
						t.Errorf("step %d (%v): command %d: got %+v, want %+v", i, st.cmds[j].Op, j, r, st.want[j])
					}
				}
				// A grant is a hand-off unless it answers an Acquire of
				// the same step that was granted.
				want := slices.Clone(st.grants)
				for k := range want {
					want[k].HandOff = true
					for j, c := range st.cmds {
						if c.Op == OpAcquire && c.Session == want[k].Session && c.Req == want[k].Req && st.want[j].Status == StatusGranted {
							want[k].HandOff = false
						}
					}
				}
				if !slices.Equal(gs, want) {
					t.Errorf("step %d: grants %+v, want %+v", i, gs, want)
				}
			}
			if tc.check != nil {
				tc.check(t, c.s)
			}
		})
	}
}

// A deadlock refusal names the cycle: who waits for what, held by whom.
func TestDeadlockNamesTheCycle(t *testing.T) {
	c := newChecker()
	for _, o := range []string{"na", "nb"} {
		c.apply(Command{Op: OpOpenSession, Owner: o, TTLMillis: 5000})
	}
	c.apply(acq(A, 1, "x", true))
	c.apply(acq(B, 1, "y", true))
	c.apply(Command{Op: OpAcquire, Session: A, Req: 2, Key: "y", Wait: true, Flags: FlagDeadlock})
	rs, _, err := c.apply(Command{Op: OpAcquire, Session: B, Req: 2, Key: "x", Wait: true, Flags: FlagDeadlock})
	if err != nil || rs[0].Status != StatusDeadlock {
		t.Fatalf("%+v %v", rs, err)
	}
	for _, want := range []string{`shard session 2 (nb) waits for "x", held by shard session 1 (na)`, `shard session 1 (na) waits for "y", held by shard session 2 (nb)`} {
		if !strings.Contains(rs[0].Err, want) {
			t.Errorf("deadlock error %q does not say %q", rs[0].Err, want)
		}
	}
	if info, _ := c.s.Request(B, 2); info.State != ReqRejected {
		t.Errorf("refused attempt is %v, want Rejected", info.State)
	}
}

// A refused TryLock with FlagDetail names the holders, and its results
// travel in version 3; without the flag, in version 2 as before.
func TestRefusalNamesHolders(t *testing.T) {
	c := newChecker()
	c.apply(Command{Op: OpOpenSession, Owner: "na", TTLMillis: 5000, Label: 77})
	c.apply(Command{Op: OpOpenSession, Owner: "nb", TTLMillis: 5000})
	c.apply(rlock(A, 1, "x", true))
	rs, _, _ := c.apply(Command{Op: OpAcquire, Session: B, Req: 1, Key: "x", Kind: KindWrite, Flags: FlagDetail})
	want := []Holder{{Session: A, Req: 1, Token: 1, Owner: "na", Label: 77, Kind: KindRead, Permits: 1}}
	if rs[0].Status != StatusLocked || !reflect.DeepEqual(rs[0].Holders, want) {
		t.Fatalf("refusal %+v, want Locked naming %+v", rs[0], want)
	}
	b, err := EncodeResults(rs)
	if err != nil || b[0] != 3 {
		t.Fatalf("EncodeResults: %v, version %d; want 3", err, b[0])
	}
	if got, err := DecodeResults(b); err != nil || !reflect.DeepEqual(got, rs) {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	rs, _, _ = c.apply(Command{Op: OpAcquire, Session: B, Req: 2, Key: "x", Kind: KindWrite})
	if b, _ := EncodeResults(rs); rs[0].Status != StatusLocked || rs[0].Holders != nil || b[0] != 2 {
		t.Fatalf("refusal without FlagDetail: %+v in version %d", rs[0], b[0])
	}
}

// The family's fields round-trip in the tagged format and are refused in
// the positional one.
func TestFamilyFieldsEncode(t *testing.T) {
	cmds := []Command{
		{Op: OpAcquire, Session: 1, Req: 2, Key: "s", Wait: true, Kind: KindSemaphore, Limit: 8, Permits: 3, Flags: FlagDetail | FlagDeadlock},
		{Op: OpAcquire, Session: 1, Req: 3, Key: "r", Kind: KindRead, Group: 2},
		{Op: OpAcquire, Session: 1, Req: 4, Key: "w", Kind: KindWrite, Group: 2},
	}
	b, err := EncodeCommandsFormat(FormatTagged, cmds)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := DecodeCommands(b); err != nil || !reflect.DeepEqual(got, cmds) {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	for _, c := range cmds {
		if _, err := EncodeCommandsFormat(FormatPositional, []Command{c}); !errors.Is(err, ErrUnsupported) {
			t.Errorf("positional %+v: %v, want ErrUnsupported", c, err)
		}
		if MinCommandFormat([]Command{c}) != FormatTagged {
			t.Errorf("MinCommandFormat(%+v) is not FormatTagged", c)
		}
	}
}

// A state holding the lock family needs snapshot format 3: format 2 is
// refused rather than drop the roles and groups.
func TestFamilyNeedsSnapshotFormat3(t *testing.T) {
	for name, cmd := range map[string]Command{
		"read":      rlock(A, 1, "x", true),
		"semaphore": permits(A, 1, "x", 2, 1, true),
		"deadlock":  {Op: OpAcquire, Session: A, Req: 1, Key: "x", Flags: FlagDeadlock},
	} {
		c := newChecker()
		c.apply(Command{Op: OpOpenSession, Owner: "na", TTLMillis: 5000})
		c.apply(cmd)
		if c.s.MinSnapshotFormat() != 3 {
			t.Errorf("%s: MinSnapshotFormat %d, want 3", name, c.s.MinSnapshotFormat())
		}
		var buf bytes.Buffer
		if err := c.s.SaveFormat(&buf, 2); !errors.Is(err, ErrVersion) {
			t.Errorf("%s: SaveFormat(2): %v, want ErrVersion", name, err)
		}
	}
}

// Each deliberately broken grant rule is caught by the checks the random
// family logs run (Verify after every entry, twins, a restored snapshot),
// within the logs TestRandomFamilyLogsDeterministic runs.
func TestBrokenFamilyRulesAreCaught(t *testing.T) {
	for name, broken := range map[string]brokenRules{
		"reader joins writer":  {readerJoinsWriter: true},
		"semaphore overfill":   {semaphoreOverfill: true},
		"group piecemeal":      {groupPiecemeal: true},
		"value unfenced":       {valueUnfenced: true},
		"events miss hand-off": {eventsMissHandOff: true},
	} {
		t.Run(name, func(t *testing.T) {
			for seed := uint64(1); seed <= 200; seed++ {
				r := rand.New(rand.NewPCG(seed, 43))
				data := make([]byte, 500+r.IntN(3000))
				for i := range data {
					data[i] = byte(r.Uint32())
				}
				if err := checkLogWith(t, genFamilyLog(data), broken); err != nil {
					t.Logf("caught at seed %d: %v", seed, err)
					return
				}
			}
			t.Fatal("the checks missed the broken rule in 200 logs")
		})
	}
}

func TestUnits(t *testing.T) {
	single := acq(A, 1, "a", true)
	g3 := group(acq(A, 2, "x", true), acq(A, 3, "y", true), acq(A, 4, "z", true))
	short := group(acq(B, 1, "x", true), acq(B, 2, "y", true), acq(B, 3, "z", true))[:2] // its third is missing
	cmds := append(append(append([]Command{single}, g3...), short...), rel(A, 1))
	var sizes []int
	for _, u := range Units(cmds) {
		sizes = append(sizes, len(u))
	}
	if want := []int{1, 3, 2, 1}; !reflect.DeepEqual(sizes, want) {
		t.Fatalf("Units sizes %v, want %v", sizes, want)
	}
}

// A hold with a maximum is ended by ExpireHold of the recorded term,
// which hands the key on as a release would; a stale term, a hold without
// a maximum or one already released change nothing.
func TestExpireHold(t *testing.T) {
	capped := func(sess, req uint64, key string) Command {
		c := acq(sess, req, key, true)
		c.MaxHoldMillis = 1000
		return c
	}
	expireHold := func(sess, target, term uint64) Command {
		return Command{Op: OpExpireHold, Session: sess, Target: target, Term: term}
	}
	runTable(t, []tcase{
		{name: "expired in the recorded term, handed on", steps: []step{
			one(leaderTerm(4), ok),
			one(capped(A, 1, "x"), granted(1), g("x", A, 1, 1)),
			one(acq(B, 1, "x", true), queued),
			one(expireHold(A, 1, 3), staleTerm),
			one(expireHold(A, 1, 4), released(1), handed("x", B, 1, 2)),
			one(expireHold(A, 1, 4), notHeld),
			one(rel(A, 1), okTok(1)),
		}, check: func(t *testing.T, s *State) {
			if mh := s.MaxHolds(); len(mh) != 0 {
				t.Errorf("MaxHolds after the expiry: %+v", mh)
			}
		}},
		{name: "a hold without a maximum is not ended", steps: []step{
			one(leaderTerm(1), ok),
			one(acq(A, 1, "x", true), granted(1), g("x", A, 1, 1)),
			one(expireHold(A, 1, 1), notHeld),
		}},
		{name: "a waiter's maximum counts once it is granted", steps: []step{
			one(leaderTerm(1), ok),
			one(acq(A, 1, "x", true), granted(1), g("x", A, 1, 1)),
			one(capped(B, 1, "x"), queued),
			one(expireHold(B, 1, 1), notHeld),
			one(rel(A, 1), okTok(1), handed("x", B, 1, 2)),
		}, check: func(t *testing.T, s *State) {
			if mh := s.MaxHolds(); len(mh) != 1 || mh[0] != (HoldInfo{Session: B, Req: 1, MaxHoldMillis: 1000}) {
				t.Errorf("MaxHolds: %+v", mh)
			}
		}},
	})
	// The maximum travels in the tagged format only, and in snapshot 3.
	c := Command{Op: OpAcquire, Session: 1, Req: 1, Key: "k", MaxHoldMillis: 5}
	if _, err := EncodeCommandsFormat(FormatPositional, []Command{c}); !errors.Is(err, ErrUnsupported) {
		t.Errorf("positional MaxHoldMillis: %v", err)
	}
	if _, err := EncodeCommandsFormat(FormatPositional, []Command{{Op: OpExpireHold, Session: 1, Target: 1, Term: 1}}); !errors.Is(err, ErrUnsupported) {
		t.Errorf("positional ExpireHold: %v", err)
	}
	s := New()
	s.Apply(1, []Command{{Op: OpOpenSession, Owner: "n", TTLMillis: 1000}})
	s.Apply(2, []Command{c})
	if s.MinSnapshotFormat() != 3 {
		t.Error("a state with a maximum hold does not need format 3")
	}
	r := New()
	if err := r.Load(bytes.NewReader(snapshot(t, s))); err != nil || !reflect.DeepEqual(r.MaxHolds(), s.MaxHolds()) {
		t.Fatalf("a maximum hold did not survive a snapshot: %v %+v", err, r.MaxHolds())
	}
}
