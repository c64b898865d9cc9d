package client

import (
	"context"
	"errors"
	"testing"
	"time"
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
