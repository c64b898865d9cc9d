package lockfsm

import (
	"bytes"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// Sessions opened by every table case before its steps: A at index 1, B at 2,
// C at 3, owned by nodes "na", "nb", "nc".
const (
	A = 1
	B = 2
	C = 3
)

func acq(sess, req uint64, key string, wait bool) Command {
	return Command{Op: OpAcquire, Session: sess, Req: req, Key: key, Wait: wait}
}

func sem(sess, req uint64, key string, limit uint32) Command {
	return Command{Op: OpAcquire, Session: sess, Req: req, Key: key, Wait: true, Limit: limit}
}

func rel(sess, target uint64) Command {
	return Command{Op: OpRelease, Session: sess, Target: target}
}

func cancel(sess, target uint64) Command {
	return Command{Op: OpCancel, Session: sess, Target: target}
}

func expire(sess uint64) Command { return Command{Op: OpExpireSession, Session: sess} }
func closeS(sess uint64) Command { return Command{Op: OpCloseSession, Session: sess} }

// expireIn is an ExpireSession decided by the leader of term.
func expireIn(sess, term uint64) Command {
	return Command{Op: OpExpireSession, Session: sess, Term: term}
}

func leaderTerm(term uint64) Command { return Command{Op: OpLeaderTerm, Term: term} }

var (
	ok        = Result{Status: StatusOK}
	queued    = Result{Status: StatusQueued}
	locked    = Result{Status: StatusLocked}
	cancelled = Result{Status: StatusCancelled}
	notHeld   = Result{Status: StatusNotHeld}
	noSession = Result{Status: StatusNoSession}
	bad       = Result{Status: StatusInvalid, Err: "*"} // any non-empty Err
	staleTerm = Result{Status: StatusStaleTerm, Err: "*"}
)

func granted(tok uint64) Result  { return Result{Status: StatusGranted, Token: tok} }
func released(tok uint64) Result { return Result{Status: StatusReleased, Token: tok} }
func okTok(tok uint64) Result    { return Result{Status: StatusOK, Token: tok} }

var owners = map[uint64]string{A: "na", B: "nb", C: "nc"}

func g(key string, sess, req, tok uint64) Grant {
	return Grant{Key: key, Session: sess, Req: req, Token: tok, Owner: owners[sess]}
}

// step applies one entry. want is 1:1 with cmds; grants nil means none.
type step struct {
	cmds   []Command
	want   []Result
	grants []Grant
}

func one(c Command, want Result, grants ...Grant) step {
	return step{cmds: []Command{c}, want: []Result{want}, grants: grants}
}

type tcase struct {
	name  string
	steps []step
	check func(t *testing.T, s *State)
}

func TestApplyTable(t *testing.T) {
	long := strings.Repeat("k", MaxKeyLen)
	cases := []tcase{
		{name: "acquire free key grants token 1", steps: []step{
			one(acq(A, 1, "x", true), granted(1), g("x", A, 1, 1)),
		}, check: func(t *testing.T, s *State) {
			info, ok := s.Key("x")
			if !ok || info.Limit != 1 || len(info.Holders) != 1 || !reflect.DeepEqual(info.Holders[0], Holder{Session: A, Req: 1, Token: 1, Owner: "na", Permits: 1}) {
				t.Errorf("Key(x) = %+v, %v", info, ok)
			}
		}},
		{name: "same session second attempt waits, no reentrancy", steps: []step{
			one(acq(A, 1, "x", true), granted(1), g("x", A, 1, 1)),
			one(acq(A, 2, "x", true), queued),
			one(rel(A, 1), okTok(1), g("x", A, 2, 2)),
		}},
		{name: "other session waits and gets a higher token on release", steps: []step{
			one(acq(A, 1, "x", true), granted(1), g("x", A, 1, 1)),
			one(acq(B, 1, "x", true), queued),
			one(rel(A, 1), okTok(1), g("x", B, 1, 2)),
			one(rel(A, 1), okTok(1)), // idempotent, no second hand-off
			one(rel(B, 1), okTok(2)),
		}, check: func(t *testing.T, s *State) {
			if _, ok := s.Key("x"); ok {
				t.Errorf("key x kept with no holders")
			}
			if st := s.Stats(); st.Keys != 0 || st.Holders != 0 || st.NextToken != 3 {
				t.Errorf("Stats = %+v", st)
			}
		}},
		{name: "release by a non-holder", steps: []step{
			one(acq(A, 1, "x", true), granted(1), g("x", A, 1, 1)),
			one(acq(B, 1, "x", true), queued),
			one(rel(B, 1), notHeld),   // B's attempt is waiting
			one(rel(B, 7), notHeld),   // unknown attempt
			one(rel(C, 1), notHeld),   // A's request id, C's session
			one(rel(9, 1), noSession), // unknown session
		}, check: func(t *testing.T, s *State) {
			if info, _ := s.Request(B, 1); info.State != ReqWaiting {
				t.Errorf("B/1 = %+v, want still waiting", info)
			}
		}},
		{name: "cancel before grant dequeues", steps: []step{
			one(acq(A, 1, "x", true), granted(1), g("x", A, 1, 1)),
			one(acq(B, 1, "x", true), queued),
			one(cancel(B, 1), cancelled),
			one(cancel(B, 1), cancelled),
			one(acq(B, 1, "x", true), cancelled), // retried Acquire does not requeue
			one(rel(B, 1), notHeld),
			one(rel(A, 1), okTok(1)), // nobody left to hand off to
		}, check: func(t *testing.T, s *State) {
			if _, ok := s.Key("x"); ok {
				t.Errorf("key x kept")
			}
		}},
		{name: "cancel after grant releases and hands off", steps: []step{
			one(acq(A, 1, "x", true), granted(1), g("x", A, 1, 1)),
			one(acq(B, 1, "x", true), queued),
			one(cancel(A, 1), released(1), g("x", B, 1, 2)),
			one(cancel(A, 1), released(1)),
			one(acq(A, 1, "x", true), released(1)),
			one(rel(A, 1), okTok(1)),
		}},
		{name: "cancel of an unknown attempt leaves a tombstone", steps: []step{
			one(cancel(A, 5), cancelled),
			one(acq(A, 5, "x", true), cancelled),
			one(acq(A, 6, "x", true), granted(1), g("x", A, 6, 1)),
		}, check: func(t *testing.T, s *State) {
			if info, _ := s.Request(A, 5); !info.Found || info.State != ReqCancelled || info.Key != "" {
				t.Errorf("A/5 = %+v", info)
			}
		}},
		{name: "expire with waiters hands off to the next session", steps: []step{
			one(acq(A, 1, "x", true), granted(1), g("x", A, 1, 1)),
			one(acq(B, 1, "y", true), granted(2), g("y", B, 1, 2)),
			one(acq(A, 2, "y", true), queued),
			one(acq(B, 2, "x", true), queued),
			one(acq(C, 1, "x", true), queued),
			one(expire(A), ok, g("x", B, 2, 3)),
			one(expire(A), noSession),
			one(acq(A, 3, "z", true), noSession),
			one(rel(B, 2), okTok(3), g("x", C, 1, 4)),
			one(rel(B, 1), okTok(2)), // A's waiter on y was dropped
		}, check: func(t *testing.T, s *State) {
			if _, ok := s.Session(A); ok {
				t.Errorf("session A still there")
			}
			if _, ok := s.Key("y"); ok {
				t.Errorf("key y kept")
			}
			if _, found := s.Request(A, 1); found {
				t.Errorf("Request of an expired session found it")
			}
		}},
		{name: "expiry hands off in request id order, not map order", steps: []step{
			one(acq(A, 4, "d", true), granted(1), g("d", A, 4, 1)),
			one(acq(A, 2, "b", true), granted(2), g("b", A, 2, 2)),
			one(acq(A, 1, "a", true), granted(3), g("a", A, 1, 3)),
			one(acq(A, 3, "c", true), granted(4), g("c", A, 3, 4)),
			{cmds: []Command{acq(B, 1, "d", true), acq(B, 2, "c", true), acq(C, 1, "b", true), acq(B, 3, "a", true)},
				want: []Result{queued, queued, queued, queued}},
			one(expire(A), ok, g("a", B, 3, 5), g("b", C, 1, 6), g("c", B, 2, 7), g("d", B, 1, 8)),
		}},
		{name: "close session releases and forgets", steps: []step{
			one(acq(A, 1, "x", true), granted(1), g("x", A, 1, 1)),
			one(acq(B, 1, "x", true), queued),
			one(closeS(A), ok, g("x", B, 1, 2)),
			one(closeS(A), noSession),
			one(rel(A, 1), noSession),
			one(cancel(A, 1), noSession),
		}, check: func(t *testing.T, s *State) {
			ss := s.Sessions()
			if len(ss) != 2 || ss[0].ID != B || ss[1].ID != C || ss[0].Held != 1 {
				t.Errorf("Sessions = %+v", ss)
			}
		}},
		{name: "session waiting behind its own hold: expiry skips its waiter", steps: []step{
			one(acq(A, 1, "x", true), granted(1), g("x", A, 1, 1)),
			one(acq(A, 2, "x", true), queued),
			one(acq(B, 1, "x", true), queued),
			one(expire(A), ok, g("x", B, 1, 2)),
		}},
		{name: "duplicate acquire ids answer from state", steps: []step{
			one(acq(A, 1, "x", true), granted(1), g("x", A, 1, 1)),
			one(acq(A, 1, "x", true), granted(1)),
			one(acq(B, 1, "x", true), queued),
			one(acq(B, 1, "x", true), queued),
			one(acq(C, 1, "x", false), locked),
			one(acq(C, 1, "x", true), locked),  // rejected stays rejected
			one(acq(A, 1, "other", true), bad), // same id, other key
			one(rel(A, 1), okTok(1), g("x", B, 1, 2)),
			one(acq(A, 1, "x", true), released(1)),
			one(acq(B, 1, "x", true), granted(2)),
		}, check: func(t *testing.T, s *State) {
			if st := s.Stats(); st.Holders != 1 || st.Waiters != 0 {
				t.Errorf("Stats = %+v", st)
			}
		}},
		{name: "duplicate ids of release, cancel, expire, close in one entry", steps: []step{
			one(acq(A, 1, "x", true), granted(1), g("x", A, 1, 1)),
			one(acq(B, 1, "x", true), queued),
			{cmds: []Command{rel(A, 1), rel(A, 1)}, want: []Result{okTok(1), okTok(1)}, grants: []Grant{g("x", B, 1, 2)}},
			{cmds: []Command{cancel(B, 1), cancel(B, 1)}, want: []Result{released(2), released(2)}},
			{cmds: []Command{closeS(C), closeS(C), expire(B), expire(B)}, want: []Result{ok, noSession, ok, noSession}},
		}},
		{name: "TryLock on a held key", steps: []step{
			one(acq(A, 1, "x", false), granted(1), g("x", A, 1, 1)),
			one(acq(B, 1, "x", false), locked),
			one(acq(A, 2, "x", false), locked),
			one(rel(B, 1), notHeld),
			one(cancel(B, 1), cancelled),
			one(rel(A, 1), okTok(1)),
			one(acq(B, 2, "x", false), granted(2), g("x", B, 2, 2)),
		}, check: func(t *testing.T, s *State) {
			if info, _ := s.Request(B, 1); info.State != ReqRejected {
				t.Errorf("B/1 = %+v", info)
			}
		}},
		{name: "TryLock refused while others queue", steps: []step{
			one(acq(A, 1, "x", true), granted(1), g("x", A, 1, 1)),
			one(acq(B, 1, "x", true), queued),
			one(acq(C, 1, "x", false), locked),
		}},
		{name: "FIFO hand-off order", steps: []step{
			one(acq(A, 1, "x", true), granted(1), g("x", A, 1, 1)),
			one(acq(B, 1, "x", true), queued),
			one(acq(C, 1, "x", true), queued),
			one(acq(A, 2, "x", true), queued),
			one(acq(B, 2, "x", true), queued),
			one(cancel(A, 2), cancelled),
			one(rel(A, 1), okTok(1), g("x", B, 1, 2)),
			one(rel(B, 1), okTok(2), g("x", C, 1, 3)),
			one(rel(C, 1), okTok(3), g("x", B, 2, 4)),
		}, check: func(t *testing.T, s *State) {
			info, _ := s.Key("x")
			if len(info.Holders) != 1 || info.Holders[0].Session != B || len(info.Waiters) != 0 {
				t.Errorf("Key = %+v", info)
			}
		}},
		{name: "waiters listed in FIFO order", steps: []step{
			one(acq(A, 1, "x", true), granted(1), g("x", A, 1, 1)),
			one(acq(C, 4, "x", true), queued),
			one(acq(B, 3, "x", true), queued),
		}, check: func(t *testing.T, s *State) {
			info, _ := s.Key("x")
			want := []Holder{{Session: C, Req: 4, Owner: "nc", Permits: 1}, {Session: B, Req: 3, Owner: "nb", Permits: 1}}
			if !reflect.DeepEqual(info.Waiters, want) {
				t.Errorf("Waiters = %+v, want %+v", info.Waiters, want)
			}
		}},
		{name: "semaphore limit 2", steps: []step{
			one(sem(A, 1, "s", 2), granted(1), g("s", A, 1, 1)),
			one(sem(A, 2, "s", 2), granted(2), g("s", A, 2, 2)),
			one(sem(B, 1, "s", 2), queued),
			one(sem(C, 1, "s", 2), queued),
			one(Command{Op: OpAcquire, Session: C, Req: 2, Key: "s", Limit: 2}, locked),
			// Ending A frees two slots: both waiters granted in this entry, in FIFO order.
			one(expire(A), ok, g("s", B, 1, 3), g("s", C, 1, 4)),
			one(sem(A, 9, "s", 2), noSession),
			{cmds: []Command{rel(B, 1), rel(C, 1), sem(B, 2, "s", 2)}, want: []Result{okTok(3), okTok(4), granted(5)}, grants: []Grant{g("s", B, 2, 5)}},
		}},
		{name: "semaphore releases in one entry hand off in order", steps: []step{
			one(sem(A, 1, "s", 3), granted(1), g("s", A, 1, 1)),
			one(sem(B, 1, "s", 3), granted(2), g("s", B, 1, 2)),
			one(sem(C, 1, "s", 3), granted(3), g("s", C, 1, 3)),
			one(sem(A, 2, "s", 3), queued),
			one(sem(B, 2, "s", 3), queued),
			{cmds: []Command{rel(C, 1), rel(B, 1)}, want: []Result{okTok(3), okTok(2)}, grants: []Grant{g("s", A, 2, 4), g("s", B, 2, 5)}},
		}},
		{name: "limit mismatch", steps: []step{
			one(acq(A, 1, "x", true), granted(1), g("x", A, 1, 1)),
			one(sem(B, 1, "x", 2), bad),
			one(sem(B, 2, "x", 1), queued), // 1 == default
			one(Command{Op: OpAcquire, Session: C, Req: 1, Key: "x", Wait: true, Limit: 0}, queued),
			one(sem(A, 1, "x", 5), granted(1)), // dedup answers before the limit check
			one(rel(A, 1), okTok(1), g("x", B, 2, 2)),
			one(rel(B, 2), okTok(2), g("x", C, 1, 3)),
			one(rel(C, 1), okTok(3)),
			one(sem(B, 3, "x", 2), granted(4), g("x", B, 3, 4)), // a deleted key takes any limit
		}},
		{name: "bad keys and ids", steps: []step{
			one(acq(A, 1, "", true), bad),
			one(acq(A, 2, long+"k", true), bad),
			one(acq(A, 3, long, true), granted(1), g(long, A, 3, 1)),
			one(acq(A, 0, "x", true), bad),
			one(acq(9, 1, "x", true), noSession),
			one(acq(0, 1, "x", true), noSession),
		}},
		{name: "unknown ops", steps: []step{
			one(Command{Op: 0, Session: A}, bad),
			one(Command{Op: 7, Session: A}, bad),
			one(Command{Op: 255, Session: A, Key: "x"}, bad),
		}},
		{name: "ack prunes terminal attempts only", steps: []step{
			one(acq(B, 1, "x", true), granted(1), g("x", B, 1, 1)),
			one(acq(A, 1, "x", false), locked), // rejected
			one(acq(A, 2, "y", true), granted(2), g("y", A, 2, 2)),
			one(Command{Op: OpRelease, Session: A, Req: 4, Target: 2}, okTok(2)), // released, touched by req 4
			one(acq(A, 3, "x", true), queued),                                    // live
			one(acq(A, 5, "z", true), granted(3), g("z", A, 5, 3)),               // live
			one(Command{Op: OpAcquire, Session: A, Req: 6, Ack: 4, Key: "w"}, granted(4), g("w", A, 6, 4)),
		}, check: func(t *testing.T, s *State) {
			for req, want := range map[uint64]bool{1: false, 2: true, 3: true, 5: true, 6: true} {
				if info, _ := s.Request(A, req); info.Found != want {
					t.Errorf("A/%d found=%v, want %v (%+v)", req, info.Found, want, info)
				}
			}
		}},
		{name: "ack at every command; pruned ids cannot come back", steps: []step{
			one(acq(A, 1, "x", true), granted(1), g("x", A, 1, 1)),
			one(Command{Op: OpRelease, Session: A, Req: 2, Target: 1}, okTok(1)),
			one(Command{Op: OpCancel, Session: A, Req: 3, Ack: 3, Target: 99}, cancelled),
			one(acq(A, 1, "x", true), bad), // below the Ack and forgotten
			one(rel(A, 1), notHeld),
			one(Command{Op: OpCancel, Session: A, Ack: 200, Target: 100}, cancelled),
			one(Command{Op: OpAcquire, Session: A, Req: 100, Key: "x", Wait: true}, bad), // no tombstone below the Ack
		}, check: func(t *testing.T, s *State) {
			if st := s.Stats(); st.Attempts != 0 {
				t.Errorf("Stats = %+v, want no attempts left", st)
			}
		}},
		{name: "open session rules", steps: []step{
			one(Command{Op: OpOpenSession, Owner: "n", TTLMillis: 0}, bad),
			one(Command{Op: OpOpenSession, Owner: strings.Repeat("o", MaxOwnerLen+1), TTLMillis: 10}, bad),
			{cmds: []Command{
				{Op: OpOpenSession, Owner: "p", TTLMillis: 10},
				{Op: OpOpenSession, TTLMillis: 0},
				{Op: OpOpenSession, Owner: "q", TTLMillis: 20},
				{Op: OpOpenSession, Owner: "r", TTLMillis: 30},
			}, want: []Result{
				{Status: StatusOK, Session: 6},
				bad,
				{Status: StatusOK, Session: 1<<63 | 6<<12 | 2},
				{Status: StatusOK, Session: 1<<63 | 6<<12 | 3},
			}},
			one(Command{Op: OpAcquire, Session: 1<<63 | 6<<12 | 2, Req: 1, Key: "x"}, granted(1),
				Grant{Key: "x", Session: 1<<63 | 6<<12 | 2, Req: 1, Token: 1, Owner: "q"}),
		}, check: func(t *testing.T, s *State) {
			if si, ok := s.Session(6); !ok || si.Owner != "p" || si.TTLMillis != 10 {
				t.Errorf("Session(6) = %+v, %v", si, ok)
			}
			if n := len(s.Sessions()); n != 6 {
				t.Errorf("%d sessions, want 6", n)
			}
		}},
		{name: "duplicate open session opens another session", steps: []step{
			one(Command{Op: OpOpenSession, Owner: "p", TTLMillis: 10}, Result{Status: StatusOK, Session: 4}),
			one(Command{Op: OpOpenSession, Owner: "p", TTLMillis: 10}, Result{Status: StatusOK, Session: 5}),
		}},
	}
	cases = append(cases, termCases...)
	runTable(t, cases)
}

func TestApplyIndexMustIncrease(t *testing.T) {
	s := New()
	s.Apply(5, []Command{{Op: OpOpenSession, Owner: "n", TTLMillis: 1}})
	before := snapshot(t, s)
	for _, idx := range []uint64{5, 4, 0} {
		rs, gs := s.Apply(idx, []Command{acq(5, 1, "x", true), {Op: OpOpenSession, TTLMillis: 1}})
		if len(rs) != 2 || rs[0].Status != StatusInvalid || rs[1].Status != StatusInvalid || gs != nil {
			t.Errorf("Apply(%d) = %+v %+v", idx, rs, gs)
		}
	}
	if !slices.Equal(before, snapshot(t, s)) || s.Index() != 5 {
		t.Errorf("state changed by a stale index")
	}
	if rs, _ := s.Apply(6, nil); len(rs) != 0 || s.Index() != 6 {
		t.Errorf("empty entry: %+v index %d", rs, s.Index())
	}
}

func TestValidateKey(t *testing.T) {
	for key, want := range map[string]bool{"": false, "a": true, strings.Repeat("x", MaxKeyLen): true, strings.Repeat("x", MaxKeyLen+1): false, "\x00\xff": true} {
		if err := ValidateKey(key); (err == nil) != want {
			t.Errorf("ValidateKey(%d bytes) = %v", len(key), err)
		}
	}
}

// termCases are the rules of the term fence (docs/SAFETY.md, rule 0): an
// ExpireSession applies only in the leader term the state has recorded,
// and recorded terms only grow.
var termCases = []tcase{
	{name: "expiry in the recorded term ends the session and hands off", steps: []step{
		one(acq(A, 1, "x", true), granted(1), g("x", A, 1, 1)),
		one(acq(B, 1, "x", true), queued),
		one(leaderTerm(4), ok),
		one(expireIn(A, 4), ok, g("x", B, 1, 2)),
		one(expireIn(A, 4), noSession),
	}},
	{name: "expiry decided in an ended term is refused", steps: []step{
		one(acq(A, 1, "x", true), granted(1), g("x", A, 1, 1)),
		one(acq(B, 1, "x", true), queued),
		one(leaderTerm(4), ok),
		one(leaderTerm(5), ok), // the successor took over
		one(expireIn(A, 4), staleTerm),
		one(expire(A), staleTerm), // term 0: from before any term was recorded
		one(rel(A, 1), okTok(1), g("x", B, 1, 2)),
	}, check: func(t *testing.T, s *State) {
		if s.Term() != 5 {
			t.Errorf("Term() = %d, want 5", s.Term())
		}
	}},
	{name: "expiry from a term not yet recorded is refused", steps: []step{
		one(acq(A, 1, "x", true), granted(1), g("x", A, 1, 1)),
		one(leaderTerm(4), ok),
		one(expireIn(A, 5), staleTerm),
		one(leaderTerm(5), ok),
		one(expireIn(A, 5), ok),
	}},
	{name: "a refused expiry in a batch leaves the other commands alone", steps: []step{
		one(leaderTerm(2), ok),
		one(acq(A, 1, "x", true), granted(1), g("x", A, 1, 1)),
		{cmds: []Command{expireIn(A, 1), acq(B, 1, "x", false), expireIn(A, 2), acq(C, 1, "x", false)},
			want:   []Result{staleTerm, locked, ok, granted(2)},
			grants: []Grant{g("x", C, 1, 2)}},
	}},
	{name: "recorded terms only grow", steps: []step{
		one(leaderTerm(7), ok),
		one(leaderTerm(7), ok), // a retried LeaderTerm
		one(leaderTerm(6), staleTerm),
		one(leaderTerm(0), bad),
	}, check: func(t *testing.T, s *State) {
		if s.Term() != 7 {
			t.Errorf("Term() = %d, want 7", s.Term())
		}
	}},
	{name: "no expiry is refused before any term is recorded (logs of version 1)", steps: []step{
		one(acq(A, 1, "x", true), granted(1), g("x", A, 1, 1)),
		one(expire(A), ok),
	}},
}

// The recorded term survives a snapshot: a replica restored from one must
// refuse the same stale expiries as one that applied the whole log.
func TestSnapshotKeepsTerm(t *testing.T) {
	s := New()
	s.Apply(1, []Command{{Op: OpOpenSession, Owner: "n", TTLMillis: 1000}})
	s.Apply(2, []Command{leaderTerm(9)})
	r := New()
	if err := r.Load(bytes.NewReader(snapshot(t, s))); err != nil {
		t.Fatal(err)
	}
	if r.Term() != 9 {
		t.Fatalf("restored Term() = %d, want 9", r.Term())
	}
	rs, _ := r.Apply(3, []Command{expireIn(1, 8)})
	if rs[0].Status != StatusStaleTerm {
		t.Fatalf("restored state applied an expiry of term 8: %+v", rs[0])
	}
	// A version 1 snapshot ([index, lastToken, sessions, keys]) loads with term 0.
	v1 := []byte{1, 0x94, 0x05, 0x03, 0x90, 0x90}
	if err := r.Load(bytes.NewReader(v1)); err != nil {
		t.Fatalf("version 1 snapshot: %v", err)
	}
	if r.Term() != 0 || r.Index() != 5 || r.Stats().NextToken != 4 {
		t.Fatalf("version 1 snapshot loaded as term %d index %d stats %+v", r.Term(), r.Index(), r.Stats())
	}
}

// A session's label is kept in the state, answered by queries and carried
// by snapshots of format 3. Format 2, what a cluster below level 3 writes,
// has no place for it: a state with a label refuses it rather than drop
// the label, and MinSnapshotFormat says so first. A format 2 snapshot
// loads with no labels.
func TestSnapshotFormatsAndLabels(t *testing.T) {
	s := New()
	s.Apply(1, []Command{{Op: OpOpenSession, Owner: "n", TTLMillis: 1000}})
	s.Apply(2, []Command{{Op: OpAcquire, Session: 1, Req: 1, Key: "x"}})
	if got := s.MinSnapshotFormat(); got != 2 {
		t.Fatalf("MinSnapshotFormat without labels = %d, want 2", got)
	}
	for _, format := range []byte{2, 3} {
		var buf bytes.Buffer
		if err := s.SaveFormat(&buf, format); err != nil || buf.Bytes()[0] != format {
			t.Fatalf("SaveFormat(%d): %v", format, err)
		}
		r := New()
		if err := r.Load(&buf); err != nil {
			t.Fatalf("Load of format %d: %v", format, err)
		}
		if !bytes.Equal(snapshot(t, r), snapshot(t, s)) {
			t.Fatalf("format %d did not round-trip", format)
		}
	}

	s.Apply(3, []Command{{Op: OpOpenSession, Owner: "m", TTLMillis: 1000, Label: 0xfeed}})
	s.Apply(4, []Command{{Op: OpAcquire, Session: 3, Req: 1, Key: "x", Wait: true}})
	if got := s.MinSnapshotFormat(); got != 3 {
		t.Fatalf("MinSnapshotFormat with a label = %d, want 3", got)
	}
	var buf bytes.Buffer
	if err := s.SaveFormat(&buf, 2); !errors.Is(err, ErrVersion) || buf.Len() != 0 || !strings.Contains(err.Error(), "label") {
		t.Fatalf("SaveFormat(2) of a labelled state: %v, %d bytes; want ErrVersion naming the labels and nothing written", err, buf.Len())
	}
	r := New()
	if err := r.Load(bytes.NewReader(snapshot(t, s))); err != nil {
		t.Fatal(err)
	}
	info, _ := r.Key("x")
	if len(info.Waiters) != 1 || info.Waiters[0].Label != 0xfeed || info.Holders[0].Label != 0 {
		t.Fatalf("restored Key(x) = %+v, want the waiter labelled 0xfeed and the holder unlabelled", info)
	}
	if si, ok := r.Session(3); !ok || si.Label != 0xfeed {
		t.Fatalf("restored Session(3) = %+v, %v", si, ok)
	}
	// Once the labelled session ends, format 2 can hold the state again.
	r.Apply(5, []Command{{Op: OpCloseSession, Session: 3}})
	if got := r.MinSnapshotFormat(); got != 2 {
		t.Fatalf("MinSnapshotFormat after the labelled session closed = %d, want 2", got)
	}
}
