package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/internal/level"
	"github.com/lockmesh/lockmesh/internal/lockerr"
	"github.com/lockmesh/lockmesh/lockfsm"

	"github.com/lockmesh/lockmesh/internal/clock"
)

// stateCluster answers a Client's commands from a real lock state, one
// entry per call, and hands grants made by hand-off to the Client's
// waiters as the leader's notices would.
type stateCluster struct {
	mu    sync.Mutex
	s     *lockfsm.State
	index uint64
	c     *Client
	// fast skips the invariant check after each entry, which costs
	// O(state): benchmarks measure the client, not the check.
	fast bool
}

func (f *stateCluster) entry(cmds []lockfsm.Command) []lockfsm.Result {
	f.mu.Lock()
	f.index++
	rs, gs := f.s.Apply(f.index, cmds)
	if !f.fast {
		if err := f.s.Verify(); err != nil {
			panic(err)
		}
	}
	f.mu.Unlock()
	for _, g := range gs {
		if g.HandOff {
			f.c.Waiters().Wake(WaiterKey{Shard: 2, Session: g.Session, Req: g.Req}, g.Token)
		}
	}
	return rs
}

func (f *stateCluster) apply(_ context.Context, _ uint64, cmd lockfsm.Command) (lockfsm.Result, error) {
	return f.entry([]lockfsm.Command{cmd})[0], nil
}

func (f *stateCluster) applyGroup(_ context.Context, _ uint64, cmds []lockfsm.Command) ([]lockfsm.Result, error) {
	return f.entry(cmds), nil
}

func (f *stateCluster) readAttempt(_ context.Context, _, session, req uint64) (bool, lockfsm.RequestInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	info, ok := f.s.Request(session, req)
	return ok, info, nil
}

// newStateClient is a Client over a stateCluster, on Go's clock (these
// tests wait for grants, not for leases).
func newStateClient(t testing.TB) (*Client, *stateCluster, context.Context) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stop := make(chan struct{})
	var wg sync.WaitGroup
	f := &stateCluster{s: lockfsm.New()}
	f.c = New(Config{
		Name: "p1", SessionTTL: time.Minute, LeaseMargin: time.Second, CloseTimeout: time.Second,
		Clock: clock.System{}, Log: slog.New(slog.DiscardHandler),
		Apply: f.apply, ApplyGroup: f.applyGroup, ReadAttempt: f.readAttempt,
		KeepAlive: func(context.Context, uint64, []uint64) ([]uint64, error) { return nil, nil },
		Go: func(fn func(context.Context)) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				fn(ctx)
			}()
		},
		Stop:  stop,
		Level: func() level.Level { return level.Max },
	})
	t.Cleanup(func() {
		close(stop)
		cancel()
		wg.Wait()
	})
	return f.c, f, ctx
}

func mustSession(t testing.TB, c *Client) *Session {
	t.Helper()
	o, err := c.NewSession(time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

var detail = Spec{Flags: lockfsm.FlagDetail | lockfsm.FlagDeadlock}

// A reentrant Session taking a key it holds gets the same grant with one
// more hold; the last Leave says to release. Another kind, or a
// non-reentrant Session, is refused with AlreadyHeld.
func TestReentrantSession(t *testing.T) {
	c, _, ctx := newStateClient(t)
	o := mustSession(t, c)
	o.SetReentrant()
	h1, _, err := o.Acquire(ctx, 2, "k", true, detail)
	if err != nil {
		t.Fatal(err)
	}
	h2, _, err := o.Acquire(ctx, 2, "k", true, detail)
	if err != nil || h2 != h1 {
		t.Fatalf("re-entry: %v, same grant %v", err, h2 == h1)
	}
	if _, _, err := o.Acquire(ctx, 2, "k", true, Spec{Kind: lockfsm.KindRead}); !errors.Is(err, lockerr.AlreadyHeld) {
		t.Fatalf("re-entry as another kind: %v, want AlreadyHeld", err)
	}
	if h1.Leave() || !h1.Leave() {
		t.Fatal("two holds must need two Leaves, the second the last")
	}

	plain := mustSession(t, c)
	if _, _, err := plain.Acquire(ctx, 2, "p", true, detail); err != nil {
		t.Fatal(err)
	}
	if _, _, err := plain.Acquire(ctx, 2, "p", true, detail); !errors.Is(err, lockerr.AlreadyHeld) {
		t.Fatalf("re-entry without WithReentrant: %v, want AlreadyHeld", err)
	}
}

// A refused try names the holders; the state machine's other refusals
// come back as their sentinels.
func TestRefusalsAreTyped(t *testing.T) {
	c, f, ctx := newStateClient(t)
	a, b := mustSession(t, c), mustSession(t, c)
	held, _, err := a.Acquire(ctx, 2, "x", true, detail)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = b.Acquire(ctx, 2, "x", false, detail)
	var le *lockerr.LockedError
	if !errors.As(err, &le) || !errors.Is(err, lockerr.Locked) || len(le.Holders) != 1 || le.Holders[0].Token != held.Token() || le.Holders[0].Label != a.Label() {
		t.Fatalf("refused try: %v (%+v), want a LockedError naming the holder", err, le)
	}
	if _, _, err := b.Acquire(ctx, 2, "x", true, Spec{Kind: lockfsm.KindSemaphore, Limit: 2}); !errors.Is(err, lockerr.KindMismatch) {
		t.Fatalf("semaphore on a mutex key: %v, want KindMismatch", err)
	}
	if _, _, err := a.Acquire(ctx, 2, "s", true, Spec{Kind: lockfsm.KindSemaphore, Limit: 3}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.Acquire(ctx, 2, "s", true, Spec{Kind: lockfsm.KindSemaphore, Limit: 4}); !errors.Is(err, lockerr.LimitMismatch) {
		t.Fatalf("semaphore of another size: %v, want LimitMismatch", err)
	}
	// b holds y and a waits for it; b waiting for x closes the cycle.
	if _, _, err := b.Acquire(ctx, 2, "y", true, detail); err != nil {
		t.Fatal(err)
	}
	waitCtx, cancel := context.WithCancel(ctx)
	waited := make(chan struct{})
	defer func() { cancel(); <-waited }() // its withdrawal starts before the Client stops
	go func() {
		defer close(waited)
		_, _, _ = a.Acquire(waitCtx, 2, "y", true, detail)
	}()
	waitFor(t, func() bool { f.mu.Lock(); defer f.mu.Unlock(); info, _ := f.s.Key("y"); return len(info.Waiters) == 1 })
	if _, _, err := b.Acquire(ctx, 2, "x", true, detail); !errors.Is(err, lockerr.Deadlock) {
		t.Fatalf("b waiting for x while a waits for y: %v, want Deadlock", err)
	}
}

// AcquireAll takes a group in one entry; a group that must wait is
// granted whole by the release that frees its last key; a cancelled one
// leaves nothing queued or held.
func TestAcquireAll(t *testing.T) {
	c, f, ctx := newStateClient(t)
	a, b := mustSession(t, c), mustSession(t, c)
	specs := []Spec{detail, detail, detail}
	hs, _, err := a.AcquireAll(ctx, 2, []string{"x", "y", "z"}, specs, true)
	if err != nil || len(hs) != 3 || !(hs[0].Token() < hs[1].Token() && hs[1].Token() < hs[2].Token()) {
		t.Fatalf("AcquireAll: %v, %d grants", err, len(hs))
	}
	if _, _, err := b.AcquireAll(ctx, 2, []string{"w", "z"}, specs[:2], false); !errors.Is(err, lockerr.Locked) {
		t.Fatalf("TryLockAll over a held key: %v, want Locked", err)
	}
	if info, ok := f.s.Key("w"); ok { // nothing runs in the background here
		t.Fatalf("a refused group left w %+v", info)
	}

	got := make(chan []*Held, 1)
	go func() {
		hs, _, err := b.AcquireAll(ctx, 2, []string{"w", "z"}, specs[:2], true)
		if err != nil {
			t.Error(err)
		}
		got <- hs
	}()
	waitFor(t, func() bool { f.mu.Lock(); defer f.mu.Unlock(); info, _ := f.s.Key("z"); return len(info.Waiters) == 1 })
	if err := hs[2].Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case bh := <-got:
		if len(bh) != 2 || bh[1].Token() <= hs[2].Token() {
			t.Fatalf("the waiting group got %d grants", len(bh))
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the group was not granted after its last key was released")
	}

	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, _, err := a.AcquireAll(cctx, 2, []string{"v", "w"}, specs[:2], true)
		done <- err
	}()
	waitFor(t, func() bool { f.mu.Lock(); defer f.mu.Unlock(); info, _ := f.s.Key("w"); return len(info.Waiters) == 1 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled AcquireAll: %v", err)
	}
	waitFor(t, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		_, v := f.s.Key("v")
		info, _ := f.s.Key("w")
		return !v && len(info.Waiters) == 0
	})
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 30s")
		}
		time.Sleep(time.Millisecond)
	}
}

// A grant with a maximum hold is given up a margin before the maximum,
// counted from the send time of its Acquire: Done closes with
// LeaseExpired and the release goes to the cluster at once.
func TestMaxHoldEndsTheGrant(t *testing.T) {
	tc := newTestClient(t, 10*time.Second) // LeaseMargin 1s
	o, err := tc.NewSession(time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	h, _, err := o.Acquire(tc.ctx, 2, "k", true, Spec{MaxHold: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if acq := tc.cluster.commands[len(tc.cluster.commands)-1]; acq.Op != lockfsm.OpAcquire || acq.MaxHoldMillis != 10_000 {
		t.Fatalf("the acquire sent %+v, want MaxHoldMillis 10000", acq)
	}
	tc.lease.Advance(9*time.Second - time.Nanosecond)
	if doneNow(h) || h.Err() != nil {
		t.Fatalf("given up before the maximum less the margin: %v", h.Err())
	}
	tc.lease.Advance(time.Nanosecond)
	if !doneNow(h) || !errors.Is(h.Err(), lockerr.LeaseExpired) || !strings.Contains(h.Err().Error(), "maximum") {
		t.Fatalf("at the maximum less the margin: done %v, err %v", doneNow(h), h.Err())
	}
	tc.bg.Wait()
	tc.cluster.mu.Lock()
	last := tc.cluster.commands[len(tc.cluster.commands)-1]
	tc.cluster.mu.Unlock()
	if last.Op != lockfsm.OpRelease || last.Target != h.Req() {
		t.Fatalf("the last command was %+v, want the release of the ended grant", last)
	}
	// A grant checked after a pause past its deadline is given up at once.
	h2, _, err := o.Acquire(tc.ctx, 2, "k2", true, Spec{MaxHold: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	tc.lease.Jump(time.Hour)
	select {
	case <-h2.Done():
	default:
		t.Fatal("Done open after a pause past the maximum")
	}
}

// A session finds its hold of a key by the key, whatever else it holds:
// several holds of one key (a semaphore's permits, taken one by one) are
// each found until the last is given back.
func TestHeldOfFollowsEveryHold(t *testing.T) {
	c, _, ctx := newStateClient(t)
	o := mustSession(t, c)
	sem := Spec{Kind: lockfsm.KindSemaphore, Limit: 3, Permits: 1}
	a, _, err := o.Acquire(ctx, 2, "sem", true, sem)
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := o.Acquire(ctx, 2, "sem", true, sem)
	if err != nil {
		t.Fatal(err)
	}
	other, _, err := o.Acquire(ctx, 2, "other", true, Spec{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := o.OnShard(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		unlock *Held
		key    string
		want   []*Held // any of them
	}{
		{nil, "sem", []*Held{a, b}},
		{a, "sem", []*Held{b}},
		{nil, "other", []*Held{other}},
		{b, "sem", nil},
		{other, "other", nil},
	} {
		if step.unlock != nil {
			if err := step.unlock.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
		got := s.heldOf(step.key)
		if (got == nil) != (len(step.want) == 0) || (got != nil && !slices.Contains(step.want, got)) {
			t.Fatalf("heldOf(%q) = %p, want one of %p", step.key, got, step.want)
		}
	}
}

// BenchmarkAcquireWithHeldLocks takes and gives back one lock while the
// same session holds n others: its cost must not grow with n.
//
//	go test -run '^$' -bench AcquireWithHeldLocks ./internal/client/
func BenchmarkAcquireWithHeldLocks(b *testing.B) {
	for _, n := range []int{100, 100_000} {
		b.Run(fmt.Sprintf("held=%d", n), func(b *testing.B) {
			c, f, ctx := newStateClient(b)
			f.fast = true
			o := mustSession(b, c)
			for i := range n {
				if h, _, err := o.Acquire(ctx, 2, fmt.Sprintf("held/%d", i), true, Spec{}); err != nil || h == nil {
					b.Fatalf("lock %d of %d: %v (nil: the session was lost)", i, n, err)
				}
			}
			i := 0
			for b.Loop() {
				h, _, err := o.Acquire(ctx, 2, fmt.Sprintf("k/%d", i), true, Spec{})
				if err != nil || h == nil {
					b.Fatalf("lock: %v (nil: the session was lost)", err)
				}
				if err := h.Unlock(ctx); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}
