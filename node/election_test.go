package node

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

type campaignResult struct {
	ld  *Leadership
	err error
}

func campaignAsync(ctx context.Context, e *Election, value string) <-chan campaignResult {
	ch := make(chan campaignResult, 1)
	go func() {
		ld, err := e.Campaign(ctx, []byte(value))
		ch <- campaignResult{ld, err}
	}()
	return ch
}

func mustLeader(t *testing.T, ctx context.Context, e *Election, value string, term uint64, candidates int) LeaderInfo {
	t.Helper()
	info, err := e.Leader(ctx)
	if err != nil {
		t.Fatalf("Leader: %v, want %q leading in term %d", err, value, term)
	}
	if string(info.Value) != value || info.Term != term || info.Candidates != candidates {
		t.Fatalf("Leader: %+v, want %q leading in term %d with %d candidates waiting", info, value, term, candidates)
	}
	return info
}

// Candidates are elected in FIFO order, each in a higher term; the leader
// proclaims, and resigns to the next in one entry; a deposed leader's
// Proclaim is refused and leaves its successor's value; Resign is
// idempotent; a candidate that gives up says whom it waited behind.
func TestElectionHandsOverInTermOrder(t *testing.T) {
	n, ctx := startPromiseCluster(t)
	s1, s2, s3 := newTestSession(t, ctx, n), newTestSession(t, ctx, n), newTestSession(t, ctx, n)
	const name = "election/jobs"
	e1, e2, e3 := s1.Election(name), s2.Election(name), s3.Election(name)
	if _, err := e1.Leader(ctx); !errors.Is(err, ErrNoLeader) {
		t.Fatalf("Leader of a new election: %v, want ErrNoLeader", err)
	}

	ld1, err := e1.Campaign(ctx, []byte("one"))
	if err != nil {
		t.Fatal(err)
	}
	info := mustLeader(t, ctx, e3, "one", ld1.Term(), 0)
	if info.Peer != "peer-1" || info.Session != s1.ID() {
		t.Fatalf("Leader: %+v, want peer-1's session %x", info, s1.ID())
	}
	if _, err := e1.Campaign(ctx, nil); !errors.Is(err, ErrAlreadyHeld) {
		t.Fatalf("a second Campaign of the leading Session: %v, want ErrAlreadyHeld", err)
	}

	second := campaignAsync(ctx, e2, "two")
	waitQueued(t, n, name, 1)
	ctx3, stop3 := context.WithCancel(ctx)
	defer stop3()
	third := campaignAsync(ctx3, e3, "three")
	waitQueued(t, n, name, 2)
	if err := ld1.Proclaim(ctx, []byte("one, again")); err != nil {
		t.Fatal(err)
	}
	mustLeader(t, ctx, e2, "one, again", ld1.Term(), 2)
	if !bytes.Equal(ld1.Value(), []byte("one, again")) {
		t.Fatalf("the leader's Value %q after its Proclaim", ld1.Value())
	}

	if err := ld1.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ld1.Resign(ctx); err != nil {
		t.Fatalf("Resign again: %v, want nil as the first", err)
	}
	select {
	case <-ld1.Done():
	default:
		t.Fatal("Done open after Resign")
	}
	r := <-second
	if r.err != nil {
		t.Fatal(r.err)
	}
	ld2 := r.ld
	if ld2.Term() <= ld1.Term() {
		t.Fatalf("the second leader's term %d, not above the first's %d", ld2.Term(), ld1.Term())
	}
	if err := ld1.Proclaim(ctx, []byte("deposed")); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("a resigned leader's Proclaim: %v, want ErrNotHeld", err)
	}
	mustLeader(t, ctx, e1, "two", ld2.Term(), 1)

	stop3()
	if r := <-third; r.ld != nil || !errors.Is(r.err, context.Canceled) {
		t.Fatalf("a candidate whose ctx ended: %v, %v, want no leadership and context.Canceled", r.ld, r.err)
	} else if we, ok := errors.AsType[*WaitError](r.err); !ok || len(we.Holders) != 1 || we.Holders[0].Token != ld2.Term() {
		t.Fatalf("a candidate whose ctx ended: %v, want a WaitError naming the leader of term %d", r.err, ld2.Term())
	}
	if err := ld2.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Leader(ctx, name); !errors.Is(err, ErrNoLeader) {
		t.Fatalf("Leader after the last resigned: %v, want ErrNoLeader", err)
	}
	// The Session that resigned campaigns again, in a new term.
	ld3, err := e1.Campaign(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ld3.Term() <= ld2.Term() {
		t.Fatalf("term %d after term %d", ld3.Term(), ld2.Term())
	}
	mustLeader(t, ctx, e2, "", ld3.Term(), 0)
}

// Bad input gets an error that names the problem, before anything is
// sent.
func TestElectionRefusesBadInput(t *testing.T) {
	n, ctx := startPromiseCluster(t)
	s := newTestSession(t, ctx, n)
	big := bytes.Repeat([]byte("v"), MaxValueLen+1)
	for _, tc := range []struct {
		what string
		err  error
		want error
		says string
	}{
		{"an empty name", second(s.Election("").Campaign(ctx, nil)), ErrInvalidKey, "empty"},
		{"a long name", second(s.Election(strings.Repeat("n", MaxKeyLen+1)).Campaign(ctx, nil)), ErrInvalidKey, "513"},
		{"a long value", second(s.Election("e").Campaign(ctx, big)), ErrInvalidArgument, "1025 bytes"},
		{"Leader of an empty name", second(s.Election("").Leader(ctx)), ErrInvalidKey, "empty"},
		{"WithValue too long", second(s.Lock(ctx, "k", WithValue(big))), ErrInvalidArgument, "1025 bytes"},
	} {
		if !errors.Is(tc.err, tc.want) || !strings.Contains(tc.err.Error(), tc.says) {
			t.Errorf("%s: %v, want %v saying %q", tc.what, tc.err, tc.want, tc.says)
		}
	}
	ld, err := s.Election("e").Campaign(ctx, []byte("ok"))
	if err != nil {
		t.Fatal(err)
	}
	if err := ld.Proclaim(ctx, big); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("Proclaim of %d bytes: %v, want ErrInvalidArgument", len(big), err)
	}
	mustLeader(t, ctx, s.Election("e"), "ok", ld.Term(), 0)
}

func second[T any](_ T, err error) error { return err }

// A lock's value is shown with its holder and waiter, replaced by its
// holder while it holds, and fenced: a released hold's SetValue fails.
func TestLockValues(t *testing.T) {
	n, ctx := startPromiseCluster(t)
	s1, s2 := newTestSession(t, ctx, n), newTestSession(t, ctx, n)
	l1, err := s1.Lock(ctx, "k", WithValue([]byte("first")))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *Lock, 1)
	go func() {
		l, _ := s2.Lock(ctx, "k", WithValue([]byte("second")))
		got <- l
	}()
	waitQueued(t, n, "k", 1)
	info, err := n.Inspect(ctx, "k")
	if err != nil || string(info.Holders[0].Value) != "first" || string(info.Waiters[0].Value) != "second" {
		t.Fatalf("Inspect: %+v, %v, want first holding and second waiting", info, err)
	}
	if err := l1.SetValue(ctx, []byte("first, updated")); err != nil {
		t.Fatal(err)
	}
	if info, _ := n.Inspect(ctx, "k"); string(info.Holders[0].Value) != "first, updated" {
		t.Fatalf("Inspect after SetValue: %+v", info)
	}
	if err := l1.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	l2 := <-got
	if l2 == nil || string(l2.Value()) != "second" {
		t.Fatalf("the second holder %v, want its value", l2)
	}
	if err := l1.SetValue(ctx, []byte("late")); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("SetValue of an unlocked hold: %v, want ErrNotHeld", err)
	}
	if info, _ := n.Inspect(ctx, "k"); string(info.Holders[0].Value) != "second" {
		t.Fatalf("the successor's value after the late SetValue: %+v", info)
	}
}

// Campaign never returns a leadership without a live lease (etcd-io/etcd
// #19597): a candidate whose lease ran out while it waited, and whom the
// cluster elects before it noticed (its timers have not fired: a pause),
// gets ErrLeaseExpired, and the leadership goes on to nobody it
// deceived.
func TestCampaignNeverReturnsWithoutALiveLease(t *testing.T) {
	fc := &faultClock{}
	peers := startCluster(t, clusterOpts{peers: 2, rf: 1, shards: 1, ttl: time.Minute, mutate: func(c *Config) {
		if c.Name == "peer-2" {
			c.clock = fc
		}
	}})
	ctx := ctxT(t, time.Minute)
	leader, candidate := newTestSession(t, ctx, peers[0].node), newTestSession(t, ctx, peers[1].node)
	const name = "election/paused"
	ld, err := leader.Election(name).Campaign(ctx, []byte("first"))
	if err != nil {
		t.Fatal(err)
	}
	next := campaignAsync(ctx, candidate.Election(name), "second")
	waitQueued(t, peers[0].node, name, 1)

	fc.Jump(2 * time.Minute) // the candidate's lease ran out; no timer of its has fired
	if err := ld.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-next
	if r.ld != nil || !errors.Is(r.err, ErrLeaseExpired) {
		t.Fatalf("Campaign of a candidate whose lease ran out while it waited: leadership %v, err %v; want ErrLeaseExpired and no leadership", r.ld, r.err)
	}
	t.Logf("the late candidate was told: %v", r.err)
}

// RunElected runs fn while its Session leads, with a context cancelled
// when the leadership ends, and campaigns again after; fn returning while
// leading resigns and elects the next candidate.
func TestRunElected(t *testing.T) {
	n, ctx := startPromiseCluster(t)
	s1, s2 := newTestSession(t, ctx, n), newTestSession(t, ctx, n)
	const name = "election/run"
	var leading atomic.Int32
	started := make(chan uint64, 2)
	release := make(chan struct{})
	run := func(s *Session, value string) <-chan error {
		done := make(chan error, 1)
		go func() {
			done <- RunElected(ctx, s.Election(name), []byte(value), func(ctx context.Context, ld *Leadership) error {
				if leading.Add(1) != 1 {
					t.Errorf("two RunElected functions run at once")
				}
				defer leading.Add(-1)
				started <- ld.Term()
				select {
				case <-release:
					return errors.New(value + " finished")
				case <-ctx.Done():
					return ctx.Err()
				}
			})
		}()
		return done
	}
	done1 := run(s1, "one")
	term1 := <-started
	done2 := run(s2, "two")
	waitQueued(t, n, name, 1)
	release <- struct{}{} // the leader finishes; it resigns to the next
	if err := <-done1; err == nil || err.Error() != "one finished" {
		t.Fatalf("RunElected of the first: %v, want its fn's error", err)
	}
	if term2 := <-started; term2 <= term1 {
		t.Fatalf("the second leader's term %d, not above %d", term2, term1)
	}
	close(release)
	if err := <-done2; err == nil || err.Error() != "two finished" {
		t.Fatalf("RunElected of the second: %v, want its fn's error", err)
	}
	if _, err := n.Leader(ctx, name); !errors.Is(err, ErrNoLeader) {
		t.Fatalf("Leader after both finished: %v, want ErrNoLeader", err)
	}
}

// A peer that leaves resigns its leaderships first, electing the next
// candidates at once rather than when its Sessions close, and withdraws
// its waiting candidates, which are told the peer is leaving.
func TestLeaveResignsFirst(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three peers, one of which leaves")
	}
	peers := startCluster(t, clusterOpts{peers: 3, rf: 2, shards: 2, ttl: 2 * time.Second})
	ctx := ctxT(t, 90*time.Second)
	leaving, staying := peers[0].node, peers[1].node
	const name = "election/leave"
	ld, err := newTestSession(t, ctx, leaving).Election(name).Campaign(ctx, []byte("leaving"))
	if err != nil {
		t.Fatal(err)
	}
	next := campaignAsync(ctx, newTestSession(t, ctx, staying).Election(name), "staying")
	waitQueued(t, staying, name, 1)
	withdrawn := campaignAsync(ctx, newTestSession(t, ctx, leaving).Election(name), "leaving too")
	waitQueued(t, staying, name, 2)

	if err := leaving.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ld.Err(); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("the leaving peer's leadership ended with %v, want ErrNotHeld: it resigned, not closed", err)
	}
	r := <-withdrawn
	if r.ld != nil || !errors.Is(r.err, ErrClosed) || !strings.Contains(r.err.Error(), "leaving") {
		t.Fatalf("the leaving peer's waiting candidate: %v, %v, want ErrClosed saying the peer is leaving", r.ld, r.err)
	}
	r = <-next
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.ld.Term() <= ld.Term() {
		t.Fatalf("the next leader's term %d, not above %d", r.ld.Term(), ld.Term())
	}
	mustLeader(t, ctx, r.ld.Election(), "staying", r.ld.Term(), 0)
}

// A Session campaigns again the moment its leadership's Done closes: the
// leadership is over then, even before its record is cleared.
func TestCampaignAgainAtDone(t *testing.T) {
	n, ctx := startPromiseCluster(t)
	s := newTestSession(t, ctx, n)
	e := s.Election("election/again")
	var resigns sync.WaitGroup
	defer resigns.Wait()
	for i := range 20 {
		ld, err := e.Campaign(ctx, nil)
		if err != nil {
			t.Fatalf("campaign %d: %v", i, err)
		}
		resigns.Go(func() { _ = ld.Resign(ctx) })
		<-ld.Done()
	}
}

// A candidate of higher priority is elected before those of lower
// priority that waited longer; equals stay FIFO.
func TestCampaignPriority(t *testing.T) {
	n, ctx := startPromiseCluster(t)
	const name = "election/priority"
	leader, err := newTestSession(t, ctx, n).Election(name).Campaign(ctx, []byte("first"))
	if err != nil {
		t.Fatal(err)
	}
	low := campaignAsync(ctx, newTestSession(t, ctx, n).Election(name), "low")
	waitQueued(t, n, name, 1)
	ch := make(chan campaignResult, 1)
	go func() {
		ld, err := newTestSession(t, ctx, n).Election(name).Campaign(ctx, []byte("high"), WithPriority(5))
		ch <- campaignResult{ld, err}
	}()
	waitQueued(t, n, name, 2)
	info, err := n.Inspect(ctx, name)
	if err != nil || string(info.Waiters[0].Value) != "high" {
		t.Fatalf("queue %+v, %v: want the prioritized candidate first", info.Waiters, err)
	}
	if err := leader.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	high := <-ch
	if high.err != nil {
		t.Fatal(high.err)
	}
	mustLeader(t, ctx, high.ld.Election(), "high", high.ld.Term(), 1)
	if err := high.ld.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if r := <-low; r.err != nil || r.ld.Term() <= high.ld.Term() {
		t.Fatalf("the low candidate after the high one: %v, %v", r.ld, r.err)
	}
}
