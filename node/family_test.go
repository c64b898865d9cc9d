package node

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/internal/layout"
)

// The lock family through the public API, on a three-peer cluster.
func TestLockFamilyThroughTheAPI(t *testing.T) {
	peers := startCluster(t, clusterOpts{peers: 3, shards: 2, rf: 3, ttl: 5 * time.Second})
	a, b := peers[0].node, peers[1].node
	ctx := ctxT(t, 60*time.Second)
	sa, err := a.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer sa.Close(ctx)
	sb, err := b.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close(ctx)
	sc, err := peers[2].node.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close(ctx)

	t.Run("read/write", func(t *testing.T) {
		r1, err := sa.RWMutex("rw").RLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		r2, err := sb.RWMutex("rw").RLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, err = sc.RWMutex("rw").TryLock(ctx)
		var le *LockedError
		if !errors.As(err, &le) || !errors.Is(err, ErrLocked) || len(le.Holders) != 2 || le.Holders[0].Session != sa.ID() {
			t.Fatalf("TryLock with two readers: %v, want a LockedError naming both", err)
		}
		if _, err := sa.RWMutex("rw").RLock(ctx); !errors.Is(err, ErrAlreadyHeld) {
			t.Fatalf("second RLock by a non-reentrant session: %v", err)
		}
		if _, err := sc.Lock(ctx, "rw"); !errors.Is(err, ErrKindMismatch) {
			t.Fatalf("mutex Lock of a read/write key: %v, want ErrKindMismatch", err)
		}
		writer := make(chan *Lock, 1)
		go func() {
			s, err := peers[2].node.NewSession(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			w, err := s.RWMutex("rw").Lock(ctx)
			if err != nil {
				t.Error(err)
			}
			writer <- w
		}()
		waitFor(t, "the writer to queue", func() bool {
			info, err := a.Inspect(ctx, "rw")
			return err == nil && len(info.Waiters) == 1
		})
		// A queued writer blocks readers that come after it.
		if _, err := sa.RWMutex("rw2").TryRLock(ctx); err != nil {
			t.Fatal(err) // another key is free
		}
		s3, _ := a.NewSession(ctx)
		if _, err := s3.RWMutex("rw").TryRLock(ctx); !errors.Is(err, ErrLocked) {
			t.Fatalf("TryRLock behind a queued writer: %v, want ErrLocked", err)
		}
		_ = r1.Unlock(ctx)
		_ = r2.Unlock(ctx)
		w := <-writer
		if w == nil || w.Token() <= r2.Token() || w.Token() <= r1.Token() {
			t.Fatalf("the writer's token %v is not above the readers' %d and %d", w, r1.Token(), r2.Token())
		}
		_ = w.Unlock(ctx)
	})

	t.Run("semaphore", func(t *testing.T) {
		p1, err := sa.Semaphore("sem", 3).Acquire(ctx, 2)
		if err != nil || p1.Permits() != 2 {
			t.Fatalf("Acquire 2 of 3: %v", err)
		}
		if _, err := sb.Semaphore("sem", 3).TryAcquire(ctx, 2); !errors.Is(err, ErrLocked) {
			t.Fatalf("TryAcquire 2 with 1 free: %v, want ErrLocked", err)
		}
		// One session may take a semaphore's permits more than once.
		if more, err := sa.Semaphore("sem", 3).TryAcquire(ctx, 1); err != nil {
			t.Fatalf("a second take by the same session: %v", err)
		} else {
			_ = more.Unlock(ctx)
		}
		p2, err := sb.Semaphore("sem", 3).TryAcquire(ctx, 1)
		if err != nil {
			t.Fatalf("TryAcquire 1 with 1 free: %v", err)
		}
		if _, err := sc.Semaphore("sem", 4).Acquire(ctx, 1); !errors.Is(err, ErrLimitMismatch) || !strings.Contains(err.Error(), "4") || !strings.Contains(err.Error(), "3") {
			t.Fatalf("a semaphore of another size: %v, want ErrLimitMismatch naming 4 and 3", err)
		}
		for _, bad := range []struct{ permits, n int }{{0, 1}, {-1, 1}, {3, 0}, {3, -2}, {3, 4}} {
			if _, err := sb.Semaphore("sem", bad.permits).Acquire(ctx, bad.n); !errors.Is(err, ErrInvalidArgument) {
				t.Errorf("Semaphore(%d).Acquire(%d): %v, want ErrInvalidArgument", bad.permits, bad.n, err)
			}
		}
		_ = p1.Unlock(ctx)
		_ = p2.Unlock(ctx)
	})

	t.Run("lock all", func(t *testing.T) {
		p := a.peer.Placement()
		k1, k2 := keyOnShard(p, layout.FirstLockShard, "all"), keyOnShard(p, layout.FirstLockShard+1, "all")
		m, err := sa.LockAll(ctx, "{o}/a", "{o}/b", k1, k2)
		if err != nil {
			t.Fatal(err)
		}
		if len(m.Locks()) != 4 || m.Locks()[0].Key() != "{o}/a" || m.Err() != nil {
			t.Fatalf("LockAll gave %d locks", len(m.Locks()))
		}
		if _, err := sb.TryLockAll(ctx, "free-1", "{o}/b"); !errors.Is(err, ErrLocked) {
			t.Fatalf("TryLockAll over a held key: %v", err)
		}
		if info, err := a.Inspect(ctx, "free-1"); err != nil || len(info.Holders) != 0 {
			t.Fatalf("a refused TryLockAll left free-1 held: %+v %v", info, err)
		}
		for _, bad := range [][]string{nil, {"x", "x"}, make([]string, MaxLockAll+1)} {
			if _, err := sb.LockAll(ctx, bad...); !errors.Is(err, ErrInvalidArgument) && !errors.Is(err, ErrInvalidKey) {
				t.Errorf("LockAll of %d keys: %v, want ErrInvalidArgument", len(bad), err)
			}
		}
		if _, err := sa.LockAll(ctx, k1, "other"); !errors.Is(err, ErrAlreadyHeld) {
			t.Fatalf("LockAll of a held key: %v", err)
		}
		if err := m.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case <-m.Done():
		default:
			t.Fatal("Done open after Unlock")
		}

		// Done closes when any one of the locks ends, for a caller
		// already waiting on it.
		m, err = sa.LockAll(ctx, "{o}/a", k1)
		if err != nil {
			t.Fatal(err)
		}
		done := m.Done()
		if err := m.Locks()[1].Release(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-done:
		case <-ctx.Done():
			t.Fatal("MultiLock's Done stayed open after one of its locks was released")
		}
		if err := m.Locks()[0].Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("reentrant", func(t *testing.T) {
		r, err := a.NewSession(ctx, WithReentrant())
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close(ctx)
		l1, err := r.Lock(ctx, "re")
		if err != nil {
			t.Fatal(err)
		}
		l2, err := r.Lock(ctx, "re")
		if err != nil || l2.Token() != l1.Token() {
			t.Fatalf("re-entry: %v, token %d want %d", err, l2.Token(), l1.Token())
		}
		if err := l2.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := l2.Unlock(ctx); !errors.Is(err, ErrNotHeld) {
			t.Fatalf("the same hold unlocked twice: %v, want ErrNotHeld", err)
		}
		if info, _ := a.Inspect(ctx, "re"); len(info.Holders) != 1 {
			t.Fatal("the key was released with a hold left")
		}
		if err := l1.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if info, _ := a.Inspect(ctx, "re"); len(info.Holders) != 0 {
			t.Fatal("the key is still held after the last hold was unlocked")
		}
	})

	t.Run("deadlock", func(t *testing.T) {
		x, err := sa.Lock(ctx, "{d}x")
		if err != nil {
			t.Fatal(err)
		}
		y, err := sb.Lock(ctx, "{d}y")
		if err != nil {
			t.Fatal(err)
		}
		waiting := make(chan error, 1)
		go func() {
			l, err := sa.Lock(ctx, "{d}y")
			if l != nil {
				_ = l.Unlock(ctx)
			}
			waiting <- err
		}()
		waitFor(t, "sa to wait for {d}y", func() bool {
			info, err := a.Inspect(ctx, "{d}y")
			return err == nil && len(info.Waiters) == 1
		})
		_, err = sb.Lock(ctx, "{d}x")
		if !errors.Is(err, ErrDeadlock) || !strings.Contains(err.Error(), "{d}x") || !strings.Contains(err.Error(), "{d}y") {
			t.Fatalf("the wait that closes the cycle: %v, want ErrDeadlock naming both keys", err)
		}
		_ = y.Unlock(ctx)
		if err := <-waiting; err != nil {
			t.Fatal(err)
		}
		_ = x.Unlock(ctx)
	})
}

// Below feature level 3 the family is refused with ErrIncompatible and
// mutexes go on: one peer plays a release that speaks level 2.
func TestLockFamilyNeedsLevel3(t *testing.T) {
	ps := startMixedCluster(t, clusterOpts{expect: 3, shards: 1, rf: 3}, "old", 2)
	n := ps[0].node
	ctx := ctxT(t, 30*time.Second)
	s, err := n.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	for what, call := range map[string]func() error{
		"RLock":   func() error { _, err := s.RWMutex("k").RLock(ctx); return err },
		"Acquire": func() error { _, err := s.Semaphore("k", 2).Acquire(ctx, 1); return err },
		"LockAll": func() error { _, err := s.LockAll(ctx, "a", "b"); return err },
	} {
		if err := call(); !errors.Is(err, ErrIncompatible) || !strings.Contains(err.Error(), "feature level 3") {
			t.Errorf("%s at level 2: %v, want ErrIncompatible naming level 3", what, err)
		}
	}
	l, err := s.Lock(ctx, "k")
	if err != nil {
		t.Fatalf("a mutex at level 2: %v", err)
	}
	_ = l.Unlock(ctx)
}

// waitFor polls cond until it holds, failing the test after a minute
// saying what did not happen.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not happen within a minute", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// WithMaxHold: the holder's Done closes a margin before the maximum, the
// key passes on after it, and the session and its other locks go on. A
// holder cut off from the cluster cannot send its release: the leader
// ends the hold with ExpireHold at the maximum, long before the session's
// TTL would.
func TestMaxHold(t *testing.T) {
	logs := newLogRecorder()
	fc := startFaultCluster(t, faultOpts{ttl: 10 * time.Second, mutate: func(cfg *Config) { cfg.Logger = slog.New(logs) }})
	holderPeer, waiterPeer := fc.peers[0], fc.peers[1]
	ctx := ctxT(t, 2*time.Minute)
	s, err := holderPeer.node().NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Lock(ctx, "mh/x", WithMaxHold(time.Second)); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("WithMaxHold below twice LeaseMargin: %v, want ErrInvalidArgument", err)
	}
	other, err := s.Lock(ctx, "mh/other")
	if err != nil {
		t.Fatal(err)
	}

	// waitGranted queues the waiter for key and returns its grant, and
	// whether holder's Done was closed when the grant came back (the
	// lease rule: the holder gives up first).
	type g struct {
		l          *Lock
		at         time.Time
		holderDone bool
	}
	queue := func(key string, holder *Lock) <-chan g {
		got := make(chan g, 1)
		go func() {
			l, err := waiterPeer.node().Lock(ctx, key)
			if err != nil {
				t.Error(err)
			}
			r := g{l: l, at: time.Now()}
			select {
			case <-holder.Done():
				r.holderDone = true
			default:
			}
			got <- r
		}()
		waitQueued(t, waiterPeer.node(), key, 1)
		return got
	}

	l, err := s.Lock(ctx, "mh/a", WithMaxHold(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	r := <-queue("mh/a", l)
	if r.l == nil {
		t.FailNow()
	}
	if !errors.Is(l.Err(), ErrLeaseExpired) || !strings.Contains(l.Err().Error(), "maximum") {
		t.Fatalf("the capped lock ended with %v, want ErrLeaseExpired naming the maximum", l.Err())
	}
	if !r.holderDone || r.l.Token() <= l.Token() {
		t.Fatalf("the key passed on while its holder's Done was open (%v), or tokens %d, %d", !r.holderDone, l.Token(), r.l.Token())
	}
	next := r.l
	if s.Err() != nil || other.Err() != nil {
		t.Fatalf("the session (%v) or its other lock (%v) ended with the capped lock", s.Err(), other.Err())
	}
	_ = next.Unlock(ctx)

	// Cut off: the release cannot be sent; the leader ends the hold.
	l, err = s.Lock(ctx, "mh/c", WithMaxHold(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	got := queue("mh/c", l)
	fc.isolateHold(holderPeer, false)
	r = <-got
	if r.l == nil {
		t.FailNow()
	}
	if !r.holderDone {
		t.Fatal("the key passed on while its cut-off holder's Done was open")
	}
	shard := holderPeer.node().peer.Placement().ShardOf("mh/c")
	ended := false
	for _, rec := range logs.all() {
		if rec.Message == "ending a hold at its maximum" && rec.Time.Before(r.at) {
			ended = true
		}
	}
	if !ended {
		t.Fatal("the cut-off holder's key passed on, but no leader logged ending the hold")
	}
	if at, ok := loggedFor(logs, "expiring session", shard, l.h.Session().ID()); ok && at.Before(r.at) {
		t.Fatal("the key passed on by the session's expiry, not by the hold's maximum")
	}
	fc.rejoinHeld(holderPeer)
	_ = r.l.Unlock(ctx)
}
