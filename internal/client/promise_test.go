package client

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/internal/level"
	"github.com/lockmesh/lockmesh/internal/lockerr"
	"github.com/lockmesh/lockmesh/lockfsm"

	"github.com/lockmesh/lockmesh/internal/clock"
)

// The promises docs/LOCKS.md makes about one session's own locks (issue
// 31), each tested at the moment a race between the session's goroutines
// would break it: the test holds that moment open with a hook or a gate,
// so the outcome does not depend on scheduling.

// promiseCluster is a stateCluster whose commands a test can intercept:
// through, when set, carries each entry's commands to the state, and may
// block, fail them, or lose their answer. unread makes reads of keys
// fail.
type promiseCluster struct {
	*stateCluster
	mu      sync.Mutex
	through func(ctx context.Context, cmds []lockfsm.Command, apply func() []lockfsm.Result) ([]lockfsm.Result, error)
	unread  bool
}

func (f *promiseCluster) carry(ctx context.Context, cmds []lockfsm.Command) ([]lockfsm.Result, error) {
	f.mu.Lock()
	through := f.through
	f.mu.Unlock()
	apply := func() []lockfsm.Result { return f.entry(cmds) }
	if through == nil {
		return apply(), nil
	}
	return through(ctx, cmds, apply)
}

func (f *promiseCluster) intercept(through func(ctx context.Context, cmds []lockfsm.Command, apply func() []lockfsm.Result) ([]lockfsm.Result, error)) {
	f.mu.Lock()
	f.through = through
	f.mu.Unlock()
}

func (f *promiseCluster) readKey(_ context.Context, _ uint64, key string) (lockfsm.KeyInfo, bool, error) {
	f.mu.Lock()
	unread := f.unread
	f.mu.Unlock()
	if unread {
		return lockfsm.KeyInfo{}, false, errors.New("no answer (the test's)")
	}
	f.stateCluster.mu.Lock()
	defer f.stateCluster.mu.Unlock()
	info, ok := f.s.Key(key)
	return info, ok, nil
}

// promiseClient is a Client over a promiseCluster whose test hooks report
// on settling each acquire that waits for its own session's release,
// withdrawal or ending hold, and on bgDone each background task that
// ends.
type promiseClient struct {
	*Client
	cluster  *promiseCluster
	ctx      context.Context
	settling chan string
	bgDone   chan struct{}
}

func newPromiseClient(t *testing.T) *promiseClient {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stop := make(chan struct{})
	var wg sync.WaitGroup
	f := &promiseCluster{stateCluster: &stateCluster{s: lockfsm.New()}}
	pc := &promiseClient{cluster: f, ctx: ctx, settling: make(chan string, 100), bgDone: make(chan struct{}, 100)}
	pc.Client = New(Config{
		Name: "p1", SessionTTL: time.Minute, LeaseMargin: time.Second, CloseTimeout: time.Second,
		Clock: clock.System{}, Log: slog.New(slog.DiscardHandler),
		Apply: func(ctx context.Context, _ uint64, cmd lockfsm.Command) (lockfsm.Result, error) {
			rs, err := f.carry(ctx, []lockfsm.Command{cmd})
			if err != nil {
				return lockfsm.Result{}, err
			}
			return rs[0], nil
		},
		ApplyGroup: func(ctx context.Context, _ uint64, cmds []lockfsm.Command) ([]lockfsm.Result, error) {
			return f.carry(ctx, cmds)
		},
		ReadAttempt: f.stateCluster.readAttempt,
		ReadKey:     f.readKey,
		KeepAlive:   func(context.Context, uint64, []uint64) ([]uint64, error) { return nil, nil },
		Go: func(fn func(context.Context)) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				fn(ctx)
				pc.bgDone <- struct{}{}
			}()
		},
		Stop:  stop,
		Level: func() level.Level { return level.Max },
	})
	f.c = pc.Client
	pc.hooks.settling = func(key string) { pc.settling <- key }
	t.Cleanup(func() {
		close(stop)
		cancel()
		wg.Wait()
	})
	return pc
}

// gate is a command held up until the test opens it.
type gate chan struct{}

func (g gate) pass(ctx context.Context) error {
	select {
	case <-g:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

type acquired struct {
	hs  []*Held
	err error
}

// oneHeld is h as a list: empty for none.
func oneHeld(h *Held) []*Held {
	if h == nil {
		return nil
	}
	return []*Held{h}
}

// settledFirst waits for the acquire answering on got to start waiting
// for its own session (settling), and fails the test if it answers first:
// it did not wait for what it must.
func (pc *promiseClient) settledFirst(t *testing.T, got <-chan acquired, what string) {
	t.Helper()
	select {
	case r := <-got:
		t.Fatalf("%s answered before what it must wait for was settled: %d grants, %v", what, len(r.hs), r.err)
	case <-pc.settling:
	}
}

func answer(t *testing.T, got <-chan acquired, what string) []*Held {
	t.Helper()
	r := <-got
	if r.err != nil || len(r.hs) == 0 {
		t.Fatalf("%s: %v", what, r.err)
	}
	return r.hs
}

// Item 2: an acquire whose ctx ended while it committed (granted, its
// answer lost) is withdrawn in the background. A retry of a key of it
// through the same session at once must wait for that withdrawal: sent
// before, it finds the session holding the key, and is refused as a
// deadlock of the session with itself (or queues behind itself). For a
// group, every key of it waits.
func TestRetryWaitsForTheWithdrawalOfItsAbandonedAttempt(t *testing.T) {
	for _, tc := range []struct {
		name      string
		abandoned []string
		retry     []string
	}{
		{"one key, retried", []string{"x"}, []string{"x"}},
		{"a group, one of its keys retried", []string{"x", "y"}, []string{"y"}},
		{"a group, retried as another group", []string{"x", "y"}, []string{"y", "z"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pc := newPromiseClient(t)
			o := mustSession(t, pc.Client)
			withdrawal := make(gate)
			var lost atomic.Bool
			pc.cluster.intercept(func(ctx context.Context, cmds []lockfsm.Command, apply func() []lockfsm.Result) ([]lockfsm.Result, error) {
				switch {
				case cmds[0].Op == lockfsm.OpAcquire && !lost.Swap(true):
					// It commits, granted; its caller's ctx ends before
					// the answer is in.
					apply()
					return nil, context.DeadlineExceeded
				case cmds[0].Op == lockfsm.OpCancel:
					if err := withdrawal.pass(ctx); err != nil {
						return nil, err
					}
				}
				return apply(), nil
			})
			first, err := acquireKeys(pc.ctx, o, tc.abandoned)
			if !errors.Is(err, context.DeadlineExceeded) || first != nil {
				t.Fatalf("the abandoned acquire: %v, want the deadline", err)
			}
			got := make(chan acquired, 1)
			go func() {
				hs, err := acquireKeys(pc.ctx, o, tc.retry)
				got <- acquired{hs, err}
			}()
			pc.settledFirst(t, got, "the retry")
			close(withdrawal)
			for _, h := range answer(t, got, "the retry") {
				if h.Err() != nil {
					t.Fatalf("the retry's grant of %q has ended: %v", h.Key(), h.Err())
				}
			}
		})
	}
}

// acquireKeys takes keys for o on shard 2 as mutexes checked for
// deadlocks: one key with Acquire, more with AcquireAll.
func acquireKeys(ctx context.Context, o *Session, keys []string) ([]*Held, error) {
	if len(keys) == 1 {
		h, _, err := o.Acquire(ctx, 2, keys[0], true, detail)
		if h == nil {
			return nil, err
		}
		return []*Held{h}, err
	}
	specs := make([]Spec, len(keys))
	for i := range specs {
		specs[i] = detail
	}
	hs, _, err := o.AcquireAll(ctx, 2, keys, specs, true)
	return hs, err
}

// Item 3: once a reentrant grant's last hold is left, the grant is on its
// way out. A re-lock in the window before its release goes out must not
// count a hold on it (its caller would hold a lock that is already
// ending), nor be told the key is held: it waits for the release and
// takes the key anew, with a new token.
func TestReentryAfterTheLastLeaveTakesTheKeyAnew(t *testing.T) {
	pc := newPromiseClient(t)
	o := mustSession(t, pc.Client)
	o.SetReentrant()
	h, _, err := o.Acquire(pc.ctx, 2, "k", true, detail)
	if err != nil {
		t.Fatal(err)
	}
	if !h.Leave() {
		t.Fatal("the only hold's Leave was not the last")
	}
	got := make(chan acquired, 1)
	go func() {
		again, _, err := o.Acquire(pc.ctx, 2, "k", true, detail)
		got <- acquired{oneHeld(again), err}
	}()
	pc.settledFirst(t, got, "the re-lock")
	if err := h.Unlock(pc.ctx); err != nil {
		t.Fatal(err)
	}
	again := answer(t, got, "the re-lock")[0]
	if again == h || again.Token() <= h.Token() || again.Err() != nil {
		t.Fatalf("the re-lock got token %d (the ending grant's: %v; err %v), want a new grant above %d", again.Token(), again == h, again.Err(), h.Token())
	}
}

// Item 3, generally: a hold whose Done closed (here as a maximum hold
// ends it: Done first, then the release) is no longer held. An acquire
// of the key in between waits for the release and takes the key anew,
// instead of failing with AlreadyHeld.
func TestAcquireAfterAnEndedHoldTakesTheKeyAnew(t *testing.T) {
	pc := newPromiseClient(t)
	o := mustSession(t, pc.Client)
	h, _, err := o.Acquire(pc.ctx, 2, "k", true, detail)
	if err != nil {
		t.Fatal(err)
	}
	if !h.claim(errors.New("held for its maximum (the test's)")) {
		t.Fatal("the hold had ended already")
	}
	got := make(chan acquired, 1)
	go func() {
		again, _, err := o.Acquire(pc.ctx, 2, "k", true, detail)
		got <- acquired{oneHeld(again), err}
	}()
	pc.settledFirst(t, got, "the acquire after the hold ended")
	h.releaseInBackground()
	if again := answer(t, got, "the acquire after the hold ended")[0]; again.Token() <= h.Token() {
		t.Fatalf("token %d, want a new grant above %d", again.Token(), h.Token())
	}
}

// Item 4: a release is registered before its hold is unlisted, so a try
// of the key through the same session in between finds the release in
// flight, waits for it, and is granted: never refused by its own release.
func TestTryLockDuringItsSessionsReleaseIsNotRefusedByIt(t *testing.T) {
	pc := newPromiseClient(t)
	o := mustSession(t, pc.Client)
	h, _, err := o.Acquire(pc.ctx, 2, "k", true, detail)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan acquired, 1)
	var once sync.Once
	early := make(chan acquired, 1)
	pc.hooks.unlisted = func(*Held) {
		once.Do(func() {
			// The hold is gone from the session; the release has not
			// been proposed.
			go func() {
				try, _, err := o.Acquire(pc.ctx, 2, "k", false, detail)
				got <- acquired{oneHeld(try), err}
			}()
			select {
			case r := <-got:
				early <- r
			case <-pc.settling:
			}
		})
	}
	if err := h.Release(); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-early:
		t.Fatalf("the try during the release answered before it committed: %v", r.err)
	default:
	}
	if try := answer(t, got, "the try during the release")[0]; try.Token() <= h.Token() {
		t.Fatalf("token %d, want a new grant above %d", try.Token(), h.Token())
	}
}

// Item 4: one session may have several releases of one key in flight (a
// semaphore's takes). An acquire waits for every one, not the last
// started: here the later release commits first, and the earlier one
// still holds a permit the try needs.
func TestAcquireWaitsForEveryReleaseOfTheKey(t *testing.T) {
	pc := newPromiseClient(t)
	o := mustSession(t, pc.Client)
	one := Spec{Kind: lockfsm.KindSemaphore, Limit: 2, Permits: 1}
	h1, _, err := o.Acquire(pc.ctx, 2, "sem", true, one)
	if err != nil {
		t.Fatal(err)
	}
	h2, _, err := o.Acquire(pc.ctx, 2, "sem", true, one)
	if err != nil {
		t.Fatal(err)
	}
	held := make(gate)
	pc.cluster.intercept(func(ctx context.Context, cmds []lockfsm.Command, apply func() []lockfsm.Result) ([]lockfsm.Result, error) {
		if cmds[0].Op == lockfsm.OpRelease && cmds[0].Target == h1.Req() {
			if err := held.pass(ctx); err != nil {
				return nil, err
			}
		}
		return apply(), nil
	})
	if err := h1.Release(); err != nil {
		t.Fatal(err)
	}
	if err := h2.Unlock(pc.ctx); err != nil {
		t.Fatal(err)
	}
	<-pc.bgDone // h2's release has ended; h1's waits at the gate
	got := make(chan acquired, 1)
	go func() {
		both, _, err := o.Acquire(pc.ctx, 2, "sem", false, Spec{Kind: lockfsm.KindSemaphore, Limit: 2, Permits: 2})
		got <- acquired{oneHeld(both), err}
	}()
	pc.settledFirst(t, got, "the try of both permits")
	close(held)
	if both := answer(t, got, "the try of both permits")[0]; both.Spec().Permits != 2 {
		t.Fatalf("granted %d permits, want 2", both.Spec().Permits)
	}
}

// Item 9: the state machine answers every key of a refused group Locked,
// the free ones too. The refusal names the first key somebody holds, with
// its holders; only when no key names any, the first key.
func TestRefusedGroupNamesAKeySomebodyHolds(t *testing.T) {
	pc := newPromiseClient(t)
	a, b := mustSession(t, pc.Client), mustSession(t, pc.Client)
	held, _, err := b.Acquire(pc.ctx, 2, "{u}/b", true, detail)
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{"{u}/a", "{u}/b", "{u}/c"}
	specs := []Spec{detail, detail, detail}
	_, _, err = a.AcquireAll(pc.ctx, 2, keys, specs, false)
	le, ok := errors.AsType[*lockerr.LockedError](err)
	if !ok || le.Key != "{u}/b" || len(le.Holders) != 1 || le.Holders[0].Token != held.Token() {
		t.Fatalf("refused group: %v, want a LockedError for {u}/b naming its holder", err)
	}
	// Without holders in the answer (as before FlagDetail), the first key.
	pc.cluster.intercept(func(_ context.Context, _ []lockfsm.Command, apply func() []lockfsm.Result) ([]lockfsm.Result, error) {
		rs := apply()
		for i := range rs {
			rs[i].Holders = nil
		}
		return rs, nil
	})
	_, _, err = a.AcquireAll(pc.ctx, 2, keys, specs, false)
	if le, ok := errors.AsType[*lockerr.LockedError](err); !ok || le.Key != "{u}/a" {
		t.Fatalf("refused group without holders: %v, want a LockedError for the first key", err)
	}
}

// Item 10: a wait whose ctx ends says whom it waited behind, from a read
// of the key made then, and wraps ctx's error; a read that fails leaves
// the details out but keeps the error.
func TestAWaitThatGivesUpSaysWhomItWaitedBehind(t *testing.T) {
	pc := newPromiseClient(t)
	a, b, c := mustSession(t, pc.Client), mustSession(t, pc.Client), mustSession(t, pc.Client)
	holder, _, err := a.Acquire(pc.ctx, 2, "k", true, detail)
	if err != nil {
		t.Fatal(err)
	}
	queued := make(chan struct{}, 2)
	pc.cluster.intercept(func(_ context.Context, cmds []lockfsm.Command, apply func() []lockfsm.Result) ([]lockfsm.Result, error) {
		rs := apply()
		if cmds[0].Op == lockfsm.OpAcquire && rs[0].Status == lockfsm.StatusQueued {
			queued <- struct{}{}
		}
		return rs, nil
	})
	bctx, stopB := context.WithCancel(pc.ctx)
	defer stopB()
	bDone := make(chan error, 1)
	go func() {
		_, _, err := b.Acquire(bctx, 2, "k", true, detail)
		bDone <- err
	}()
	<-queued
	cctx, stopC := context.WithCancel(pc.ctx)
	cDone := make(chan error, 1)
	go func() {
		_, _, err := c.Acquire(cctx, 2, "k", true, detail)
		cDone <- err
	}()
	<-queued
	stopC()
	err = <-cDone
	we, ok := errors.AsType[*WaitError](err)
	if !ok || !errors.Is(err, context.Canceled) || errors.Is(err, lockerr.Locked) {
		t.Fatalf("the wait that gave up: %v, want a WaitError wrapping context.Canceled, not Locked", err)
	}
	if we.Key != "k" || !we.Known || we.Ahead != 1 || len(we.Holders) != 1 || we.Holders[0].Token != holder.Token() {
		t.Fatalf("the wait that gave up: %+v, want k held by token %d with 1 waiting ahead", we, holder.Token())
	}

	// The read fails: the wait still ends with ctx's error.
	pc.cluster.mu.Lock()
	pc.cluster.unread = true
	pc.cluster.mu.Unlock()
	stopB()
	err = <-bDone
	if we, ok := errors.AsType[*WaitError](err); !ok || !errors.Is(err, context.Canceled) || we.Known || we.Key != "k" || len(we.Holders) != 0 {
		t.Fatalf("the wait that gave up, unread: %v (%+v), want a WaitError for k wrapping context.Canceled without details", err, we)
	}
}

// A wait whose ctx ends while its request is in flight (queued by the
// cluster, the answer not back yet) gave up waiting too: the same
// WaitError, for a key as for a group, and its attempts leave the queue.
func TestAWaitThatGivesUpInFlightSaysWhomItWaitedBehind(t *testing.T) {
	pc := newPromiseClient(t)
	a, b := mustSession(t, pc.Client), mustSession(t, pc.Client)
	holder, _, err := a.Acquire(pc.ctx, 2, "{g}/held", true, detail)
	if err != nil {
		t.Fatal(err)
	}
	queued := make(chan struct{}, 1)
	pc.cluster.intercept(func(ctx context.Context, cmds []lockfsm.Command, apply func() []lockfsm.Result) ([]lockfsm.Result, error) {
		rs := apply()
		if cmds[0].Op != lockfsm.OpAcquire || rs[len(rs)-1].Status != lockfsm.StatusQueued {
			return rs, nil
		}
		queued <- struct{}{}
		<-ctx.Done() // the answer is lost on its way back
		return nil, ctx.Err()
	})
	for _, keys := range [][]string{{"{g}/held"}, {"{g}/free", "{g}/held"}} {
		ctx, stop := context.WithCancel(pc.ctx)
		done := make(chan error, 1)
		go func() {
			var err error
			if len(keys) == 1 {
				_, _, err = b.Acquire(ctx, 2, keys[0], true, detail)
			} else {
				_, _, err = b.AcquireAll(ctx, 2, keys, []Spec{detail, detail}, true)
			}
			done <- err
		}()
		<-queued
		stop()
		err := <-done
		we, ok := errors.AsType[*WaitError](err)
		if !ok || !errors.Is(err, context.Canceled) || we.Key != "{g}/held" || !we.Known || len(we.Holders) != 1 || we.Holders[0].Token != holder.Token() {
			t.Fatalf("%v gave up in flight: %v (%+v), want a WaitError for {g}/held naming its holder", keys, err, we)
		}
		<-pc.bgDone // the withdrawal
		if info, _, err := pc.cluster.readKey(pc.ctx, 2, "{g}/held"); err != nil || len(info.Waiters) != 0 {
			t.Fatalf("%v gave up in flight: {g}/held's waiters after the withdrawal: %+v (%v), want none", keys, info.Waiters, err)
		}
	}
}
