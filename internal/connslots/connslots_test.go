package connslots

import (
	"strings"
	"testing"
)

// conn is a connection's stand-in: its name, closed by nobody here.
type conn string

func (conn) Close() error { return nil }

// admit admits name from ip and returns its slot and the name of the
// connection pushed out ("" for none).
func admit(t *testing.T, tb *Table, ip, name string) (*Slot, string) {
	t.Helper()
	s, pushed, why := tb.Admit(ip, conn(name))
	if (pushed == nil) != (why == "") {
		t.Fatalf("admit %s: pushed %v but why %q", name, pushed, why)
	}
	if pushed == nil {
		return s, ""
	}
	return s, string(pushed.(conn))
}

func wantCounts(t *testing.T, tb *Table, unproven, members, strangers int) {
	t.Helper()
	u, m, s := tb.Counts()
	if u != unproven || m != members || s != strangers {
		t.Fatalf("counts unproven %d members %d strangers %d, want %d %d %d", u, m, s, unproven, members, strangers)
	}
}

// Rule 1: a new connection is never refused; the oldest unproven one of
// its IP makes room, else the oldest unproven one of all.
func TestUnprovenPushOutOldest(t *testing.T) {
	tb := New(Limits{MaxConns: 10, MaxUnproven: 4, MaxPerIP: 2})
	steps := []struct{ ip, name, pushed string }{
		{"a", "a1", ""},
		{"a", "a2", ""},
		{"a", "a3", "a1"}, // a's share is full: its own oldest goes
		{"b", "b1", ""},
		{"b", "b2", ""},
		{"c", "c1", "a2"}, // all 4 taken: the oldest of all goes
		{"c", "c2", "a3"},
		{"a", "a4", "b1"},
	}
	for _, st := range steps {
		if _, pushed := admit(t, tb, st.ip, st.name); pushed != st.pushed {
			t.Fatalf("admit %s: pushed out %q, want %q", st.name, pushed, st.pushed)
		}
	}
	wantCounts(t, tb, 4, 0, 0)
}

// A connection pushed out is Gone: its proof is refused, its release
// changes nothing.
func TestPushedOutCountsNoMore(t *testing.T) {
	tb := New(Limits{MaxConns: 10, MaxUnproven: 1, MaxPerIP: 1})
	old, _ := admit(t, tb, "a", "old")
	if _, pushed := admit(t, tb, "b", "new"); pushed != "old" {
		t.Fatalf("pushed out %q, want old", pushed)
	}
	if c := tb.Class(old); c != Gone {
		t.Fatalf("pushed-out slot is %v, want Gone", c)
	}
	if why := tb.Prove(old, true); !strings.Contains(why, "pushed out") {
		t.Fatalf("proof of a pushed-out connection: %q", why)
	}
	tb.Release(old)
	tb.Release(old)
	wantCounts(t, tb, 1, 0, 0)
}

// Rules 2 and 3: strangers never take the reserved slots nor more than
// their IP's share; members are refused only over MaxConns.
func TestProveReservesForMembers(t *testing.T) {
	tb := New(Limits{MaxConns: 5, Reserved: 2, MaxUnproven: 100, MaxPerIP: 2})
	prove := func(ip string, member bool) string {
		s, _ := admit(t, tb, ip, ip)
		return tb.Prove(s, member)
	}
	for i, c := range []struct {
		ip     string
		member bool
		refuse string // in the refusal; "" for kept
	}{
		{"a", false, ""},
		{"a", false, ""},
		{"a", false, "from a (MaxConnsPerIP)"},
		{"b", false, ""},
		{"c", false, "reserved for members"}, // 3 strangers: MaxConns 5 less 2
		{"a", true, ""},                      // members' IPs are not capped
		{"a", true, ""},
		{"d", true, "(MaxConns)"},
	} {
		why := prove(c.ip, c.member)
		if (c.refuse == "") != (why == "") || !strings.Contains(why, c.refuse) {
			t.Fatalf("proof %d (%s, member %v): %q, want %q", i, c.ip, c.member, why, c.refuse)
		}
	}
	wantCounts(t, tb, 0, 2, 3)
}

// Every slot released, whatever its class, leaves the Table empty, and
// the freed room is used again.
func TestReleaseFreesEverything(t *testing.T) {
	tb := New(Limits{MaxConns: 2, MaxUnproven: 2, MaxPerIP: 2})
	u, _ := admit(t, tb, "a", "u")
	m, _ := admit(t, tb, "a", "m")
	if why := tb.Prove(m, true); why != "" {
		t.Fatal(why)
	}
	s, _ := admit(t, tb, "a", "s")
	if why := tb.Prove(s, false); why != "" {
		t.Fatal(why)
	}
	x, _ := admit(t, tb, "a", "x")
	if why := tb.Prove(x, true); !strings.Contains(why, "MaxConns") {
		t.Fatalf("member over MaxConns: %q", why)
	}
	for _, sl := range []*Slot{u, m, s, x} {
		tb.Release(sl)
	}
	wantCounts(t, tb, 0, 0, 0)
	if len(tb.unprovenByIP) != 0 || len(tb.strangersByIP) != 0 {
		t.Fatalf("per-IP counts left: %v %v", tb.unprovenByIP, tb.strangersByIP)
	}
	y, _ := admit(t, tb, "a", "y")
	if why := tb.Prove(y, false); why != "" {
		t.Fatalf("stranger after every slot was freed: %q", why)
	}
}
