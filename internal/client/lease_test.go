package client

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/internal/lockerr"
	"github.com/lockmesh/lockmesh/lockfsm"
)

func TestMargin(t *testing.T) {
	for _, c := range []struct{ ttl, leaseMargin, want time.Duration }{
		{time.Second, 100 * time.Millisecond, 100 * time.Millisecond},
		{time.Second, 300 * time.Millisecond, 300 * time.Millisecond}, // LeaseMargin when larger
		{time.Minute, time.Second, 6 * time.Second},                   // a tenth of a long TTL
	} {
		if got := Margin(c.ttl, c.leaseMargin); got != c.want {
			t.Errorf("Margin(%v, %v) = %v, want %v", c.ttl, c.leaseMargin, got, c.want)
		}
	}
}

// The holder's rules of docs/SAFETY.md as pure arithmetic: the deadline is
// sent + TTL - margin, moves only forward, and is never revived.
func TestLeaseRules(t *testing.T) {
	const ttl, margin = time.Second, 100 * time.Millisecond
	t0 := epoch
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	l := NewLease(ttl, margin, t0)
	if l.Deadline() != at(900*time.Millisecond) {
		t.Fatalf("open sent at t0: deadline %v after t0, want 900ms", l.Deadline().Sub(t0))
	}
	if l.Passed(at(900*time.Millisecond-1)) || !l.Passed(at(900*time.Millisecond)) {
		t.Fatal("the lease must run out exactly at its deadline")
	}

	// An ack extends from the send time, not from its arrival.
	if !l.Extend(at(300*time.Millisecond), at(800*time.Millisecond)) {
		t.Fatal("an ack before the deadline was refused")
	}
	if l.Deadline() != at(1200*time.Millisecond) {
		t.Fatalf("ack of a keepalive sent at 300ms: deadline %v, want 1.2s", l.Deadline().Sub(t0))
	}

	// A late ack of an older keepalive never moves the deadline back.
	if !l.Extend(at(100*time.Millisecond), at(1000*time.Millisecond)) || l.Deadline() != at(1200*time.Millisecond) {
		t.Fatalf("older ack moved the deadline to %v, want it kept at 1.2s", l.Deadline().Sub(t0))
	}

	// Once the deadline has passed, an ack (even of a keepalive sent just
	// now) does not revive it.
	if l.Extend(at(1200*time.Millisecond), at(1200*time.Millisecond)) {
		t.Fatal("an ack at the deadline revived the lease")
	}
	if l.Extend(at(1500*time.Millisecond), at(1600*time.Millisecond)) || l.Deadline() != at(1200*time.Millisecond) {
		t.Fatalf("an ack after the deadline moved it to %v", l.Deadline().Sub(t0))
	}
}

// An acknowledgement that arrives after the lease deadline, before the
// deadline timer ran, must not revive the lease: the holder may already
// have been told it is lost, and the leader may be expiring the session.
// (Moved here from node/unlock_test.go with the lease logic.)
func TestExtendNeverRevivesAPassedDeadline(t *testing.T) {
	tc := newTestClient(t, time.Second) // margin 100ms
	o, _ := tc.NewSession(time.Second)
	h := tc.hold(t, o, 2, "k")
	s := h.Session()

	// Control: an ack before the deadline extends it.
	tc.lease.Jump(500 * time.Millisecond)
	s.Extend(tc.lease.Now())
	tc.lease.Jump(500 * time.Millisecond) // 1s after the open, 0.5s after the ack
	if err := h.Err(); err != nil {
		t.Fatalf("lease lost although extended before its deadline: %v", err)
	}

	// The deadline (TTL - margin after the ack) passes; the timer has not
	// run. An ack arrives now, for a keepalive sent just now: taken at
	// face value it would move the deadline 0.9s ahead.
	tc.lease.Jump(950 * time.Millisecond)
	s.Extend(tc.lease.Now())
	if !doneNow(h) { // the channel itself: Done() would check the deadline
		t.Fatal("a late acknowledgement revived a lease whose deadline had passed")
	}
	if !errors.Is(h.Err(), errLeaseExpired) {
		t.Fatalf("Err() = %v, want the lease-expired error", h.Err())
	}
	if !s.isLost() {
		t.Fatal("session not lost")
	}
}

// Extend sets the deadline to sent + TTL - margin and never moves it back;
// the deadline timer follows it.
func TestExtendMovesTheDeadlineForwardOnly(t *testing.T) {
	tc := newTestClient(t, time.Second)
	o, _ := tc.NewSession(2 * time.Second) // margin max(100ms, 200ms) = 200ms
	h := tc.hold(t, o, 2, "k")
	s := h.Session()
	opened := epoch
	if got := s.Deadline(); got != opened.Add(1800*time.Millisecond) {
		t.Fatalf("deadline %v after the open, want TTL - margin = 1.8s", got.Sub(opened))
	}
	tc.lease.Jump(time.Second)
	sent := tc.lease.Now()
	tc.lease.Jump(300 * time.Millisecond) // the ack takes 300ms
	s.Extend(sent)
	if got := s.Deadline(); got != sent.Add(1800*time.Millisecond) {
		t.Fatalf("deadline %v after the send, want 1.8s (from the send, not the ack)", got.Sub(sent))
	}
	s.Extend(opened.Add(500 * time.Millisecond)) // an older keepalive's ack, late
	if got := s.Deadline(); got != sent.Add(1800*time.Millisecond) {
		t.Fatalf("an older ack moved the deadline back by %v", sent.Add(1800*time.Millisecond).Sub(got))
	}
	// The deadline timer follows the deadline: nothing happens at the old
	// one, and the lock is lost at the new one without anyone asking.
	tc.lease.Advance(opened.Add(1800 * time.Millisecond).Sub(tc.lease.Now()))
	if doneNow(h) {
		t.Fatalf("lost at the old deadline: %v", h.Err())
	}
	tc.lease.Advance(sent.Add(1800 * time.Millisecond).Sub(tc.lease.Now()))
	if !doneNow(h) || !errors.Is(h.Err(), errLeaseExpired) {
		t.Fatalf("at the new deadline: done %v, Err %v; want lost by the timer", doneNow(h), h.Err())
	}
}

// A holder paused past its deadline learns the loss on waking, from Done
// or Err, before the deadline timer has run.
func TestCheckDeadlineAfterAPause(t *testing.T) {
	tc := newTestClient(t, time.Second)
	o, _ := tc.NewSession(time.Second)
	h := tc.hold(t, o, 2, "k")
	tc.lease.Jump(899 * time.Millisecond)
	select {
	case <-h.Done():
		t.Fatalf("lost before its deadline: %v", h.Err())
	default:
	}
	tc.lease.Jump(time.Millisecond) // the pause ends at the deadline; no timer ran
	if doneNow(h) {
		t.Fatal("test broken: something checked the deadline already")
	}
	select {
	case <-h.Done():
	default:
		t.Fatal("Done open after a pause past the deadline")
	}
	if !errors.Is(h.Err(), errLeaseExpired) || !errors.Is(o.Err(), errLeaseExpired) {
		t.Fatalf("lock Err %v, owner Err %v; want the lease-expired error", h.Err(), o.Err())
	}
	// Lost on this side, the session is closed on the cluster so the key
	// passes on without waiting for the leader's expiry.
	if got := tc.waitClosed(t, 1); got[0] != h.Session().ID() {
		t.Fatalf("closed %v, want session %d", got, h.Session().ID())
	}
	tc.noMoreClosed(t)
}

// A loss happens once: every held lock of the session reports the first
// error, the whole Session ends with it, and each of the Session's sessions is
// closed on the cluster exactly once.
func TestLossIsOnceAndEndsEveryLock(t *testing.T) {
	tc := newTestClient(t, time.Second)
	o, _ := tc.NewSession(time.Second)
	a, b := tc.hold(t, o, 2, "a"), tc.hold(t, o, 2, "b")
	other := tc.hold(t, o, 3, "c") // the Session's session on another shard
	s := a.Session()
	if b.Session() != s || other.Session() == s {
		t.Fatal("test broken: sessions are not as planned")
	}
	first := errors.Join(errLeaseExpired, errors.New("first"))
	s.Lose(first)
	s.Lose(errors.Join(errLeaseExpired, errors.New("second")))
	for _, h := range []*Held{a, b, other} {
		if !doneNow(h) || h.Err() != first {
			t.Fatalf("%s: done %v, Err %v; want the first loss", h.Key(), doneNow(h), h.Err())
		}
	}
	if o.Err() != first || other.Session().Err() != first {
		t.Fatalf("owner Err %v, other session Err %v; want the first loss", o.Err(), other.Session().Err())
	}
	closed := tc.waitClosed(t, 2)
	if !(closed[0] == s.ID() && closed[1] == other.Session().ID()) && !(closed[1] == s.ID() && closed[0] == other.Session().ID()) {
		t.Fatalf("closed %v, want sessions %d and %d once each", closed, s.ID(), other.Session().ID())
	}
	tc.noMoreClosed(t)

	// Nothing more is taken in the ended Owner: it says why it ended.
	if h, retry, _ := o.Acquire(tc.ctx, 2, "d", true, Spec{}); h != nil || !retry {
		t.Fatalf("Acquire in a lost Session: %v, retry %v", h, retry)
	}
	if err := a.Unlock(tc.ctx); !errors.Is(err, errLeaseExpired) {
		t.Fatalf("Unlock of a lost lock: %v, want the lease-expired error", err)
	}
}

// An orphaned Session is not kept alive and not closed on the cluster: its
// TTL decides there, and its locks end when their leases run out here.
func TestOrphanLeavesTheTTLToDecide(t *testing.T) {
	tc := newTestClient(t, time.Second)
	o, _ := tc.NewSession(time.Second)
	h := tc.hold(t, o, 2, "k")
	o.Orphan()
	if len(tc.live()) != 0 {
		t.Fatal("an orphaned Session's session is still kept alive")
	}
	tc.lease.Advance(900 * time.Millisecond)
	if !doneNow(h) || !errors.Is(h.Err(), errLeaseExpired) {
		t.Fatalf("orphaned lock past its deadline: done %v, Err %v", doneNow(h), h.Err())
	}
	if err := o.Close(tc.ctx); err != nil {
		t.Fatalf("Close of an ended, orphaned Session: %v", err)
	}
	tc.noMoreClosed(t)
}

// Close after Orphan, while the lease still holds, releases on the
// cluster as any Close does (issue 18: it released nothing, though the
// doc said it did); the lock ends with ErrSessionClosed, said once.
func TestCloseAfterOrphanReleases(t *testing.T) {
	tc := newTestClient(t, time.Second)
	o, _ := tc.NewSession(time.Second)
	h := tc.hold(t, o, 2, "k")
	o.Orphan()
	if err := o.Close(tc.ctx); err != nil {
		t.Fatalf("Close after Orphan: %v", err)
	}
	if got := tc.waitClosed(t, 1); len(got) != 1 {
		t.Fatalf("closed %v", got)
	}
	if !doneNow(h) || !errors.Is(h.Err(), errSessionClosed) {
		t.Fatalf("after Close: done %v, Err %v", doneNow(h), h.Err())
	}
	if msg := h.Err().Error(); strings.Count(msg, "closed") != 1 {
		t.Fatalf("Err reads %q: it should say closed once", msg)
	}
	tc.noMoreClosed(t)
}

// A key an Session holds cannot be locked through it again: that would queue
// behind itself until ctx ended (issue 18). A shared default Session is
// every caller of the node, so there the second Lock is another caller's
// and goes to the cluster.
func TestLockingAHeldKeyFailsAtOnce(t *testing.T) {
	tc := newTestClient(t, time.Second)
	o, _ := tc.NewSession(time.Second)
	h := tc.hold(t, o, 2, "k")
	for _, wait := range []bool{true, false} {
		if _, _, err := o.Acquire(tc.ctx, 2, "k", wait, Spec{}); !errors.Is(err, lockerr.AlreadyHeld) {
			t.Fatalf("second Acquire (wait %v) of a held key: %v, want AlreadyHeld", wait, err)
		}
	}
	if err := h.Unlock(tc.ctx); err != nil {
		t.Fatal(err)
	}
	h2 := tc.hold(t, o, 2, "k") // free again after the unlock
	_ = h2.Unlock(tc.ctx)

	d, err := tc.Default(2)
	if err != nil {
		t.Fatal(err)
	}
	tc.hold(t, d, 2, "d")
	if _, _, err := d.Acquire(tc.ctx, 2, "d", false, Spec{}); errors.Is(err, lockerr.AlreadyHeld) {
		t.Fatalf("the shared default Session refused another caller's TryLock as its own: %v", err)
	}
}

// Unlock ends the lock before its release is proposed, and a release that
// does not commit gives up the session: the key is then freed by expiry.
func TestUnlockAndAFailedRelease(t *testing.T) {
	tc := newTestClient(t, time.Second)
	o, _ := tc.NewSession(time.Second)
	h := tc.hold(t, o, 2, "k")
	if err := h.Unlock(tc.ctx); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	if !doneNow(h) || !errors.Is(h.Err(), errNotHeld) {
		t.Fatalf("after Unlock: done %v, Err %v", doneNow(h), h.Err())
	}
	if err := h.Unlock(tc.ctx); !errors.Is(err, errNotHeld) {
		t.Fatalf("second Unlock: %v, want not held", err)
	}

	h2 := tc.hold(t, o, 2, "k2")
	tc.cluster.mu.Lock()
	tc.cluster.fail = func(c lockfsm.Command) error {
		if c.Op == lockfsm.OpRelease {
			return errUnavailable
		}
		return nil
	}
	tc.cluster.mu.Unlock()
	if err := h2.Release(); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if got := tc.waitClosed(t, 1); got[0] != h2.Session().ID() {
		t.Fatalf("closed %v after a failed release, want its session", got)
	}
	if err := o.Err(); !errors.Is(err, errLeaseExpired) {
		t.Fatalf("owner Err after a failed release: %v, want the lease-expired error", err)
	}
	tc.noMoreClosed(t)
}

// The registry: one default Session per shard, replaced once it ends; no
// Session after Close, which ends every Session and closes its sessions.
func TestDefaultsAndClose(t *testing.T) {
	tc := newTestClient(t, time.Second)
	d2, _ := tc.Default(2)
	if again, _ := tc.Default(2); again != d2 {
		t.Fatal("a live default Session was replaced")
	}
	if d3, _ := tc.Default(3); d3 == d2 {
		t.Fatal("two shards share a default Session")
	}
	h := tc.hold(t, d2, 2, "k")
	h.Session().Lose(errLeaseExpired)
	tc.waitClosed(t, 1)
	if next, _ := tc.Default(2); next == d2 {
		t.Fatal("a lost default Session was reused")
	}
	o, _ := tc.NewSession(time.Second)
	held := tc.hold(t, o, 3, "k")
	orphan, _ := tc.NewSession(time.Second)
	tc.hold(t, orphan, 3, "j")
	orphan.Orphan()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tc.Close(ctx)
	if !doneNow(held) || !errors.Is(held.Err(), errClosed) || !errors.Is(o.Err(), errClosed) {
		t.Fatalf("after Close: lock Err %v, owner Err %v; want the node-closed error", held.Err(), o.Err())
	}
	if got := tc.waitClosed(t, 1); got[0] != held.Session().ID() {
		t.Fatalf("Close closed %v on the cluster, want only session %d (not the orphan's)", got, held.Session().ID())
	}
	tc.noMoreClosed(t)
	if _, err := tc.NewSession(time.Second); !errors.Is(err, errClosed) {
		t.Fatalf("NewSession after Close: %v", err)
	}
	if _, err := tc.Default(4); !errors.Is(err, errClosed) {
		t.Fatalf("Default after Close: %v", err)
	}
}
