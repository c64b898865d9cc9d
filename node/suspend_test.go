package node

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/internal/clock"
	"github.com/lockmesh/lockmesh/internal/peer"
)

// A real peer's holder counts its deadlines on the boot clock, which
// counts suspended time, and its leader side on Go's monotonic clock,
// which never runs fast; a test's clock is read by both sides as it is.
func TestRealPeerHoldsOnTheBootClock(t *testing.T) {
	if _, ok := peer.HolderClock(clock.System{}).(clock.Boot); !ok {
		t.Fatalf("a real peer's holder clock is %T, want the boot clock", peer.HolderClock(clock.System{}))
	}
	// The boot clock's times carry no monotonic reading: Go's, which
	// stops in a suspension, never decides a comparison of two of them.
	if s := peer.HolderClock(clock.System{}).Now().String(); strings.Contains(s, "m=") {
		t.Fatalf("the holder clock read %s, with a monotonic reading", s)
	}
	if s := (clock.System{}).Now().String(); !strings.Contains(s, "m=") {
		t.Fatalf("the leader clock read %s, without Go's monotonic reading", s)
	}
	fc := &faultClock{}
	if peer.HolderClock(fc) != clock.Clock(fc) {
		t.Fatal("a test's clock is not the holder's")
	}
}

// A peer woken from a suspension finds, at the first Done, the locks
// whose deadlines passed meanwhile lost: a maximum hold that ran out, and
// then a lease. Its clock jumps while Go's timers, which a suspension
// stops, have not fired: with deadlines a TTL of a minute away, none
// fires during the test, and on Go's monotonic clock neither lock would
// have run out.
func TestResumeEndsTheLocksWhoseDeadlinesPassed(t *testing.T) {
	fc := &faultClock{}
	peers := startCluster(t, clusterOpts{peers: 1, rf: 1, shards: 1, ttl: time.Minute, mutate: func(c *Config) { c.clock = fc }})
	n := peers[0].node
	ctx := ctxT(t, 30*time.Second)
	l, err := n.Lock(ctx, "lease")
	if err != nil {
		t.Fatal(err)
	}
	m, err := n.Lock(ctx, "max-hold", WithMaxHold(20*time.Second)) // given up 6s early (LeaseMargin)
	if err != nil {
		t.Fatal(err)
	}

	fc.Jump(20 * time.Second) // past the maximum hold, not the lease
	select {
	case <-m.Done():
	default:
		t.Fatal("Done open after a resume past the maximum hold")
	}
	if err := m.Err(); !errors.Is(err, ErrLeaseExpired) || !strings.Contains(err.Error(), "maximum") {
		t.Fatalf("Err() = %v, want the lease-expired error of the maximum hold", err)
	}
	if err := l.Err(); err != nil {
		t.Fatalf("the lock without a maximum was lost 20s into a minute's lease: %v", err)
	}

	fc.Jump(time.Minute) // past the lease
	select {
	case <-l.Done():
	default:
		t.Fatal("Done open after a resume past the lease deadline")
	}
	if err := l.Err(); !errors.Is(err, ErrLeaseExpired) {
		t.Fatalf("Err() = %v, want ErrLeaseExpired", err)
	}
}
