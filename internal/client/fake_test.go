package client

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lockmesh/lockmesh/internal/lockerr"
	"github.com/lockmesh/lockmesh/lockfsm"

	"github.com/lockmesh/lockmesh/internal/clock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeClock is a Clock that moves only when the test says. Its timers run
// on the test's goroutine, from Advance; Jump moves the time without
// running them, as a pause does (or a timer goroutine not scheduled yet).
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
	// armed, when set, receives the time each AfterFunc or Reset sets a
	// timer for: a test learns when a loop has gone back to waiting.
	armed chan time.Time
}

type fakeTimer struct {
	c      *fakeClock
	when   time.Time
	f      func()
	active bool
}

var epoch = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

func newFakeClock() *fakeClock { return &fakeClock{now: epoch} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, when: c.now.Add(d), f: f, active: true}
	c.timers = append(c.timers, t)
	c.reportLocked(t.when)
	return t
}

func (c *fakeClock) reportLocked(when time.Time) {
	if c.armed != nil {
		c.armed <- when // buffered well beyond what a test arms
	}
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.active
	t.when, t.active = t.c.now.Add(d), true
	t.c.reportLocked(t.when)
	return was
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.active
	t.active = false
	return was
}

// Jump moves the clock by d and runs no timer.
func (c *fakeClock) Jump(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// Advance moves the clock by d, then runs the timers due by then, in the
// order of their times, each once.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []*fakeTimer
	for _, t := range c.timers {
		if t.active && !t.when.After(c.now) {
			t.active = false
			due = append(due, t)
		}
	}
	c.mu.Unlock()
	slices.SortStableFunc(due, func(a, b *fakeTimer) int { return a.when.Compare(b.when) })
	for _, t := range due {
		t.f()
	}
}

// The sentinels the client's errors wrap (node's public errors are these).
var (
	errLeaseExpired  = lockerr.LeaseExpired
	errSessionClosed = lockerr.SessionClosed
	errClosed        = lockerr.Closed
	errNotHeld       = lockerr.NotHeld
	errLocked        = lockerr.Locked
	errUnavailable   = lockerr.Unavailable
)

// fakeCluster answers a Client's commands as a one-replica cluster that
// grants every acquire at once, and records them. fail, when set, makes a
// command fail before it is recorded.
type fakeCluster struct {
	mu       sync.Mutex
	sessions uint64
	tokens   uint64
	commands []lockfsm.Command
	fail     func(lockfsm.Command) error
	closes   chan uint64 // each CloseSession's session

	// queue, when set, makes acquires of these keys queue instead of
	// being granted; queued receives each such acquire. The test says
	// what a read of a request finds with attempts (by request id); reads
	// receives each read's request id.
	queue    map[string]bool
	queued   chan lockfsm.Command
	attempts map[uint64]lockfsm.RequestInfo
	reads    chan uint64
}

// readAttempt answers ReadAttempt from attempts: a request it does not
// list cannot be read.
func (f *fakeCluster) readAttempt(_ context.Context, _ uint64, _ uint64, req uint64) (bool, lockfsm.RequestInfo, error) {
	f.mu.Lock()
	a, ok := f.attempts[req]
	reads := f.reads
	f.mu.Unlock()
	if reads != nil {
		reads <- req
	}
	if !ok {
		return false, lockfsm.RequestInfo{}, errors.New("the test set no state for this request")
	}
	return true, a, nil
}

func (f *fakeCluster) apply(ctx context.Context, shard uint64, cmd lockfsm.Command) (lockfsm.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		if err := f.fail(cmd); err != nil {
			return lockfsm.Result{}, err
		}
	}
	f.commands = append(f.commands, cmd)
	switch cmd.Op {
	case lockfsm.OpCloseSession:
		f.closes <- cmd.Session // buffered well beyond what a test closes
		return lockfsm.Result{Status: lockfsm.StatusOK}, nil
	case lockfsm.OpOpenSession:
		f.sessions++
		return lockfsm.Result{Status: lockfsm.StatusOK, Session: f.sessions}, nil
	case lockfsm.OpAcquire:
		if f.queue[cmd.Key] {
			f.queued <- cmd
			return lockfsm.Result{Status: lockfsm.StatusQueued}, nil
		}
		f.tokens++
		return lockfsm.Result{Status: lockfsm.StatusGranted, Token: f.tokens}, nil
	default:
		return lockfsm.Result{Status: lockfsm.StatusOK}, nil
	}
}

// keepAliveCall is one call of the Client's keepalive sender, answered by
// the test on reply.
type keepAliveCall struct {
	shard uint64
	ids   []uint64
	reply chan keepAliveReply
}

type keepAliveReply struct {
	expired []uint64
	err     error
}

// testClient is a Client on a fake cluster and fake clocks, with its
// background work waited for at the end of the test.
type testClient struct {
	*Client
	cluster *fakeCluster
	lease   *fakeClock // Config.Clock
	rounds  *fakeClock // Config.RoundClock; reports what it is armed for
	calls   chan keepAliveCall
	ctx     context.Context
	bg      *sync.WaitGroup // the Client's background work (Config.Go)
}

func newTestClient(t *testing.T, ttl time.Duration) *testClient {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stop := make(chan struct{})
	var wg sync.WaitGroup
	tc := &testClient{
		cluster: &fakeCluster{closes: make(chan uint64, 100)}, lease: newFakeClock(), rounds: newFakeClock(),
		calls: make(chan keepAliveCall, 16), ctx: ctx, bg: &wg,
	}
	tc.rounds.armed = make(chan time.Time, 1000)
	tc.Client = New(Config{
		Name: "p1", SessionTTL: ttl, LeaseMargin: ttl / 10, CloseTimeout: time.Second,
		Clock: tc.lease, RoundClock: tc.rounds, Log: slog.New(slog.DiscardHandler),
		Apply:       tc.cluster.apply,
		ReadAttempt: tc.cluster.readAttempt,
		KeepAlive: func(ctx context.Context, shard uint64, ids []uint64) ([]uint64, error) {
			call := keepAliveCall{shard: shard, ids: slices.Sorted(slices.Values(ids)), reply: make(chan keepAliveReply, 1)}
			tc.calls <- call
			select {
			case r := <-call.reply:
				return r.expired, r.err
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		},
		Go: func(f func(context.Context)) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				f(ctx)
			}()
		},
		Stop: stop,
	})
	t.Cleanup(func() {
		close(stop)
		cancel()
		wg.Wait()
	})
	return tc
}

// waitClosed returns the next n sessions closed on the fake cluster, in
// the order the closes arrived; closes run in the background.
func (tc *testClient) waitClosed(t *testing.T, n int) []uint64 {
	t.Helper()
	var out []uint64
	for range n {
		select {
		case id := <-tc.cluster.closes:
			out = append(out, id)
		case <-time.After(10 * time.Second):
			t.Fatalf("only %d of %d session closes reached the cluster within 10s: %v", len(out), n, out)
		}
	}
	return out
}

// noMoreClosed waits for the background work started so far and fails
// if it closed another session on the cluster. Call it only when nothing
// else is starting background work.
func (tc *testClient) noMoreClosed(t *testing.T) {
	t.Helper()
	tc.bg.Wait()
	select {
	case id := <-tc.cluster.closes:
		t.Fatalf("session %d closed on the cluster once more", id)
	default:
	}
}

// hold takes key on shard for o and returns the held lock.
func (tc *testClient) hold(t *testing.T, o *Session, shard uint64, key string) *Held {
	t.Helper()
	h, retry, err := o.Acquire(tc.ctx, shard, key, true, Spec{})
	if err != nil || retry || h == nil {
		t.Fatalf("Acquire %q on shard %d: %v (retry %v)", key, shard, err, retry)
	}
	return h
}

// doneNow reports whether h's Done channel is closed, without the lease
// check Done() makes: what a holder would see if nothing checked.
func doneNow(h *Held) bool {
	select {
	case <-h.done:
		return true
	default:
		return false
	}
}
