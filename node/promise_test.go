package node

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/internal/layout"
)

// The lock family's promises about a session's own locks (issue 31),
// through the public API on a one-peer cluster. The races between one
// session's goroutines are forced in internal/client's promise tests.

func startPromiseCluster(t *testing.T) (*Node, context.Context) {
	t.Helper()
	peers := startCluster(t, clusterOpts{peers: 1, rf: 1, shards: 2, ttl: 5 * time.Second})
	return peers[0].node, ctxT(t, time.Minute)
}

func newTestSession(t *testing.T, ctx context.Context, n *Node, opts ...SessionOption) *Session {
	t.Helper()
	s, err := n.NewSession(ctx, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

// LockAll is never reentrant: a key the session holds fails it with
// ErrAlreadyHeld before anything is sent, for one key, for keys on one
// shard, and across shards, where the held key was alone on its shard
// and so taken with a plain acquire that re-entered it. Nothing is left
// held or queued, and the session's own hold keeps its count.
func TestLockAllNeverReenters(t *testing.T) {
	n, ctx := startPromiseCluster(t)
	s := newTestSession(t, ctx, n, WithReentrant())
	p := n.peer.Placement()
	free := keyOnShard(p, layout.FirstLockShard, "free")
	held := keyOnShard(p, layout.FirstLockShard+1, "held")
	l, err := s.Lock(ctx, held)
	if err != nil {
		t.Fatal(err)
	}
	tagged, err := s.Lock(ctx, "{t}/a")
	if err != nil {
		t.Fatal(err)
	}
	read, err := s.RWMutex("rw").RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		keys []string
	}{
		{"one key", []string{held}},
		{"one shard", []string{"{t}/b", "{t}/a"}},
		{"across shards", []string{free, held}},
		{"a key held for reading", []string{"rw"}},
	} {
		for _, try := range []bool{false, true} {
			lockAll := s.LockAll
			if try {
				lockAll = s.TryLockAll
			}
			if m, err := lockAll(ctx, tc.keys...); !errors.Is(err, ErrAlreadyHeld) {
				if m != nil {
					_ = m.Unlock(ctx)
				}
				t.Fatalf("%s (try %v) of a key the reentrant session holds: %v, want ErrAlreadyHeld", tc.name, try, err)
			}
		}
	}
	for _, key := range []string{free, "{t}/b"} {
		if info, err := n.Inspect(ctx, key); err != nil || len(info.Holders)+len(info.Waiters) != 0 {
			t.Fatalf("a refused LockAll left %q taken: %+v, %v", key, info, err)
		}
	}
	// One Unlock gives each key back: no LockAll counted a hold.
	for _, l := range []*Lock{l, tagged, read} {
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if info, err := n.Inspect(ctx, l.Key()); err != nil || len(info.Holders) != 0 {
			t.Fatalf("%q still held after its only Unlock: %+v, %v", l.Key(), info, err)
		}
	}
}

// Reentrancy re-enters a mutex, read or write lock as the kind it is
// held; never an upgrade or a downgrade. A semaphore's permits are taken
// as grants of their own, reentrant session or not, and a take that
// needs the session's own permits back is refused as a deadlock.
func TestReentrancyRules(t *testing.T) {
	n, ctx := startPromiseCluster(t)
	for _, reentrant := range []bool{false, true} {
		var opts []SessionOption
		if reentrant {
			opts = append(opts, WithReentrant())
		}
		s := newTestSession(t, ctx, n, opts...)
		rw := s.RWMutex("rw")
		r, err := rw.RLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := rw.Lock(ctx); !errors.Is(err, ErrAlreadyHeld) {
			t.Fatalf("reentrant %v: an upgrade: %v, want ErrAlreadyHeld", reentrant, err)
		}
		_ = r.Unlock(ctx)
		w, err := rw.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := rw.RLock(ctx); !errors.Is(err, ErrAlreadyHeld) {
			t.Fatalf("reentrant %v: a downgrade: %v, want ErrAlreadyHeld", reentrant, err)
		}
		again, err := rw.Lock(ctx)
		switch {
		case reentrant && (err != nil || again.Token() != w.Token()):
			t.Fatalf("a reentrant write lock taken again: %v, want the same grant", err)
		case !reentrant && !errors.Is(err, ErrAlreadyHeld):
			t.Fatalf("a write lock taken again: %v, want ErrAlreadyHeld", err)
		}
		if again != nil {
			_ = again.Unlock(ctx)
		}
		_ = w.Unlock(ctx)

		sem := s.Semaphore("sem", 3)
		a, err := sem.Acquire(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		b, err := sem.Acquire(ctx, 1)
		if err != nil || b.Token() == a.Token() {
			t.Fatalf("reentrant %v: a second take of permits: %v, want a grant of its own", reentrant, err)
		}
		if err := a.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if b.Err() != nil {
			t.Fatalf("reentrant %v: one take's Unlock ended the other: %v", reentrant, b.Err())
		}
		if info, err := n.Inspect(ctx, "sem"); err != nil || len(info.Holders) != 1 || info.Holders[0].Token != b.Token() {
			t.Fatalf("reentrant %v: after one Unlock: %+v, %v, want the other take alone", reentrant, info, err)
		}
		// Taking 3 while holding 1 needs the session's own permit back,
		// which it cannot give while it waits: a deadlock.
		if _, err := sem.Acquire(ctx, 3); !errors.Is(err, ErrDeadlock) {
			t.Fatalf("reentrant %v: a wait for the session's own permits: %v, want ErrDeadlock", reentrant, err)
		}
		_ = b.Unlock(ctx)
	}
}

// A refused TryLockAll of keys on one shard names the key that is held,
// with its holder, not the group's first, free, key.
func TestTryLockAllNamesTheHeldKey(t *testing.T) {
	n, ctx := startPromiseCluster(t)
	holder, other := newTestSession(t, ctx, n), newTestSession(t, ctx, n)
	if _, err := holder.Lock(ctx, "{u}/b"); err != nil {
		t.Fatal(err)
	}
	_, err := other.TryLockAll(ctx, "{u}/a", "{u}/b", "{u}/c")
	le, ok := errors.AsType[*LockedError](err)
	if !ok || le.Key != "{u}/b" || len(le.Holders) != 1 || le.Holders[0].Session != holder.ID() {
		t.Fatalf("TryLockAll with {u}/b held: %v, want a LockedError for {u}/b naming its holder", err)
	}
}

// deadlineCtx is a context whose deadline the test decides: expire ends
// it with context.DeadlineExceeded, as a timeout does, at a moment of the
// test's choosing.
type deadlineCtx struct {
	context.Context
	done chan struct{}
}

func newDeadlineCtx(parent context.Context) *deadlineCtx {
	return &deadlineCtx{Context: parent, done: make(chan struct{})}
}

func (c *deadlineCtx) Done() <-chan struct{} { return c.done }
func (c *deadlineCtx) expire()               { close(c.done) }

func (c *deadlineCtx) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// A wait whose ctx ends returns a WaitError that wraps ctx's error and
// says whom it waited behind: the key's holders and how many waited
// ahead. It was not refused: it is no ErrLocked. A LockAll names the
// key of its group that was held.
func TestAWaitThatGivesUpSaysWhomItWaitedBehind(t *testing.T) {
	n, ctx := startPromiseCluster(t)
	holder, first, last := newTestSession(t, ctx, n), newTestSession(t, ctx, n), newTestSession(t, ctx, n)
	if _, err := holder.Lock(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	firstCtx, stopFirst := context.WithCancel(ctx)
	defer stopFirst()
	go func() { _, _ = first.Lock(firstCtx, "k") }()
	waitQueued(t, n, "k", 1)

	dctx := newDeadlineCtx(ctx)
	gaveUp := make(chan error, 1)
	go func() {
		_, err := last.Lock(dctx, "k")
		gaveUp <- err
	}()
	waitQueued(t, n, "k", 2)
	dctx.expire()
	err := <-gaveUp
	we, ok := errors.AsType[*WaitError](err)
	if !ok || !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrLocked) {
		t.Fatalf("a Lock whose ctx ended while it waited: %v, want a WaitError wrapping the deadline, not ErrLocked", err)
	}
	if we.Key != "k" || !we.Known || we.Ahead != 1 || len(we.Holders) != 1 || we.Holders[0].Session != holder.ID() {
		t.Fatalf("the WaitError: %+v, want k held by session %x with 1 waiting ahead", we, holder.ID())
	}

	if _, err := holder.Lock(ctx, "{g}/held"); err != nil {
		t.Fatal(err)
	}
	allCtx, stopAll := context.WithCancel(ctx)
	gaveUp = make(chan error, 1)
	go func() {
		_, err := last.LockAll(allCtx, "{g}/free", "{g}/held")
		gaveUp <- err
	}()
	waitQueued(t, n, "{g}/held", 1)
	stopAll()
	err = <-gaveUp
	we, ok = errors.AsType[*WaitError](err)
	if !ok || !errors.Is(err, context.Canceled) || we.Key != "{g}/held" || !we.Known || len(we.Holders) != 1 || we.Holders[0].Session != holder.ID() || we.Ahead != 0 {
		t.Fatalf("a LockAll whose ctx ended while it waited: %v (%+v), want a WaitError for {g}/held naming its holder", err, we)
	}
}
