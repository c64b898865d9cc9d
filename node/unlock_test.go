package node

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/internal/client"
)

// An Unlock whose context ends before the release commits must still end
// the lock for its caller: Done closed and Err set before anyone else can
// be granted the key, while the release goes on and hands the key on
// (issue 10, bug 3: Done stayed open forever while a waiter held the key).
func TestUnlockWithUnknownOutcomeEndsTheLock(t *testing.T) {
	peers := startCluster(t, clusterOpts{peers: 3, rf: 3})
	ctx := ctxT(t, 20*time.Second)
	held, err := peers[0].node.Lock(ctx, "unknown")
	if err != nil {
		t.Fatal(err)
	}
	granted := make(chan *Lock, 1)
	go func() {
		l, err := peers[1].node.Lock(ctx, "unknown")
		if err != nil {
			t.Error(err)
		}
		granted <- l
	}()
	waitQueued(t, peers[0].node, "unknown", 1)

	// A context that has already ended: the release cannot be confirmed.
	dead, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel()
	err = held.Unlock(dead)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "not known to have committed") {
		t.Fatalf("Unlock with an ended context = %v, want a deadline error saying the outcome is unknown", err)
	}
	select {
	case <-held.Done():
	default:
		t.Fatal("Done still open after Unlock returned")
	}
	if !errors.Is(held.Err(), ErrNotHeld) {
		t.Fatalf("Err() = %v after Unlock, want ErrNotHeld", held.Err())
	}

	// The release committed in the background and handed the key on.
	var next *Lock
	select {
	case next = <-granted:
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter was not granted the key after the background release")
	}
	if next == nil {
		t.FailNow()
	}
	if next.Token() <= held.Token() {
		t.Fatalf("waiter's token %d not above the holder's %d", next.Token(), held.Token())
	}
	// A second Unlock says the lock is already over, and does not hang.
	if err := held.Unlock(ctx); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("second Unlock = %v, want ErrNotHeld", err)
	}
	if err := next.Unlock(ctx); err != nil {
		t.Fatalf("Unlock that commits = %v, want nil", err)
	}
	select {
	case <-next.Done():
	default:
		t.Fatal("Done open after a successful Unlock")
	}
}

// leaseTestNode is a Node with just what a session's lease logic needs:
// config, clock and logger. It is marked closed, so a lost session does
// not try to close itself on a cluster that is not there.
func leaseTestNode(clock Clock) *Node {
	cfg := Config{SessionTTL: time.Second, LeaseMargin: 100 * time.Millisecond, Clock: clock}
	n := &Node{cfg: cfg, log: slog.New(slog.DiscardHandler), sessions: map[*Session]struct{}{}, defaults: map[uint64]*Session{}, stop: make(chan struct{})}
	n.closed.Store(true)
	return n
}

func leaseTestSession(n *Node) *session {
	owner := &Session{n: n, ttl: n.cfg.SessionTTL, shards: map[uint64]*sessionSlot{}, done: make(chan struct{})}
	s := &session{n: n, owner: owner, shard: 2, id: 7, attempts: client.NewAttempts(),
		locks: map[uint64]*Lock{}, lost: make(chan struct{})}
	s.mu.Lock()
	s.extendLocked(n.now())
	s.mu.Unlock()
	return s
}

// An acknowledgement that arrives after the lease deadline, before the
// deadline timer ran, must not revive the lease: the holder may already
// have been told it is lost, and the leader may be expiring the session.
func TestExtendNeverRevivesAPassedDeadline(t *testing.T) {
	clock := &faultClock{}
	n := leaseTestNode(clock)

	// Control: an ack before the deadline extends it.
	s := leaseTestSession(n)
	l := s.newLock("k", 1, 1)
	clock.Jump(500 * time.Millisecond)
	s.extend(n.now())
	clock.Jump(500 * time.Millisecond) // 1s after the open, 0.5s after the ack
	if err := l.Err(); err != nil {
		t.Fatalf("lease lost although extended before its deadline: %v", err)
	}

	// The deadline (TTL - margin after the ack) passes; the timer, on real
	// time, has not run. An ack arrives now, for a keepalive sent just now:
	// taken at face value it would move the deadline 0.9s ahead.
	clock.Jump(950 * time.Millisecond)
	s.extend(n.now())
	select {
	case <-l.done: // read the channel itself: Done() would check the deadline
	default:
		t.Fatal("a late acknowledgement revived a lease whose deadline had passed")
	}
	if !errors.Is(l.Err(), ErrLeaseExpired) {
		t.Fatalf("Err() = %v, want ErrLeaseExpired", l.Err())
	}
	if !s.isLost() {
		t.Fatal("session not lost")
	}
}
