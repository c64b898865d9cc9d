package node

import (
	"context"
	"fmt"

	"github.com/lockmesh/lockmesh/internal/client"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// Semaphore is a counting semaphore on one key for a Session: at most
// its permit count of permits are held at once, across the cluster. As
// every lock of a Session, permits are leased: a holder that dies gives
// them back when its session's TTL runs out (Redisson's RSemaphore and
// Curator's first semaphore kept them for ever). Requests are granted in
// FIFO order, a request waiting for more permits than are free holding
// back smaller ones behind it, so a large request is never starved. Get
// one with Session.Semaphore.
//
// A Session may take permits of one semaphore several times over,
// reentrant or not (WithReentrant changes nothing here): each take is a
// grant of its own, with its own token and Unlock, as goroutines sharing
// the Session would take them (Curator's InterProcessSemaphoreV2 and
// Redisson's RSemaphore do the same). A take that needs the Session's own
// permits back can never be granted while the Session waits, and fails at
// once with ErrDeadlock: the Session is one thread of control, its
// goroutines included, so goroutines that should wait for each other's
// permits need Sessions of their own.
type Semaphore struct {
	s       *Session
	key     string
	permits int
}

// Semaphore returns the semaphore on key with permits permits for this
// session. It does no I/O. Every user of a key must give the same permit
// count while anybody holds or waits for it; another count fails with
// ErrLimitMismatch, naming both, rather than setting a new limit. Once
// nobody holds or waits for the key the count is forgotten: that is how a
// semaphore's size is changed (docs/LOCKS.md).
func (s *Session) Semaphore(key string, permits int) *Semaphore {
	return &Semaphore{s: s, key: key, permits: permits}
}

// Acquire blocks until n permits are granted to this session and returns
// them as one held *Lock, whose Unlock or Release gives all n back. ctx
// ends the wait as for Node.Lock (a *WaitError). Permits the session
// holds already do not count towards n: they stay held by their own
// takes.
func (m *Semaphore) Acquire(ctx context.Context, n int, opts ...LockOption) (*Lock, error) {
	if err := nilContext(ctx, "Semaphore.Acquire"); err != nil {
		return nil, err
	}
	return m.acquire(ctx, n, true, opts)
}

// TryAcquire takes n permits if they are free and nobody waits before
// it, and otherwise fails at once with a *LockedError naming the holders.
func (m *Semaphore) TryAcquire(ctx context.Context, n int, opts ...LockOption) (*Lock, error) {
	if err := nilContext(ctx, "Semaphore.TryAcquire"); err != nil {
		return nil, err
	}
	return m.acquire(ctx, n, false, opts)
}

func (m *Semaphore) acquire(ctx context.Context, n int, wait bool, opts []LockOption) (*Lock, error) {
	switch {
	case m.permits <= 0 || m.permits > 1<<31-1:
		return nil, fmt.Errorf("%w: semaphore %q: %d permits; a semaphore has 1 to %d", ErrInvalidArgument, m.key, m.permits, 1<<31-1)
	case n <= 0:
		return nil, fmt.Errorf("%w: semaphore %q: acquire of %d permits; acquire at least 1", ErrInvalidArgument, m.key, n)
	case n > m.permits:
		return nil, fmt.Errorf("%w: semaphore %q: acquire of %d permits, more than its %d", ErrInvalidArgument, m.key, n, m.permits)
	}
	if err := m.s.n.familyLevel("semaphores"); err != nil {
		return nil, err
	}
	return m.s.acquire(ctx, m.key, wait, client.Spec{Kind: lockfsm.KindSemaphore, Limit: uint32(m.permits), Permits: uint32(n)}, opts)
}
