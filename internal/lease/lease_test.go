package lease

import (
	"errors"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/lockfsm"
)

// The tests drive the table with made-up times: no clock is read and
// nothing sleeps.

const (
	electionTimeout = 500 * time.Millisecond
	grace           = 2 * electionTimeout
	ttl             = 10 * time.Second
	shard           = uint64(7)
	self            = uint64(1) // this peer's replica of shard
	other           = uint64(2)
	nano            = time.Nanosecond
)

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

func session(id uint64, ttl time.Duration) lockfsm.SessionInfo {
	return lockfsm.SessionInfo{ID: id, Owner: "peer", TTLMillis: uint64(ttl / time.Millisecond)}
}

// state is what a replica that recorded term reports with sessions 1..n,
// each with the default TTL.
func state(term uint64, n int) State {
	st := State{Term: term}
	for id := 1; id <= n; id++ {
		st.Sessions = append(st.Sessions, session(uint64(id), ttl))
	}
	return st
}

// elected returns a table of a peer elected leader of shard in term at
// time e.
func elected(t *testing.T, term uint64, e time.Time) *Table {
	t.Helper()
	tb := New(Options{ElectionTimeout: electionTimeout})
	if !tb.LeaderChanged(shard, self, self, term, e) {
		t.Fatal("LeaderChanged to this replica did not report an election")
	}
	return tb
}

func ids(ss []lockfsm.SessionInfo) []uint64 {
	var out []uint64
	for _, s := range ss {
		out = append(out, s.ID)
	}
	return out
}

func wantLapsed(t *testing.T, tb *Table, st State, now time.Time, want ...uint64) Expiry {
	t.Helper()
	d := tb.Lapsed(shard, st, now)
	if d.RecordTerm {
		t.Fatalf("at %v: asked to record term %d, want expiries %v", now.Sub(t0), d.Term, want)
	}
	if got := ids(d.Sessions); !slices.Equal(got, want) {
		t.Fatalf("at %v: lapsed %v, want %v", now.Sub(t0), got, want)
	}
	return d
}

func wantAck(t *testing.T, tb *Table, term uint64, st State, sessions []uint64, received time.Time, wantAcked, wantLost []uint64) {
	t.Helper()
	acked, lost, err := tb.Ack(shard, term, st, sessions, received)
	if err != nil {
		t.Fatalf("Ack at %v: %v", received.Sub(t0), err)
	}
	if !slices.Equal(acked, wantAcked) || !slices.Equal(lost, wantLost) {
		t.Fatalf("Ack at %v: acked %v lost %v, want acked %v lost %v", received.Sub(t0), acked, lost, wantAcked, wantLost)
	}
}

// Rule 0: a leader acknowledges nothing and expires nothing before the
// state has recorded its term, and proposes that record one at a time.
func TestRule0NothingBeforeTermIsRecorded(t *testing.T) {
	tb := elected(t, 5, t0)
	old := state(4, 2) // the replica has recorded only the previous term
	late := at(grace + 10*ttl)

	acked, lost, err := tb.Ack(shard, 5, old, []uint64{1, 2}, late)
	if !errors.Is(err, ErrTermNotRecorded) || acked != nil || lost != nil {
		t.Fatalf("Ack before the term is recorded: acked %v lost %v err %v, want ErrTermNotRecorded and nothing", acked, lost, err)
	}
	d := tb.Lapsed(shard, old, late)
	if !d.RecordTerm || d.Term != 5 || d.Sessions != nil {
		t.Fatalf("Lapsed before the term is recorded: %+v, want RecordTerm of term 5 and no expiry", d)
	}
	if d := tb.Lapsed(shard, old, late); d.RecordTerm || d.Sessions != nil {
		t.Fatalf("Lapsed while LeaderTerm is in flight: %+v, want nothing", d)
	}
	tb.RecordingDone(shard, 4) // another term's attempt: no effect
	if d := tb.Lapsed(shard, old, late); d.RecordTerm {
		t.Fatal("RecordingDone of another term ended this term's attempt")
	}
	tb.RecordingDone(shard, 5) // the attempt failed: asked again
	if d := tb.Lapsed(shard, old, late); !d.RecordTerm || d.Term != 5 {
		t.Fatalf("Lapsed after a failed LeaderTerm: %+v, want RecordTerm of term 5", d)
	}
}

// Rule 0: an expiry is decided only once the term is recorded, and
// carries the term of the leader that decided it.
func TestRule0ExpiryCarriesTheLeadersTerm(t *testing.T) {
	tb := elected(t, 5, t0)
	tb.Lapsed(shard, state(4, 1), at(0))
	tb.RecordingDone(shard, 5)
	wantLapsed(t, tb, state(5, 1), at(time.Second)) // recorded: timers start
	d := wantLapsed(t, tb, state(5, 1), at(grace+ttl+nano), 1)
	if d.Term != 5 {
		t.Fatalf("expiry decided in term 5 carries term %d", d.Term)
	}
}

// Rule 0: a state that has recorded a later term than this leader's means
// a newer leader exists: nothing is acknowledged, expired or recorded.
func TestRule0LaterRecordedTermDecidesNothing(t *testing.T) {
	tb := elected(t, 5, t0)
	newer := state(6, 1)
	late := at(grace + 10*ttl)
	if acked, _, err := tb.Ack(shard, 5, newer, []uint64{1}, late); !errors.Is(err, ErrNotLeader) || acked != nil {
		t.Fatalf("Ack in term 5 against a state of term 6: acked %v err %v, want ErrNotLeader", acked, err)
	}
	if d := tb.Lapsed(shard, newer, late); d.RecordTerm || d.Sessions != nil {
		t.Fatalf("Lapsed in term 5 against a state of term 6: %+v, want nothing", d)
	}
}

// Rule 1: the caller confirms leadership after the keepalive arrived; the
// table counts the session's TTL from when it arrived, not from when the
// confirmation ended, and never moves a timer back.
func TestRule1AckCountsFromReceipt(t *testing.T) {
	tb := elected(t, 5, t0)
	st := state(5, 1)
	r := at(grace + time.Second) // after the grace: the receipt alone sets the timer
	wantAck(t, tb, 5, st, []uint64{1}, r, []uint64{1}, nil)
	// A slower keepalive sent earlier, confirmed after the one above.
	wantAck(t, tb, 5, st, []uint64{1}, r.Add(-time.Second), []uint64{1}, nil)
	wantLapsed(t, tb, st, r.Add(ttl))
	wantLapsed(t, tb, st, r.Add(ttl+nano), 1)
}

// Rule 1 is the caller's ReadIndex; the table acknowledges only in a term
// it has this peer leading. A confirmation that comes after Raft reported
// the leadership lost (or before it reported the election: then the term
// cannot be recorded yet either) acknowledges nothing and does not bring
// the leadership back.
func TestAckOnlyInATermTheTableLeads(t *testing.T) {
	refused := func(t *testing.T, tb *Table, term uint64) {
		t.Helper()
		acked, lost, err := tb.Ack(shard, term, state(term, 1), []uint64{1}, at(time.Hour))
		if !errors.Is(err, ErrNotLeader) || acked != nil || lost != nil {
			t.Fatalf("Ack in term %d: acked %v lost %v err %v, want ErrNotLeader", term, acked, lost, err)
		}
	}
	t.Run("no event yet", func(t *testing.T) {
		tb := New(Options{ElectionTimeout: electionTimeout})
		refused(t, tb, 5)
		if tb.IsLeader(shard) {
			t.Fatal("a refused Ack made the table lead the shard")
		}
	})
	for _, c := range []struct {
		name           string
		leader, term   uint64
		stillLeadsTerm uint64 // 0: leads nothing
	}{
		{"lost quorum in the same term", 0, 5, 0},
		{"another leader elected", other, 6, 0},
		{"re-elected in a later term", self, 6, 6},
	} {
		t.Run(c.name, func(t *testing.T) {
			tb := elected(t, 5, t0)
			tb.LeaderChanged(shard, self, c.leader, c.term, at(time.Minute))
			refused(t, tb, 5)
			since, leads := tb.LeaderSince(shard)
			if leads != (c.stillLeadsTerm != 0) || tb.IsLeader(shard) != leads {
				t.Fatalf("after a stale Ack: LeaderSince %v, IsLeader %v; want leading %v", leads, tb.IsLeader(shard), c.stillLeadsTerm != 0)
			}
			if leads && !since.Equal(at(time.Minute)) {
				t.Fatalf("a stale Ack restarted the term-%d state at %v", c.stillLeadsTerm, since.Sub(t0))
			}
		})
	}
}

// Rule 2: a new leader starts every session's timer at its election plus
// the grace; a session is lapsed once silent for more than its TTL from
// there (exactly TTL is not yet lapsed).
func TestRule2NewLeaderStartsTimersAfterGrace(t *testing.T) {
	if g := New(Options{ElectionTimeout: electionTimeout}).Grace(); g != 2*electionTimeout {
		t.Fatalf("Grace = %v, want two election timeouts (%v)", g, 2*electionTimeout)
	}
	e := at(time.Minute)
	tb := elected(t, 5, e)
	st := state(5, 2)
	wantLapsed(t, tb, st, e)                     // first sight: timers at e+grace
	wantLapsed(t, tb, st, e.Add(grace+ttl-nano)) // less than TTL+grace
	wantLapsed(t, tb, st, e.Add(grace+ttl))      // exactly TTL+grace
	wantLapsed(t, tb, st, e.Add(grace+ttl+nano), 1, 2)
}

// Rule 2: a keepalive acknowledged inside the grace, before the expiry
// loop first looked at the session, does not shorten the grace.
func TestRule2AckInsideTheGraceKeepsIt(t *testing.T) {
	e := at(time.Minute)
	tb := elected(t, 5, e)
	st := state(5, 1)
	wantAck(t, tb, 5, st, []uint64{1}, e.Add(time.Millisecond), []uint64{1}, nil)
	wantLapsed(t, tb, st, e.Add(time.Millisecond+ttl+nano))
	wantLapsed(t, tb, st, e.Add(grace+ttl))
	wantLapsed(t, tb, st, e.Add(grace+ttl+nano), 1)
}

// Rule 2: a session the leader first sees after its grace (opened since,
// or the first tick came late) gets a full TTL from that sight.
func TestRule2SessionFirstSeenLateGetsAFullTTL(t *testing.T) {
	tb := elected(t, 5, t0)
	first := at(grace + 3*ttl)
	wantLapsed(t, tb, state(5, 1), first)
	wantLapsed(t, tb, state(5, 1), first.Add(ttl))
	wantLapsed(t, tb, state(5, 1), first.Add(ttl+nano), 1)
}

// Rule 3: once a session is expiring it is never acknowledged again, not
// even for a keepalive received before the decision, and it is reported
// for expiry once only.
func TestRule3ExpiringSessionIsNeverAckedAgain(t *testing.T) {
	tb := elected(t, 5, t0)
	st := state(5, 2)
	decided := at(grace + ttl + nano)
	wantLapsed(t, tb, st, t0)
	wantAck(t, tb, 5, st, []uint64{2}, at(grace+time.Second), []uint64{2}, nil)
	wantLapsed(t, tb, st, decided, 1)
	for _, r := range []time.Time{decided.Add(-time.Second), decided, decided.Add(time.Hour)} {
		wantAck(t, tb, 5, st, []uint64{1, 2}, r, []uint64{2}, []uint64{1})
	}
	wantLapsed(t, tb, st, decided.Add(time.Hour+ttl)) // 1 is not reported twice
	wantLapsed(t, tb, st, decided.Add(time.Hour+ttl+nano), 2)
	// The expiries committed: the state no longer lists the sessions.
	gone := state(5, 0)
	wantLapsed(t, tb, gone, decided.Add(2*time.Hour))
	wantAck(t, tb, 5, gone, []uint64{1, 2}, decided.Add(2*time.Hour), nil, []uint64{1, 2})
}

// Losing the leadership, to another replica or to none known, drops the
// shard's state: nothing is decided for it, and a later election starts
// afresh.
func TestLeadershipLossClearsState(t *testing.T) {
	for _, leader := range []uint64{other, 0} {
		tb := elected(t, 5, t0)
		st := state(5, 1)
		wantLapsed(t, tb, st, t0)
		wantLapsed(t, tb, st, at(grace+ttl+nano), 1)
		if tb.LeaderChanged(shard, self, leader, 6, at(grace+ttl+2*nano)) {
			t.Fatalf("leader %d: a change to another leader reported an election", leader)
		}
		if tb.IsLeader(shard) || len(tb.Led()) != 0 {
			t.Fatalf("leader %d: the table still leads shard %d", leader, shard)
		}
		if _, ok := tb.LeaderSince(shard); ok {
			t.Fatalf("leader %d: LeaderSince after losing the leadership", leader)
		}
		if d := tb.Lapsed(shard, state(6, 1), at(time.Hour)); d.RecordTerm || d.Sessions != nil || d.Term != 0 {
			t.Fatalf("leader %d: Lapsed without the leadership: %+v", leader, d)
		}
		e := at(2 * time.Hour)
		if !tb.LeaderChanged(shard, self, self, 7, e) {
			t.Fatalf("leader %d: re-election not reported", leader)
		}
		wantAck(t, tb, 7, state(7, 1), []uint64{1}, e.Add(grace), []uint64{1}, nil) // no longer expiring
		wantLapsed(t, tb, state(7, 1), e.Add(grace+ttl))
		wantLapsed(t, tb, state(7, 1), e.Add(grace+ttl+nano), 1)
	}
}

// A new term of the same leader resets the shard's state; the same term
// reported again does not.
func TestNewTermResetsState(t *testing.T) {
	tb := elected(t, 5, t0)
	st := state(5, 1)
	wantLapsed(t, tb, st, t0)
	wantLapsed(t, tb, st, at(grace+ttl+nano), 1)
	if tb.LeaderChanged(shard, self, self, 5, at(time.Hour)) {
		t.Fatal("the same term reported again restarted the shard's state")
	}
	wantAck(t, tb, 5, st, []uint64{1}, at(time.Hour), nil, []uint64{1})

	e := at(2 * time.Hour)
	if !tb.LeaderChanged(shard, self, self, 6, e) {
		t.Fatal("a new term of this leader not reported as an election")
	}
	if since, ok := tb.LeaderSince(shard); !ok || !since.Equal(e) {
		t.Fatalf("LeaderSince = %v, %v after the new term; want its election", since.Sub(t0), ok)
	}
	st6 := state(6, 1)
	wantAck(t, tb, 6, st6, []uint64{1}, e.Add(grace), []uint64{1}, nil)
	wantLapsed(t, tb, st6, e.Add(grace+ttl))
	wantLapsed(t, tb, st6, e.Add(grace+ttl+nano), 1)
}

// Sessions the keepalive names but the state does not list are lost;
// sessions the state lists but nobody keeps alive lapse on their timers;
// sessions the state drops are forgotten.
func TestSessionsUnknownToTheTableOrTheState(t *testing.T) {
	tb := elected(t, 5, t0)
	st := State{Term: 5, Sessions: []lockfsm.SessionInfo{session(1, ttl), session(3, ttl)}}
	wantAck(t, tb, 5, st, []uint64{1, 2, 3, 4}, at(grace+time.Second), []uint64{1, 3}, []uint64{2, 4})
	// 9 was never named by a keepalive: its timer starts at election + grace.
	st.Sessions = append(st.Sessions, session(9, ttl))
	wantLapsed(t, tb, st, at(grace))
	wantLapsed(t, tb, st, at(grace+ttl+nano), 9)
	// 3 (closed) and 9 (expired) are dropped by the state: the table
	// forgets them, so it holds only live sessions, and reports 3 lost.
	st.Sessions = st.Sessions[:1]
	wantLapsed(t, tb, st, at(grace+ttl+2*nano))
	if sl := tb.shards[shard]; len(sl.lastSeen) != 1 || len(sl.expiring) != 0 {
		t.Fatalf("the table still tracks dropped sessions: lastSeen %v expiring %v", sl.lastSeen, sl.expiring)
	}
	wantAck(t, tb, 5, st, []uint64{1, 3}, at(grace+ttl+3*nano), []uint64{1}, []uint64{3})
}

// Each session lapses on its own TTL, as the state machine recorded it.
func TestPerSessionTTL(t *testing.T) {
	tb := elected(t, 5, t0)
	st := State{Term: 5, Sessions: []lockfsm.SessionInfo{
		session(1, 2*time.Second),
		session(2, 30*time.Second),
		{ID: 3, TTLMillis: math.MaxUint64}, // longer than a Duration
	}}
	wantLapsed(t, tb, st, t0)
	wantLapsed(t, tb, st, at(grace+2*time.Second))
	wantLapsed(t, tb, st, at(grace+2*time.Second+nano), 1)
	wantLapsed(t, tb, st, at(grace+30*time.Second))
	wantLapsed(t, tb, st, at(grace+30*time.Second+nano), 2)
	wantLapsed(t, tb, st, at(100*365*24*time.Hour))
}

// An expiry decided in term T is stamped T. After the leadership passes
// through term T+1 the old decision is not reused: the session is acked
// again (the state machine refuses the T expiry if it commits after
// LeaderTerm(T+1)), gets a fresh timer, and a new expiry is stamped T+1.
func TestExpiryIsFencedByTerm(t *testing.T) {
	tb := elected(t, 5, t0)
	wantLapsed(t, tb, state(5, 1), t0)
	d := wantLapsed(t, tb, state(5, 1), at(grace+ttl+nano), 1)
	if d.Term != 5 {
		t.Fatalf("expiry decided in term 5 carries term %d", d.Term)
	}
	e := at(time.Hour)
	tb.LeaderChanged(shard, self, 0, 6, e.Add(-time.Second)) // lost quorum
	tb.LeaderChanged(shard, self, self, 6, e)
	// The state still has term 5: nothing but recording term 6.
	if d := tb.Lapsed(shard, state(5, 1), e.Add(grace+ttl+nano)); !d.RecordTerm || d.Term != 6 || d.Sessions != nil {
		t.Fatalf("Lapsed in term 6 before it is recorded: %+v", d)
	}
	tb.RecordingDone(shard, 6)
	st := state(6, 1)
	wantAck(t, tb, 6, st, []uint64{1}, e.Add(grace+time.Second), []uint64{1}, nil)
	wantLapsed(t, tb, st, e.Add(grace+time.Second+ttl))
	d = wantLapsed(t, tb, st, e.Add(grace+time.Second+ttl+nano), 1)
	if d.Term != 6 {
		t.Fatalf("expiry decided in term 6 carries term %d", d.Term)
	}
}

// UnsafeExpireAfter (the broken variant the checkers must catch) really
// changes the decision: no grace, and a session lapses after that long
// instead of its TTL.
func TestUnsafeExpireAfterBreaksRule2(t *testing.T) {
	const after = ttl / 4
	safe := elected(t, 5, t0)
	unsafe := New(Options{ElectionTimeout: electionTimeout, UnsafeExpireAfter: after})
	unsafe.LeaderChanged(shard, self, self, 5, t0)
	if g := unsafe.Grace(); g != 0 {
		t.Fatalf("unsafe Grace = %v, want 0", g)
	}
	st := state(5, 1)
	for _, tb := range []*Table{safe, unsafe} {
		wantLapsed(t, tb, st, t0)
	}
	wantLapsed(t, unsafe, st, at(after))
	wantLapsed(t, unsafe, st, at(after+nano), 1)
	wantLapsed(t, safe, st, at(after+nano))
	wantLapsed(t, safe, st, at(grace+ttl+nano), 1)
}

func TestDropForgetsTheShard(t *testing.T) {
	tb := elected(t, 5, t0)
	tb.LeaderChanged(shard+1, self, self, 3, t0)
	tb.Drop(shard)
	if tb.IsLeader(shard) || !slices.Equal(tb.Led(), []uint64{shard + 1}) {
		t.Fatalf("after Drop: IsLeader %v, Led %v", tb.IsLeader(shard), tb.Led())
	}
	if d := tb.Lapsed(shard, state(5, 1), at(time.Hour)); d.Sessions != nil || d.RecordTerm {
		t.Fatalf("Lapsed of a dropped shard: %+v", d)
	}
}

func TestLedIsSorted(t *testing.T) {
	tb := New(Options{ElectionTimeout: electionTimeout})
	for _, s := range []uint64{9, 3, 12, 1} {
		tb.LeaderChanged(s, self, self, 1, t0)
	}
	tb.LeaderChanged(12, self, other, 2, t0)
	if got := tb.Led(); !slices.Equal(got, []uint64{1, 3, 9}) {
		t.Fatalf("Led = %v", got)
	}
}

// The table is used from the keepalive server, the expiry loop and Raft's
// event goroutine at once (run with -race).
func TestConcurrentUse(t *testing.T) {
	tb := New(Options{ElectionTimeout: electionTimeout})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				term := uint64(i/50 + 1)
				now := at(time.Duration(i) * time.Second)
				st := state(term, 3)
				switch g {
				case 0:
					tb.LeaderChanged(shard, self, self, term, now)
				case 1:
					tb.Ack(shard, term, st, []uint64{1, 2, 3}, now)
				case 2:
					if d := tb.Lapsed(shard, st, now); d.RecordTerm {
						tb.RecordingDone(shard, d.Term)
					}
				case 3:
					tb.IsLeader(shard)
					tb.Led()
					tb.LeaderSince(shard)
				}
			}
		}()
	}
	wg.Wait()
}

// A timed hold ends its maximum after this leader first saw it, once,
// only in the recorded term; one released meanwhile is forgotten, and a
// new leader counts from when it first sees the hold, never earlier.
func TestHoldsEndAfterTheirMaximum(t *testing.T) {
	tb := elected(t, 3, t0)
	h := lockfsm.HoldInfo{Session: 1, Req: 4, MaxHoldMillis: 2000}
	st := state(3, 1)
	st.Holds = []lockfsm.HoldInfo{h}
	holds := func(now time.Time) []lockfsm.HoldInfo {
		t.Helper()
		d := tb.Lapsed(shard, st, now)
		if d.RecordTerm || d.Term != 3 {
			t.Fatalf("at %v: %+v", now.Sub(t0), d)
		}
		return d.Holds
	}
	if got := holds(at(time.Second)); len(got) != 0 { // first seen at 1s
		t.Fatalf("ended at once: %+v", got)
	}
	if got := holds(at(3*time.Second - nano)); len(got) != 0 {
		t.Fatalf("ended before its maximum: %+v", got)
	}
	if got := holds(at(3 * time.Second)); len(got) != 1 || got[0] != h {
		t.Fatalf("at its maximum: %+v, want the hold", got)
	}
	if got := holds(at(4 * time.Second)); len(got) != 0 {
		t.Fatalf("asked to end twice: %+v", got)
	}
	// Released, then seen again under the same name: forgotten and counted anew.
	st.Holds = nil
	holds(at(5 * time.Second))
	st.Holds = []lockfsm.HoldInfo{h}
	if got := holds(at(6 * time.Second)); len(got) != 0 {
		t.Fatalf("a hold seen again ended at once: %+v", got)
	}

	// Before its term is recorded a leader ends nothing.
	tb2 := elected(t, 4, at(10*time.Second))
	d := tb2.Lapsed(shard, st, at(20*time.Second))
	if !d.RecordTerm || len(d.Holds) != 0 {
		t.Fatalf("unrecorded term: %+v", d)
	}
	// A new leader counts from its first sight of the hold.
	st.Term = 4
	if got := tb2.Lapsed(shard, st, at(21*time.Second)).Holds; len(got) != 0 {
		t.Fatalf("a new leader ended a hold at first sight: %+v", got)
	}
	if got := tb2.Lapsed(shard, st, at(23*time.Second)).Holds; len(got) != 1 {
		t.Fatalf("a new leader did not end the hold 2s after first sight: %+v", got)
	}
}
