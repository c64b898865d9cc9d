package node

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// sessionT starts a Session on n that the test closes at its end.
func sessionT(t *testing.T, n *Node, opts ...SessionOption) *Session {
	t.Helper()
	s, err := n.NewSession(ctxT(t, 10*time.Second), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(ctxT(t, 10*time.Second)) })
	return s
}

// lockT takes key through locker, failing the test if it cannot.
func lockT(t *testing.T, locker Locker, key string) *Lock {
	t.Helper()
	l, err := locker.Lock(ctxT(t, 10*time.Second), key)
	if err != nil {
		t.Fatalf("Lock %s: %v", key, err)
	}
	return l
}

// ended waits for ctx to end, at most 30 s, and returns its cause.
func ended(t *testing.T, ctx context.Context, what string) error {
	t.Helper()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-ctxT(t, 30*time.Second).Done():
		t.Fatalf("%s: the lock's Context was not cancelled within 30s", what)
		return nil
	}
}

// A Lock's Context ends with the hold, and its cause says how: released
// by its holder, its lease lost, its session closed, or the parent's.
func TestLockContextEndsWithTheHold(t *testing.T) {
	n := startCluster(t, clusterOpts{peers: 1, rf: 1, shards: 2})[0].node
	s := sessionT(t, n)

	l := lockT(t, s, "ctx/released")
	ctx := l.Context(context.Background())
	if ctx.Err() != nil {
		t.Fatalf("the Context of a held lock is done: %v", context.Cause(ctx))
	}
	if err := l.Unlock(ctxT(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if cause := ended(t, ctx, "Unlock"); !errors.Is(cause, ErrReleased) {
		t.Fatalf("cause after Unlock: %v, want ErrReleased", cause)
	}
	if cause := context.Cause(l.Context(context.Background())); !errors.Is(cause, ErrReleased) {
		t.Fatalf("a Context made after Unlock: cause %v, want ErrReleased at once", cause)
	}

	l = lockT(t, s, "ctx/release")
	ctx = l.Context(context.Background())
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	if cause := ended(t, ctx, "Release"); !errors.Is(cause, ErrReleased) {
		t.Fatalf("cause after Release: %v, want ErrReleased", cause)
	}

	l = lockT(t, s, "ctx/parent")
	parent, cancel := context.WithCancelCause(context.Background())
	ctx = l.Context(parent)
	errParent := errors.New("the caller gave up")
	cancel(errParent)
	if cause := ended(t, ctx, "the parent's cancel"); !errors.Is(cause, errParent) {
		t.Fatalf("cause after the parent's cancel: %v, want the parent's", cause)
	}
	if l.Err() != nil {
		t.Fatalf("the parent's cancel ended the lock: %v", l.Err())
	}
	_ = l.Unlock(ctxT(t, 10*time.Second))

	closing := sessionT(t, n)
	l = lockT(t, closing, "ctx/closed")
	ctx = l.Context(context.Background())
	if err := closing.Close(ctxT(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if cause := ended(t, ctx, "Session.Close"); !errors.Is(cause, ErrSessionClosed) {
		t.Fatalf("cause after the session closed: %v, want ErrSessionClosed", cause)
	}

	lost := sessionT(t, n, WithTTL(time.Second))
	l = lockT(t, lost, "ctx/lost")
	ctx = l.Context(context.Background())
	lost.Orphan() // no more keepalives: the lease runs out
	if cause := ended(t, ctx, "a lost lease"); !errors.Is(cause, ErrLeaseExpired) {
		t.Fatalf("cause after the lease ran out: %v, want ErrLeaseExpired", cause)
	}
	select {
	case <-l.Done():
	default:
		t.Fatal("the Context ended before the lock's Done closed")
	}
}

// Each hold of a reentrant grant has its own Context: giving one hold up
// ends its Context only.
func TestLockContextPerReentrantHold(t *testing.T) {
	n := startCluster(t, clusterOpts{peers: 1, rf: 1, shards: 2})[0].node
	s := sessionT(t, n, WithReentrant())
	outer := lockT(t, s, "ctx/reentrant")
	inner := lockT(t, s, "ctx/reentrant")
	outerCtx, innerCtx := outer.Context(context.Background()), inner.Context(context.Background())
	if err := inner.Unlock(ctxT(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if cause := ended(t, innerCtx, "the inner Unlock"); !errors.Is(cause, ErrReleased) {
		t.Fatalf("inner hold: cause %v, want ErrReleased", cause)
	}
	if outerCtx.Err() != nil {
		t.Fatalf("the inner Unlock ended the outer hold's Context: %v", context.Cause(outerCtx))
	}
	if err := outer.Unlock(ctxT(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if cause := ended(t, outerCtx, "the outer Unlock"); !errors.Is(cause, ErrReleased) {
		t.Fatalf("outer hold: cause %v, want ErrReleased", cause)
	}
}

// WithLock runs its function holding the key, releases it on return and
// on panic, and says when the hold ended while the function ran.
func TestWithLock(t *testing.T) {
	n := startCluster(t, clusterOpts{peers: 1, rf: 1, shards: 2})[0].node
	other := sessionT(t, n)

	ran := false
	err := WithLock(ctxT(t, 10*time.Second), n, "with/held", func(ctx context.Context) error {
		ran = true
		if ctx.Err() != nil {
			t.Errorf("the function's context is done: %v", context.Cause(ctx))
		}
		if _, err := other.TryLock(ctx, "with/held"); !errors.Is(err, ErrLocked) {
			t.Errorf("TryLock of the key WithLock holds: %v, want ErrLocked", err)
		}
		return nil
	})
	if err != nil || !ran {
		t.Fatalf("WithLock: %v (ran %v)", err, ran)
	}
	l, err := other.TryLock(ctxT(t, 10*time.Second), "with/held")
	if err != nil {
		t.Fatalf("TryLock after WithLock returned: %v, want the key free (WithLock waits for the release)", err)
	}
	_ = l.Unlock(ctxT(t, 10*time.Second))

	errFn := errors.New("the function failed")
	if err := WithLock(ctxT(t, 10*time.Second), n, "with/error", func(context.Context) error { return errFn }); err != errFn {
		t.Fatalf("WithLock of a failing function: %v, want its error as it is", err)
	}

	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("recovered %v, want the function's panic", r)
			}
		}()
		_ = WithLock(ctxT(t, 10*time.Second), n, "with/panic", func(context.Context) error { panic("boom") })
	}()
	if l, err := other.Lock(ctxT(t, 10*time.Second), "with/panic"); err != nil {
		t.Fatalf("Lock after a panic under WithLock: %v, want the key released", err)
	} else {
		_ = l.Unlock(ctxT(t, 10*time.Second))
	}

	ending := sessionT(t, n)
	err = WithLock(ctxT(t, 10*time.Second), ending, "with/ended", func(ctx context.Context) error {
		if err := ending.Close(ctxT(t, 10*time.Second)); err != nil {
			t.Errorf("Session.Close: %v", err)
		}
		<-ctx.Done()
		return ctx.Err()
	})
	if !errors.Is(err, ErrSessionClosed) || !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "ended while the function ran") {
		t.Fatalf("WithLock whose session closed while the function ran: %v, want it to say so and wrap ErrSessionClosed and the function's error", err)
	}

	called := false
	if err := WithLock(ctxT(t, 10*time.Second), n, "", func(context.Context) error { called = true; return nil }); !errors.Is(err, ErrInvalidKey) || called {
		t.Fatalf("WithLock of an empty key: %v (function called %v), want ErrInvalidKey and no call", err, called)
	}
}

// A sync.Locker locks and unlocks its key, and panics where the ctx API
// returns an error.
func TestSyncLocker(t *testing.T) {
	n := startCluster(t, clusterOpts{peers: 1, rf: 1, shards: 2})[0].node
	other := sessionT(t, n)

	m := NewSyncLocker(n, "sync/key")
	m.Lock()
	if _, err := other.TryLock(ctxT(t, 10*time.Second), "sync/key"); !errors.Is(err, ErrLocked) {
		t.Fatalf("TryLock of a key a sync.Locker holds: %v, want ErrLocked", err)
	}
	m.Unlock()
	l, err := other.Lock(ctxT(t, 10*time.Second), "sync/key")
	if err != nil {
		t.Fatalf("Lock after the sync.Locker's Unlock: %v", err)
	}
	_ = l.Unlock(ctxT(t, 10*time.Second))

	if msg := panicOf(m.Unlock); !strings.Contains(msg, "Unlock of an unlocked lock") {
		t.Fatalf("Unlock of an unlocked sync.Locker: panic %q, want it named", msg)
	}

	lost := sessionT(t, n, WithTTL(time.Second))
	ml := NewSyncLocker(lost, "sync/lost")
	ml.Lock()
	lost.Orphan()
	select {
	case <-lost.Done():
	case <-ctxT(t, 30*time.Second).Done():
		t.Fatal("the orphaned session did not end within 30s")
	}
	if msg := panicOf(ml.Unlock); !strings.Contains(msg, ErrLeaseExpired.Error()) {
		t.Fatalf("Unlock after the lease was lost: panic %q, want it to name the lost lease", msg)
	}
}

// panicOf runs f and returns what it panicked with, as text ("" if none).
func panicOf(f func()) (msg string) {
	defer func() {
		if r := recover(); r != nil {
			msg = r.(string)
		}
	}()
	f()
	return ""
}

// Contended closes once somebody queues for the held key, and not
// before.
func TestContended(t *testing.T) {
	n, ctx := startPromiseCluster(t)
	s1, s2 := newTestSession(t, ctx, n), newTestSession(t, ctx, n)
	l, err := s1.Lock(ctx, "busy")
	if err != nil {
		t.Fatal(err)
	}
	contended := l.Contended()
	if l.Contended() != contended {
		t.Fatal("a second Contended returned another channel")
	}
	// Another key's waiter is not this key's.
	other, err := s1.Lock(ctx, "quiet")
	if err != nil {
		t.Fatal(err)
	}
	quiet := other.Contended()
	waiting := make(chan *Lock, 1)
	go func() {
		l2, _ := s2.Lock(ctx, "busy")
		waiting <- l2
	}()
	select {
	case <-contended:
	case <-time.After(30 * time.Second):
		t.Fatal("Contended still open 30s after a waiter queued")
	}
	select {
	case <-quiet:
		t.Fatal("Contended of a key nobody waits for closed")
	default:
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if l2 := <-waiting; l2 == nil {
		t.Fatal("the waiter was not granted")
	} else {
		l2.Release()
	}
	other.Release()
}
