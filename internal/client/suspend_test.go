package client

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/internal/lockerr"
	"github.com/lockmesh/lockmesh/lockfsm"

	"github.com/lockmesh/lockmesh/internal/clock"
)

// resumeClock is node's lease clock on a machine that gets suspended: Now
// counts real time plus every suspension so far, as CLOCK_BOOTTIME does
// (internal/clock's Boot), and AfterFunc is Go's, whose timers, like Go's
// monotonic clock, do not see a suspension. Suspend is a resume from one:
// the clock jumps while, in Go's terms, no time passes.
type resumeClock struct {
	start     time.Time // with its monotonic reading
	suspended atomic.Int64
}

func newResumeClock() *resumeClock { return &resumeClock{start: time.Now()} }

func (c *resumeClock) Now() time.Time {
	return c.start.Round(0).Add(time.Since(c.start) + time.Duration(c.suspended.Load()))
}

func (c *resumeClock) AfterFunc(d time.Duration, f func()) clock.Timer { return time.AfterFunc(d, f) }

// Suspend moves the clock on by d, as waking from a suspension of d does.
func (c *resumeClock) Suspend(d time.Duration) { c.suspended.Add(int64(d)) }

// resumeClient is a Client on a fake cluster and a resumeClock, with its
// background work waited for at the end of the test. No keepalives run:
// the test delivers them.
type resumeClient struct {
	*Client
	cluster *fakeCluster
	clock   *resumeClock
	ctx     context.Context
	bg      *sync.WaitGroup
}

func newResumeClient(t *testing.T, ttl time.Duration) *resumeClient {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stop := make(chan struct{})
	rc := &resumeClient{cluster: &fakeCluster{closes: make(chan uint64, 100)}, clock: newResumeClock(), ctx: ctx, bg: &sync.WaitGroup{}}
	rc.Client = New(Config{
		Name: "p1", SessionTTL: ttl, LeaseMargin: ttl / 10, CloseTimeout: time.Second,
		Clock: rc.clock, RoundClock: clock.System{}, Log: slog.New(slog.DiscardHandler),
		Apply:       rc.cluster.apply,
		ReadAttempt: rc.cluster.readAttempt,
		KeepAlive: func(context.Context, uint64, []uint64) ([]uint64, error) {
			return nil, errors.New("no keepalives in this test")
		},
		Go: func(f func(context.Context)) {
			rc.bg.Go(func() { f(ctx) })
		},
		Stop: stop,
	})
	t.Cleanup(func() {
		close(stop)
		cancel()
		rc.bg.Wait()
	})
	return rc
}

// hold takes key on shard 2 for o as spec asks.
func (rc *resumeClient) hold(t *testing.T, o *Session, key string, spec Spec) *Held {
	t.Helper()
	h, retry, err := o.Acquire(rc.ctx, 2, key, true, spec)
	if err != nil || retry || h == nil {
		t.Fatalf("Acquire %q: %v (retry %v)", key, err, retry)
	}
	return h
}

// A holder woken from a suspension longer than its lease finds its lock
// lost at the first Done or Err, although no timer has run: Go's timers,
// like Go's monotonic clock, did not see the suspension. Counted on Go's
// monotonic clock, the lease would still have most of its minute left.
func TestResumePastTheLeaseEndsTheLockAtOnce(t *testing.T) {
	rc := newResumeClient(t, time.Minute) // margin 6s
	o, _ := rc.NewSession(time.Minute)
	h := rc.hold(t, o, "k", Spec{})
	select {
	case <-h.Done():
		t.Fatalf("lost before any suspension: %v", h.Err())
	default:
	}

	rc.clock.Suspend(time.Minute)
	if doneNow(h) {
		t.Fatal("test broken: something closed Done before the holder checked")
	}
	select {
	case <-h.Done():
	default:
		t.Fatal("Done open after a resume past the lease deadline")
	}
	if err := h.Err(); !errors.Is(err, lockerr.LeaseExpired) || LossReason(err) != LossDeadline {
		t.Fatalf("Err() = %v (reason %q), want the lease-expired error of a passed deadline", err, LossReason(err))
	}
	// The session is given up on the cluster at once, so the key passes
	// on without waiting for the leader's expiry.
	select {
	case id := <-rc.cluster.closes:
		if id != h.Session().ID() {
			t.Fatalf("closed session %d, want %d", id, h.Session().ID())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the lost session was not closed on the cluster within 10s")
	}
}

// A grant with a maximum hold that passed during a suspension is given
// up at the first Done or Err after the resume, and its release goes to
// the cluster, while the session's lease, an hour long, still holds.
func TestResumePastTheMaxHoldEndsTheGrantAtOnce(t *testing.T) {
	rc := newResumeClient(t, time.Hour) // LeaseMargin 6m
	o, _ := rc.NewSession(time.Hour)
	h := rc.hold(t, o, "k", Spec{MaxHold: 30 * time.Minute}) // given up at 24m
	if h.Err() != nil {
		t.Fatalf("lost before any suspension: %v", h.Err())
	}

	rc.clock.Suspend(27 * time.Minute)
	if doneNow(h) {
		t.Fatal("test broken: something closed Done before the holder checked")
	}
	if err := h.Err(); !errors.Is(err, lockerr.LeaseExpired) || !strings.Contains(err.Error(), "maximum") {
		t.Fatalf("Err() = %v after a resume past the maximum hold, want the lease-expired error of the maximum", err)
	}
	select {
	case <-h.Done():
	default:
		t.Fatal("Err reported the loss but Done is open")
	}
	if err := o.Err(); err != nil {
		t.Fatalf("the Session ended (%v): only the hold had run out", err)
	}
	rc.bg.Wait()
	rc.cluster.mu.Lock()
	last := rc.cluster.commands[len(rc.cluster.commands)-1]
	rc.cluster.mu.Unlock()
	if last.Op != lockfsm.OpRelease || last.Target != h.Req() {
		t.Fatalf("the last command was %+v, want the release of the ended grant", last)
	}
}

// A keepalive sent before a suspension and acknowledged after it does not
// revive a lease that ran out meanwhile: on Go's monotonic clock the
// acknowledgement would arrive well inside the lease and move it a whole
// TTL on.
func TestAckAcrossASuspensionDoesNotRevive(t *testing.T) {
	rc := newResumeClient(t, time.Minute)
	o, _ := rc.NewSession(time.Minute)
	h := rc.hold(t, o, "k", Spec{})
	sent := rc.clock.Now()
	rc.clock.Suspend(2 * time.Minute)
	h.Session().Extend(sent)
	if !doneNow(h) || !errors.Is(h.Err(), lockerr.LeaseExpired) {
		t.Fatalf("after an ack across the suspension: done %v, Err %v; want the lease lost", doneNow(h), h.Err())
	}
}

// A holder already blocked on Done when the machine was suspended is
// woken by the first keepalive round after the resume: its deadline timer,
// a Go timer, would fire only when the rest of the lease has passed in
// Go's terms, which did not count the suspension.
func TestResumeWakesABlockedHolderAtTheNextRound(t *testing.T) {
	rc := newResumeClient(t, time.Minute)
	o, _ := rc.NewSession(time.Minute)
	h := rc.hold(t, o, "k", Spec{})
	rc.clock.Suspend(time.Minute)
	// doneNow looks at the channel a blocked holder waits on, without
	// the check Done makes.
	if doneNow(h) {
		t.Fatal("test broken: Done closed before any check")
	}
	rc.round(rc.ctx, rc.live(), time.Second)
	if !doneNow(h) {
		t.Fatal("a keepalive round after the resume left the blocked holder's Done open")
	}
	if err := o.Err(); !errors.Is(err, lockerr.LeaseExpired) {
		t.Fatalf("Session error %v, want the lease lost", err)
	}
}

// A holder already blocked on the Done of a grant whose maximum passed
// while the machine was suspended is woken by the first keepalive round
// after the resume, which sees the lease clock ahead of Go's.
func TestResumeWakesABlockedMaxHoldAtTheNextRound(t *testing.T) {
	rc := newResumeClient(t, time.Hour)
	o, _ := rc.NewSession(time.Hour)
	h := rc.hold(t, o, "k", Spec{MaxHold: 30 * time.Minute})
	rc.round(rc.ctx, rc.live(), time.Second) // the readings to compare with
	rc.clock.Suspend(27 * time.Minute)
	if doneNow(h) {
		t.Fatal("test broken: Done closed before any check")
	}
	rc.round(rc.ctx, rc.live(), time.Second)
	if !doneNow(h) {
		t.Fatal("a keepalive round after the resume left the blocked max-hold's Done open")
	}
	if err := o.Err(); err != nil {
		t.Fatalf("the Session ended (%v): only the hold had run out", err)
	}
}
