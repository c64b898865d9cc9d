// Package client holds the client side of lockmesh's sessions as pure
// code: the table of one replicated session's requests, and the waiters
// of queued lock attempts with the way a grant reaches them. It does no
// I/O and starts no goroutine; node drives it.
package client

import (
	"context"
	"sync"
)

// Attempts is the request table of one replicated session: the request
// ids it hands out (increasing from 1), which of them still wait for their
// final answer, and the keys whose release has not committed yet. The
// state machine may forget a finished attempt only once the client says
// it has the answers to every request below Ack. Safe for concurrent use.
type Attempts struct {
	mu        sync.Mutex
	next      uint64
	pending   map[uint64]struct{}
	releasing map[string]chan struct{}
}

// NewAttempts returns an empty table whose first request id is 1.
func NewAttempts() *Attempts {
	return &Attempts{next: 1, pending: map[uint64]struct{}{}, releasing: map[string]chan struct{}{}}
}

// Begin allocates the next request id; it is pending until Finish.
func (t *Attempts) Begin() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.next
	t.next++
	t.pending[r] = struct{}{}
	return r
}

// Finish records that the final answer to request r is in.
func (t *Attempts) Finish(r uint64) {
	t.mu.Lock()
	delete(t.pending, r)
	t.mu.Unlock()
}

// Ack is the lowest request id whose answer is still outstanding, or the
// next id if none is: every request below it has its answer.
func (t *Attempts) Ack() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	a := t.next
	for r := range t.pending {
		a = min(a, r)
	}
	return a
}

// StartRelease records that key is being released, until EndRelease with
// the returned channel; a later StartRelease of the key takes over.
func (t *Attempts) StartRelease(key string) chan struct{} {
	done := make(chan struct{})
	t.mu.Lock()
	t.releasing[key] = done
	t.mu.Unlock()
	return done
}

// EndRelease records that the release StartRelease returned done for has
// its answer, and wakes those waiting for it.
func (t *Attempts) EndRelease(key string, done chan struct{}) {
	t.mu.Lock()
	if t.releasing[key] == done {
		delete(t.releasing, key)
	}
	t.mu.Unlock()
	close(done)
}

// AwaitRelease waits until no release of key is in flight, or until
// abort closes (then it returns nil: the caller starts over) or ctx ends.
func (t *Attempts) AwaitRelease(ctx context.Context, key string, abort <-chan struct{}) error {
	t.mu.Lock()
	done, ok := t.releasing[key]
	t.mu.Unlock()
	if !ok {
		return nil
	}
	select {
	case <-done:
		return nil
	case <-abort:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// WaiterKey names one queued lock attempt.
type WaiterKey struct{ Shard, Session, Req uint64 }

// Verify is the value a waiter receives for a grant notice: a hint, to be
// checked against the replicated state, never a token (tokens start at 1).
const Verify uint64 = 0

// Waiters are the queued lock attempts of a peer, each with the channel
// its grant arrives on. A queued attempt learns of its grant one way: a
// value on its channel, either the token (from this peer's own replica,
// which applied the hand-off) or Verify (a notice pushed by the leader,
// which the waiter checks with a read). Safe for concurrent use.
type Waiters struct {
	mu sync.Mutex
	m  map[WaiterKey]chan uint64
}

// NewWaiters returns an empty registry.
func NewWaiters() *Waiters { return &Waiters{m: map[WaiterKey]chan uint64{}} }

// Add registers the attempt k and returns the channel its grant arrives on.
func (w *Waiters) Add(k WaiterKey) <-chan uint64 {
	ch := make(chan uint64, 1)
	w.mu.Lock()
	w.m[k] = ch
	w.mu.Unlock()
	return ch
}

// Remove forgets the attempt k; later wakes for it are dropped.
func (w *Waiters) Remove(k WaiterKey) {
	w.mu.Lock()
	delete(w.m, k)
	w.mu.Unlock()
}

// Wake hands token (or Verify) to the waiter k, if it still waits. A token
// replaces a pending Verify; Verify never replaces anything.
func (w *Waiters) Wake(k WaiterKey, token uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	ch := w.m[k]
	if ch == nil {
		return
	}
	select {
	case ch <- token:
		return
	default:
	}
	if token == Verify {
		return
	}
	// Full: it holds a Verify (or this same token). Swap it for the
	// token; wakes are sent under mu, so nothing refills it meanwhile.
	select {
	case <-ch:
	default:
	}
	ch <- token
}

// Keys lists the attempts waiting, in no particular order.
func (w *Waiters) Keys() []WaiterKey {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]WaiterKey, 0, len(w.m))
	for k := range w.m {
		out = append(out, k)
	}
	return out
}
