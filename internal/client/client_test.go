package client

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/lockfsm"
)

func TestAttemptsIDsAndAck(t *testing.T) {
	a := NewAttempts()
	if got := a.Ack(); got != 1 {
		t.Fatalf("empty table Ack = %d, want 1", got)
	}
	r1, r2, r3 := a.Begin(), a.Begin(), a.Begin()
	if r1 != 1 || r2 != 2 || r3 != 3 {
		t.Fatalf("ids %d %d %d, want 1 2 3", r1, r2, r3)
	}
	if got := a.Ack(); got != 1 {
		t.Fatalf("Ack with 1..3 pending = %d, want 1", got)
	}
	a.Finish(r2)
	if got := a.Ack(); got != 1 {
		t.Fatalf("Ack with 1 and 3 pending = %d, want 1: 1 has no answer yet", got)
	}
	a.Finish(r1)
	if got := a.Ack(); got != 3 {
		t.Fatalf("Ack with 3 pending = %d, want 3", got)
	}
	a.Finish(r3)
	if got := a.Ack(); got != 4 {
		t.Fatalf("Ack with none pending = %d, want the next id 4", got)
	}
	a.Finish(r3) // twice: no effect
	if r4 := a.Begin(); r4 != 4 || a.Ack() != 4 {
		t.Fatalf("next id %d, Ack %d", r4, a.Ack())
	}
}

func TestAttemptsRelease(t *testing.T) {
	a := NewAttempts()
	ctx := context.Background()
	if err := a.AwaitRelease(ctx, "k", nil); err != nil {
		t.Fatalf("no release in flight: %v", err)
	}
	done := a.StartRelease("k")
	waited := make(chan error, 1)
	go func() { waited <- a.AwaitRelease(ctx, "k", nil) }()
	select {
	case err := <-waited:
		t.Fatalf("AwaitRelease returned %v while the release was in flight", err)
	case <-time.After(20 * time.Millisecond):
	}
	a.EndRelease("k", done)
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	// A newer release of the key takes over; ending the older one leaves it.
	old := a.StartRelease("k")
	cur := a.StartRelease("k")
	a.EndRelease("k", old)
	cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := a.AwaitRelease(cctx, "k", nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the newer release was forgotten: %v", err)
	}
	abort := make(chan struct{})
	close(abort)
	if err := a.AwaitRelease(ctx, "k", abort); err != nil {
		t.Fatalf("abort: %v", err)
	}
	a.EndRelease("k", cur)
}

func TestWaitersWake(t *testing.T) {
	w := NewWaiters()
	k := WaiterKey{Shard: 2, Session: 7, Req: 3}
	w.Wake(k, 5) // nobody waits: dropped
	ch := w.Add(k)
	select {
	case v := <-ch:
		t.Fatalf("a wake before Add arrived: %d", v)
	default:
	}
	// A notice, then the token: the token wins.
	w.Wake(k, Verify)
	w.Wake(k, 9)
	if v := <-ch; v != 9 {
		t.Fatalf("got %d, want the token 9", v)
	}
	// The token, then a notice: the token stays.
	w.Wake(k, 9)
	w.Wake(k, Verify)
	if v := <-ch; v != 9 {
		t.Fatalf("got %d, want the token 9", v)
	}
	w.Wake(k, Verify)
	if v := <-ch; v != Verify {
		t.Fatalf("got %d, want Verify", v)
	}
	if ks := w.Keys(); len(ks) != 1 || ks[0] != k {
		t.Fatalf("Keys = %v", ks)
	}
	w.Remove(k)
	w.Wake(k, 9)
	select {
	case v := <-ch:
		t.Fatalf("a wake after Remove arrived: %d", v)
	default:
	}
	other := w.Add(WaiterKey{Shard: 2, Session: 7, Req: 4})
	w.Wake(k, 9)
	select {
	case v := <-other:
		t.Fatalf("a wake for another attempt arrived: %d", v)
	default:
	}
}

// A grant notice is only a hint: anyone who reaches the RPC port could
// send one. A waiter woken by a notice reads its request's state and
// takes the lock only when the replicated state says it is held, with the
// token the state holds; a notice for a request still waiting changes
// nothing. A token from this peer's own replica needs no read.
func TestGrantNoticeIsVerified(t *testing.T) {
	tc := newTestClient(t, time.Second)
	tc.cluster.mu.Lock()
	tc.cluster.queue = map[string]bool{"q": true, "own": true}
	tc.cluster.queued = make(chan lockfsm.Command, 4)
	tc.cluster.attempts = map[uint64]lockfsm.RequestInfo{}
	tc.cluster.reads = make(chan uint64, 16)
	tc.cluster.mu.Unlock()
	// An hour's TTL: the slow re-read (every TTL/4) stays out of the way,
	// so every read counted here is one a notice caused.
	o, _ := tc.NewSession(time.Hour)

	type result struct {
		h   *Held
		err error
	}
	acquire := func(key string) (chan result, lockfsm.Command) {
		done := make(chan result, 1)
		go func() {
			h, _, err := o.Acquire(tc.ctx, 2, key, true, Spec{})
			done <- result{h, err}
		}()
		return done, <-tc.cluster.queued
	}
	done, cmd := acquire("q")
	key := WaiterKey{Shard: 2, Session: cmd.Session, Req: cmd.Req}
	setState := func(st lockfsm.ReqState, token uint64) {
		tc.cluster.mu.Lock()
		tc.cluster.attempts[cmd.Req] = lockfsm.RequestInfo{Found: true, Key: "q", State: st, Token: token}
		tc.cluster.mu.Unlock()
	}

	// A forged notice while the request still waits: the waiter reads,
	// finds it waiting, and waits on.
	setState(lockfsm.ReqWaiting, 0)
	tc.Waiters().Wake(key, Verify) // registered before the acquire was proposed
	select {
	case req := <-tc.cluster.reads:
		if req != cmd.Req {
			t.Fatalf("read request %d, want %d", req, cmd.Req)
		}
	case r := <-done:
		t.Fatalf("a notice for a waiting request ended the wait unread: %+v, %v", r.h, r.err)
	case <-time.After(10 * time.Second):
		t.Fatal("a notice caused no read of the request within 10s")
	}
	// The grant commits; its notice arrives: the lock is taken with the
	// state's token, not anything the notice said.
	setState(lockfsm.ReqHeld, 9)
	tc.Waiters().Wake(key, Verify) // registered before the acquire was proposed
	r := <-done
	if r.err != nil || r.h == nil || r.h.Token() != 9 {
		t.Fatalf("after the verified notice: %+v, %v; want the lock with token 9", r.h, r.err)
	}
	if n := len(tc.cluster.reads); n != 1 {
		t.Fatalf("%d more reads, want the one that found the grant", n)
	}
	_ = r.h.Unlock(tc.ctx)

	// A token handed over by this peer's own replica is the grant itself.
	done, cmd = acquire("own")
	tc.Waiters().Wake(WaiterKey{Shard: 2, Session: cmd.Session, Req: cmd.Req}, 11)
	if r := <-done; r.err != nil || r.h.Token() != 11 {
		t.Fatalf("with a token from the local replica: %+v, %v; want token 11", r.h, r.err)
	}
	if n := len(tc.cluster.reads); n != 1 {
		t.Fatalf("a token from the local replica was read back (%d reads)", n)
	}
}
