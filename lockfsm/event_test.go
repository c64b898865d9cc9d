package lockfsm

import (
	"fmt"
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
