package leader

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/lease"
	"github.com/lockmesh/lockmesh/internal/lockerr"
	"github.com/lockmesh/lockmesh/internal/router"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// What a keepalive is answered with, by what this peer's replica of the
// shard says and what the lease table decides. Each case runs on a fresh
// peer a.
func TestServeKeepAlive(t *testing.T) {
	const term = 5
	for _, c := range []struct {
		name  string
		setup func(f *fixture)
		code  uint16   // the error's code, 0 for an answer
		hint  string   // the answer's Leader
		lost  []uint64 // the answer's Expired
		wakes bool     // the expiry loop is woken to record the term
	}{
		{name: "no layout yet", code: lockerr.CodeNotHosted,
			setup: func(f *fixture) { f.h.p = nil }},
		{name: "no replica here", code: lockerr.CodeNotHosted,
			setup: func(f *fixture) { f.h.hosted = false }},
		{name: "no leader yet", code: lockerr.CodeBusy,
			setup: func(f *fixture) {}},
		{name: "another peer leads", hint: "b",
			setup: func(f *fixture) { f.h.leader, _ = f.h.p.ReplicaID(shard, "b") }},
		{name: "a leader the layout does not list", hint: "?",
			setup: func(f *fixture) { f.h.leader = 99 }},
		{name: "leadership not confirmed (rule 1)", code: lockerr.CodeBusy,
			setup: func(f *fixture) {
				f.elect(shard, term)
				f.h.readErr = errors.New("read index timed out")
			}},
		{name: "leadership changed during the read (rule 1)", code: lockerr.CodeBusy,
			setup: func(f *fixture) {
				f.elect(shard, term)
				f.h.setState(shard, lease.State{Term: term, Sessions: sessions(1, 2)})
				f.h.termAfterRead = term + 1
			}},
		{name: "a leader Raft reports but the table does not know", code: lockerr.CodeBusy,
			setup: func(f *fixture) {
				f.h.leader, f.h.term = f.self, term
				f.h.setState(shard, lease.State{Term: term, Sessions: sessions(1, 2)})
			}},
		{name: "term not recorded yet (rule 0)", code: lockerr.CodeBusy, wakes: true,
			setup: func(f *fixture) {
				f.elect(shard, term)
				f.h.setState(shard, lease.State{Term: term - 1, Sessions: sessions(1, 2)})
			}},
		{name: "acknowledged; a session the state does not list is lost", lost: []uint64{3},
			setup: func(f *fixture) {
				f.elect(shard, term)
				f.h.setState(shard, lease.State{Term: term, Sessions: sessions(1, 2)})
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t)
			c.setup(f)
			select {
			case <-f.s.kick: // the election's
			default:
			}
			resp, err := f.s.ServeKeepAlive(context.Background(), router.KeepAliveRequest{Shard: shard, Sessions: []uint64{1, 2, 3}})
			if c.code != 0 {
				if err == nil || lockerr.Code(err) != c.code {
					t.Fatalf("ServeKeepAlive = %+v, %v; want an error coded %d", resp, err, c.code)
				}
			} else if err != nil || resp.Leader != c.hint || !slices.Equal(resp.Expired, c.lost) {
				t.Fatalf("ServeKeepAlive = %+v, %v; want leader %q, expired %v", resp, err, c.hint, c.lost)
			}
			woke := len(f.s.kick) == 1
			if woke != c.wakes {
				t.Fatalf("expiry loop woken: %v, want %v", woke, c.wakes)
			}
			if p := f.h.proposed(); len(p) != 0 {
				t.Fatalf("a keepalive proposed %v", p)
			}
		})
	}
}

// expireRound runs one round of the expiry loop and waits for the
// proposals it started.
func (f *fixture) expireRound() []proposal {
	before := len(f.h.proposed())
	f.s.expireLapsed(context.Background())
	f.s.wg.Wait()
	return f.h.proposed()[before:]
}

// A new leader records its term before it expires anything (rule 0),
// counts every session from its election plus the grace (rule 2), expires
// a session only after a full TTL of silence, stamped with its term, and
// only once (rule 3). The meta shard holds no sessions and is left alone.
func TestExpiryRecordsTheTermThenExpiresLapsedSessions(t *testing.T) {
	const term = 5
	f := newFixture(t)
	f.elect(shard, term)
	f.elect(layout.MetaShard, term)
	f.h.setState(layout.MetaShard, lease.State{Term: term - 1})
	f.h.setState(shard, lease.State{Term: term - 1, Sessions: sessions(1, 2)})

	got := f.expireRound()
	if want := []proposal{{shard, lockfsm.Command{Op: lockfsm.OpLeaderTerm, Term: term}}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("first round proposed %v, want only LeaderTerm(%d) on shard %d", got, term, shard)
	}
	if got := f.expireRound(); !reflect.DeepEqual(got, []proposal{{shard, lockfsm.Command{Op: lockfsm.OpLeaderTerm, Term: term}}}) {
		t.Fatalf("with the term still unrecorded, the next round proposed %v, want LeaderTerm again", got)
	}

	f.h.setState(shard, lease.State{Term: term, Sessions: sessions(1, 2)})
	if got := f.expireRound(); len(got) != 0 {
		t.Fatalf("the round that first sees the sessions proposed %v", got)
	}
	f.clock.set(t0.Add(grace + ttl))
	if got := f.expireRound(); len(got) != 0 {
		t.Fatalf("a round one TTL after election + grace proposed %v; the TTL has not passed", got)
	}
	f.clock.set(t0.Add(grace + ttl + time.Millisecond))
	got = f.expireRound()
	slices.SortFunc(got, func(a, b proposal) int { return int(a.cmd.Session) - int(b.cmd.Session) })
	want := []proposal{
		{shard, lockfsm.Command{Op: lockfsm.OpExpireSession, Session: 1, Term: term}},
		{shard, lockfsm.Command{Op: lockfsm.OpExpireSession, Session: 2, Term: term}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("the round after the TTL proposed %v, want %v", got, want)
	}
	if got := f.expireRound(); len(got) != 0 {
		t.Fatalf("a later round proposed %v; the sessions are being expired already", got)
	}
	resp, err := f.s.ServeKeepAlive(context.Background(), router.KeepAliveRequest{Shard: shard, Sessions: []uint64{1}})
	if err != nil || !slices.Equal(resp.Expired, []uint64{1}) {
		t.Fatalf("a keepalive of an expiring session answered %+v, %v; want it lost (rule 3)", resp, err)
	}
}

// A peer that stops leading a shard decides nothing more about it, and
// a replica that stopped is forgotten.
func TestExpiryOnlyOnShardsLed(t *testing.T) {
	const term = 5
	f := newFixture(t)
	f.elect(shard, term)
	f.elect(shard+1, term)
	f.h.setState(shard, lease.State{Term: term - 1})
	f.h.setState(shard+1, lease.State{Term: term - 1})
	b, _ := f.h.p.ReplicaID(shard, "b")
	f.s.LeaderUpdated(raftioInfo(shard, f.self, b, term+1))
	f.s.Drop(shard + 1)
	if got := f.expireRound(); len(got) != 0 {
		t.Fatalf("a round proposed %v on shards this peer no longer leads", got)
	}
	if _, ok := f.s.LeaderSince(shard); ok {
		t.Fatal("LeaderSince reports a shard another peer leads")
	}
}

// expireSessions has at most maxExpiries proposals in flight, however many
// sessions lapse together.
func TestExpireSessionsBoundsProposalsInFlight(t *testing.T) {
	f := newFixture(t)
	const n = 3*maxExpiries + 5
	var (
		mu               sync.Mutex
		inFlight, most   int
		entered, settled int
	)
	release := make(chan struct{})
	f.h.apply = func(ctx context.Context, _ proposal) (lockfsm.Result, error) {
		mu.Lock()
		inFlight++
		entered++
		most = max(most, inFlight)
		mu.Unlock()
		<-release
		mu.Lock()
		inFlight--
		settled++
		mu.Unlock()
		return lockfsm.Result{Status: lockfsm.StatusOK}, nil
	}
	ids := make([]uint64, n)
	for i := range ids {
		ids[i] = uint64(i + 1)
	}
	done := make(chan struct{})
	go func() {
		f.s.expireSessions(context.Background(), shard, 5, sessions(ids...))
		close(done)
	}()
	for released := 0; released < n; released++ {
		// Release one proposal only once as many as allowed are waiting.
		waitFor(t, "proposals in flight", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return inFlight == min(maxExpiries, n-released)
		})
		release <- struct{}{}
	}
	<-done
	if most != maxExpiries || entered != n || settled != n {
		t.Fatalf("at most %d proposals in flight (%d proposed, %d settled), want %d (%d)", most, entered, settled, maxExpiries, n)
	}
}

// Run wakes its expiry loop when this peer is elected, so the term is
// recorded at once rather than at the next tick, and returns, with every
// goroutine it started, when its context ends.
func TestRunRecordsTheTermWhenElected(t *testing.T) {
	f := newFixture(t)
	f.s.cfg.SessionTTL = time.Hour // no tick during the test
	f.s.cfg.RTT = time.Millisecond
	f.h.setState(shard, lease.State{Term: 1})
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() {
		f.s.Run(ctx)
		close(ran)
	}()
	f.elect(shard, 2)
	waitFor(t, "LeaderTerm(2) proposed", func() bool {
		return slices.ContainsFunc(f.h.proposed(), func(p proposal) bool {
			return reflect.DeepEqual(p, proposal{shard, lockfsm.Command{Op: lockfsm.OpLeaderTerm, Term: 2}})
		})
	})
	cancel()
	<-ran
}

// A timed hold is ended by ExpireHold stamped with the leader's term,
// its maximum after the leader first saw it, and once.
func TestExpiryEndsHoldsAtTheirMaximum(t *testing.T) {
	const term = 5
	f := newFixture(t)
	f.elect(shard, term)
	h := lockfsm.HoldInfo{Session: 1, Req: 3, MaxHoldMillis: 1500}
	f.h.setState(shard, lease.State{Term: term, Sessions: sessions(1, 1), Holds: []lockfsm.HoldInfo{h}})
	if got := f.expireRound(); len(got) != 0 {
		t.Fatalf("the round that first sees the hold proposed %v", got)
	}
	f.clock.set(t0.Add(1500*time.Millisecond - time.Nanosecond))
	if got := f.expireRound(); len(got) != 0 {
		t.Fatalf("a round before the maximum proposed %v", got)
	}
	f.clock.set(t0.Add(1500 * time.Millisecond))
	want := []proposal{{shard, lockfsm.Command{Op: lockfsm.OpExpireHold, Session: 1, Target: 3, Term: term}}}
	if got := f.expireRound(); !reflect.DeepEqual(got, want) {
		t.Fatalf("the round at the maximum proposed %v, want %v", got, want)
	}
	if got := f.expireRound(); len(got) != 0 {
		t.Fatalf("a later round proposed %v; the hold is being ended already", got)
	}
}
