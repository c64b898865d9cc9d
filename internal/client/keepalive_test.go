package client

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

// runKeepAlives starts the keepalive loop; it stops at the end of the
// test.
func (tc *testClient) runKeepAlives(t *testing.T) {
	ctx, cancel := context.WithCancel(tc.ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tc.RunKeepAlives(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
}

// nextArmed returns the time the keepalive loop next sets its timer for:
// it has gone back to waiting for that round.
func (tc *testClient) nextArmed(t *testing.T) time.Time {
	t.Helper()
	select {
	case at := <-tc.rounds.armed:
		return at
	case <-time.After(10 * time.Second):
		t.Fatal("the keepalive loop did not set its timer within 10s")
		return time.Time{}
	}
}

// roundCalls takes the keepalive calls of one round, n of them, sorted by
// shard; they stay unanswered until the test answers them.
func (tc *testClient) roundCalls(t *testing.T, n int) []keepAliveCall {
	t.Helper()
	var calls []keepAliveCall
	for range n {
		select {
		case c := <-tc.calls:
			calls = append(calls, c)
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of %d keepalive calls within 10s", len(calls), n)
		}
	}
	slices.SortFunc(calls, func(a, b keepAliveCall) int { return int(a.shard) - int(b.shard) })
	return calls
}

// noCalls fails if a keepalive call is waiting.
func (tc *testClient) noCalls(t *testing.T) {
	t.Helper()
	select {
	case c := <-tc.calls:
		t.Fatalf("unexpected keepalive call for shard %d, sessions %v", c.shard, c.ids)
	default:
	}
}

// One round: one call per shard carrying every live session there; an
// ack extends each from the send time, an expired id loses its session
// (and its Session, whose other sessions are closed on the cluster); the
// next round is timed from the start of this one, however long it took.
func TestKeepAliveRound(t *testing.T) {
	tc := newTestClient(t, time.Second) // rounds every 250ms
	a, _ := tc.NewSession(time.Second)
	b, _ := tc.NewSession(time.Second)
	a2, a3 := tc.hold(t, a, 2, "a2"), tc.hold(t, a, 3, "a3")
	b2 := tc.hold(t, b, 2, "b2")
	orphan, _ := tc.NewSession(time.Second)
	tc.hold(t, orphan, 2, "o2")
	orphan.Orphan()

	start := tc.rounds.Now()
	tc.runKeepAlives(t)
	// The opens kicked the loop before it started: it sets its timer,
	// then re-sets it for the same time on the kick.
	for range 2 {
		if at := tc.nextArmed(t); at != start.Add(250*time.Millisecond) {
			t.Fatalf("first round set for %v after start, want 250ms", at.Sub(start))
		}
	}
	tc.noCalls(t)

	tc.lease.Jump(200 * time.Millisecond) // so that the send time differs from the open's
	tc.rounds.Advance(250 * time.Millisecond)
	sent := tc.lease.Now()
	calls := tc.roundCalls(t, 2)
	if calls[0].shard != 2 || !slices.Equal(calls[0].ids, sorted(a2.Session().ID(), b2.Session().ID())) ||
		calls[1].shard != 3 || !slices.Equal(calls[1].ids, []uint64{a3.Session().ID()}) {
		t.Fatalf("round calls %+v, want shard 2 with sessions %d and %d, shard 3 with %d (and not the orphan's)",
			calls, a2.Session().ID(), b2.Session().ID(), a3.Session().ID())
	}
	// A slow round: 100ms pass on both clocks before the answers.
	tc.rounds.Jump(100 * time.Millisecond)
	tc.lease.Jump(100 * time.Millisecond)
	calls[0].reply <- keepAliveReply{}
	calls[1].reply <- keepAliveReply{expired: []uint64{a3.Session().ID()}}
	if at := tc.nextArmed(t); at != start.Add(500*time.Millisecond) {
		t.Fatalf("next round set for %v after start, want 500ms: 250ms after this round started", at.Sub(start))
	}
	tc.noCalls(t)

	if got, want := b2.Session().Deadline(), sent.Add(900*time.Millisecond); got != want {
		t.Fatalf("acked session's deadline %v after the send, want TTL - margin = 900ms from the send", got.Sub(sent))
	}
	if b2.Err() != nil {
		t.Fatalf("acked lock lost: %v", b2.Err())
	}
	for _, h := range []*Held{a3, a2} {
		if !doneNow(h) || !errors.Is(h.Err(), errLeaseExpired) {
			t.Fatalf("%s after its session expired on shard 3: done %v, Err %v", h.Key(), doneNow(h), h.Err())
		}
	}
	closed := tc.waitClosed(t, 2)
	slices.Sort(closed)
	if !slices.Equal(closed, sorted(a2.Session().ID(), a3.Session().ID())) {
		t.Fatalf("closed %v, want the expired Session's sessions %d and %d", closed, a2.Session().ID(), a3.Session().ID())
	}
	tc.noMoreClosed(t)

	// The next round carries only what is left.
	tc.rounds.Advance(150 * time.Millisecond)
	calls = tc.roundCalls(t, 1)
	if calls[0].shard != 2 || !slices.Equal(calls[0].ids, []uint64{b2.Session().ID()}) {
		t.Fatalf("second round %+v, want shard 2 with session %d only", calls, b2.Session().ID())
	}
	// A failed call changes nothing: the deadline runs on.
	before := b2.Session().Deadline()
	calls[0].reply <- keepAliveReply{err: errUnavailable}
	if at := tc.nextArmed(t); at != start.Add(750*time.Millisecond) {
		t.Fatalf("third round set for %v after start, want 750ms", at.Sub(start))
	}
	if b2.Session().Deadline() != before || b2.Err() != nil {
		t.Fatalf("a failed keepalive moved the deadline or lost the lock: %v", b2.Err())
	}
	tc.noCalls(t)
}

// A session opened with a shorter TTL moves the next round up, to a
// quarter of its TTL after the last round started, and the rounds keep
// that pace while it lives.
func TestKeepAliveKickMovesTheRoundUp(t *testing.T) {
	tc := newTestClient(t, time.Second)
	start := tc.rounds.Now()
	tc.runKeepAlives(t)
	if at := tc.nextArmed(t); at != start.Add(250*time.Millisecond) {
		t.Fatalf("idle loop set for %v after start, want SessionTTL/4 = 250ms", at.Sub(start))
	}
	tc.rounds.Jump(40 * time.Millisecond)
	short, _ := tc.NewSession(400 * time.Millisecond)
	h := tc.hold(t, short, 2, "k")
	if at := tc.nextArmed(t); at != start.Add(100*time.Millisecond) {
		t.Fatalf("after a 400ms-TTL session opened the round is set for %v after start, want 100ms", at.Sub(start))
	}
	tc.rounds.Advance(60 * time.Millisecond)
	calls := tc.roundCalls(t, 1)
	if calls[0].shard != 2 || !slices.Equal(calls[0].ids, []uint64{h.Session().ID()}) {
		t.Fatalf("round %+v, want shard 2 with session %d", calls, h.Session().ID())
	}
	calls[0].reply <- keepAliveReply{}
	if at := tc.nextArmed(t); at != start.Add(200*time.Millisecond) {
		t.Fatalf("next round set for %v after start, want 200ms", at.Sub(start))
	}

	// Once the short session ends, the pace goes back to SessionTTL/4.
	if err := h.Unlock(tc.ctx); err != nil {
		t.Fatal(err)
	}
	if err := short.Close(tc.ctx); err != nil {
		t.Fatal(err)
	}
	tc.waitClosed(t, 1)
	tc.rounds.Advance(100 * time.Millisecond)
	if at := tc.nextArmed(t); at != start.Add(450*time.Millisecond) {
		t.Fatalf("round after the short session ended set for %v after start, want 450ms", at.Sub(start))
	}
	tc.noCalls(t)
}

func sorted(ids ...uint64) []uint64 { return slices.Sorted(slices.Values(ids)) }
