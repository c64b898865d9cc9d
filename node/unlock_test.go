package node

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/internal/clock"
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
	case <-time.After(30 * time.Second):
		t.Fatal("the waiter was not granted the key 30s after the background release")
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

// leaseTestNode is a Node with just what NewSession's checks need: its
// config, with c as the clock. It has no cluster and no client side: a
// NewSession that passed the checks would fail. The holder's lease rules
// are tested without a Node, in internal/client
// (TestExtendNeverRevivesAPassedDeadline and the others in lease_test.go).
func leaseTestNode(c clock.Clock) *Node {
	return &Node{cfg: Config{SessionTTL: time.Second, LeaseMargin: 100 * time.Millisecond, clock: c}}
}
