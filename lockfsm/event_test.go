package lockfsm

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// An entry's events say what it changed, in order: a release before the
// grant it hands the key on to, an expiry as an expiry, a waiter that
// leaves as cancelled, a value as the holder's.
func TestEventsSayWhatEachEntryChanged(t *testing.T) {
	c := newChecker()
	describe := func(es []Event) string {
		var b strings.Builder
		for _, e := range es {
			fmt.Fprintf(&b, "%v %s %d/%d t%d %q; ", e.Kind, e.Key, e.Session, e.Req, e.Token, e.Value)
		}
		return b.String()
	}
	step := func(want string, cmds ...Command) {
		t.Helper()
		_, _, es, err := c.applyEvents(cmds...)
		if err != nil {
			t.Fatal(err)
		}
		if got := describe(es); got != want {
			t.Fatalf("events of %v:\n got %s\nwant %s", cmds[0].Op, got, want)
		}
	}
	step("", Command{Op: OpOpenSession, Owner: "na", TTLMillis: 5000})
	step("", Command{Op: OpOpenSession, Owner: "nb", TTLMillis: 5000})
	step("", Command{Op: OpOpenSession, Owner: "nc", TTLMillis: 5000})
	step(`granted k 1/1 t1 "a"; `, Command{Op: OpAcquire, Session: 1, Req: 1, Key: "k", Value: []byte("a")})
	step(`queued k 2/1 t0 "b"; queued k 3/1 t0 ""; `,
		Command{Op: OpAcquire, Session: 2, Req: 1, Key: "k", Wait: true, Value: []byte("b")},
		Command{Op: OpAcquire, Session: 3, Req: 1, Key: "k", Wait: true})
	step(`value k 1/1 t1 "a2"; `, Command{Op: OpSetValue, Session: 1, Req: 2, Target: 1, Value: []byte("a2")})
	step("", Command{Op: OpAcquire, Session: 3, Req: 2, Key: "k"}) // a refused TryLock changes nothing
	step(`released k 1/1 t1 ""; granted k 2/1 t2 "b"; `, Command{Op: OpRelease, Session: 1, Req: 3, Target: 1})
	step(`cancelled k 3/1 t0 ""; `, Command{Op: OpCancel, Session: 3, Req: 3, Target: 1})
	step("", Command{Op: OpLeaderTerm, Term: 4})
	step(`expired k 2/1 t2 ""; `, Command{Op: OpExpireSession, Session: 2, Term: 4})
}

// A prioritized wait goes ahead of the waiters of lower priority that are
// neither deadlock-checked nor in a group, FIFO among equals; it is
// granted at once if it reaches the head and can be; with FlagDeadlock it
// is refused.
func TestPriorityOrdersTheQueue(t *testing.T) {
	c := newChecker()
	open := func(owner string) uint64 {
		rs, _, err := c.apply(Command{Op: OpOpenSession, Owner: owner, TTLMillis: 5000})
		if err != nil {
			t.Fatal(err)
		}
		return rs[0].Session
	}
	h, a, b, cc, p, q := open("h"), open("a"), open("b"), open("c"), open("p"), open("q")
	acq := func(sess uint64, prio uint8, flags Flags) Result {
		t.Helper()
		rs, _, err := c.apply(Command{Op: OpAcquire, Session: sess, Req: 1, Key: "k", Wait: true, Priority: prio, Flags: flags})
		if err != nil {
			t.Fatal(err)
		}
		return rs[0]
	}
	acq(h, 0, 0)
	acq(a, 0, 0)
	acq(b, 0, FlagDeadlock)
	acq(cc, 0, 0)
	acq(p, 2, 0) // passes c, stops at b (deadlock-checked)
	acq(q, 1, 0) // passes c, stops at p (higher)
	info, _ := c.s.Key("k")
	var order []uint64
	for _, w := range info.Waiters {
		order = append(order, w.Session)
	}
	if want := []uint64{a, b, p, q, cc}; !slices.Equal(order, want) {
		t.Fatalf("queue %v, want %v (a b p q c)", order, want)
	}
	if r := acq(open("r"), 1, FlagDeadlock); r.Status != StatusInvalid {
		t.Fatalf("a prioritized deadlock-checked wait: %v, want Invalid", r.Status)
	}
	// A reader with priority that reaches the head of a read/write key
	// held by readers is granted at once.
	c.apply(Command{Op: OpAcquire, Session: h, Req: 2, Key: "rw", Kind: KindRead})
	c.apply(Command{Op: OpAcquire, Session: a, Req: 2, Key: "rw", Kind: KindWrite, Wait: true})
	rs, _, err := c.apply(Command{Op: OpAcquire, Session: p, Req: 2, Key: "rw", Kind: KindRead, Wait: true, Priority: 1})
	if err != nil || rs[0].Status != StatusGranted {
		t.Fatalf("a prioritized reader ahead of a waiting writer: %+v %v, want Granted", rs, err)
	}
}
