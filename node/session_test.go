package node

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// keysOnShards returns one key on each of two different shards.
func keysOnShards(t *testing.T, n *Node) (string, string) {
	t.Helper()
	p := n.peer.Placement()
	first := "k-0"
	for i := 1; i < 1000; i++ {
		if k := fmt.Sprintf("k-%d", i); p.ShardOf(k) != p.ShardOf(first) {
			return first, k
		}
	}
	t.Fatal("no two keys on different shards")
	return "", ""
}

// A Session's locks on different shards end together: Close releases them
// all on the cluster and closes each lock's Done with ErrSessionClosed.
func TestSessionCloseReleasesAcrossShards(t *testing.T) {
	peers := startCluster(t, clusterOpts{peers: 3, rf: 3, shards: 4})
	n, other := peers[0].node, peers[1].node
	a, b := keysOnShards(t, n)
	s, err := n.NewSession(ctxT(t, 5*time.Second), WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	la, err := s.Lock(ctxT(t, 10*time.Second), a)
	if err != nil {
		t.Fatal(err)
	}
	lb, err := s.TryLock(ctxT(t, 10*time.Second), b)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.TryLock(ctxT(t, 10*time.Second), a); !errors.Is(err, ErrLocked) {
		t.Fatalf("TryLock of a key the session holds: %v", err)
	}
	if err := s.Close(ctxT(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	for _, l := range []*Lock{la, lb} {
		select {
		case <-l.Done():
		default:
			t.Fatalf("%s: Done open after the session closed", l.Key())
		}
		if !errors.Is(l.Err(), ErrSessionClosed) {
			t.Fatalf("%s: Err = %v, want ErrSessionClosed", l.Key(), l.Err())
		}
	}
	if !errors.Is(s.Err(), ErrSessionClosed) {
		t.Fatalf("session Err = %v", s.Err())
	}
	// Both keys are free at once, not after the TTL.
	for _, k := range []string{a, b} {
		l, err := other.TryLock(ctxT(t, 10*time.Second), k)
		if err != nil {
			t.Fatalf("TryLock %s after Close: %v", k, err)
		}
		if err := l.Unlock(ctxT(t, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Lock(ctxT(t, 5*time.Second), a); !errors.Is(err, ErrSessionClosed) {
		t.Fatalf("Lock on a closed session: %v", err)
	}
	if err := s.Close(ctxT(t, 5*time.Second)); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// An orphaned session keeps its locks until its TTL runs out: no keepalive
// and no close, as after a crash. Then every lock of the session reports
// ErrLeaseExpired, and the cluster hands the keys on. Its own TTL, not the
// node's, decides when: the node's TTL is 40s, so a key freed within 30s
// of the orphaning cannot have waited for it (a bound that fails a wrong
// TTL, not a slow machine: the session's takes a few seconds).
func TestSessionOrphanLetsTheTTLRunOut(t *testing.T) {
	const nodeTTL = 40 * time.Second
	peers := startCluster(t, clusterOpts{peers: 3, rf: 3, shards: 4, ttl: nodeTTL, mutate: func(cfg *Config) {
		cfg.LeaseMargin = time.Second // not a tenth of 40s: the session's TTL must exceed twice this
	}})
	n, other := peers[0].node, peers[1].node
	a, b := keysOnShards(t, n)
	const ttl = 3 * time.Second // above twice the node's LeaseMargin
	s, err := n.NewSession(ctxT(t, 30*time.Second), WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	var locks []*Lock
	for _, k := range []string{a, b} {
		l, err := s.Lock(ctxT(t, 30*time.Second), k)
		if err != nil {
			t.Fatal(err)
		}
		locks = append(locks, l)
	}
	orphaned := time.Now()
	s.Orphan()
	if _, err := other.TryLock(ctxT(t, 30*time.Second), a); !errors.Is(err, ErrLocked) {
		t.Fatalf("TryLock right after Orphan: %v, want ErrLocked", err)
	}
	select {
	case <-s.Done():
	case <-ctxT(t, 30*time.Second).Done():
		t.Fatalf("an orphaned session's Done stayed open 30s, ten times its TTL")
	}
	for _, l := range locks {
		if !errors.Is(l.Err(), ErrLeaseExpired) {
			t.Fatalf("%s: Err = %v, want ErrLeaseExpired", l.Key(), l.Err())
		}
	}
	// The cluster frees the keys after the session's TTL (and a new
	// leader's grace at most), long before the node's TTL could.
	freeBy, cancel := context.WithDeadline(context.Background(), orphaned.Add(3*nodeTTL/4))
	defer cancel()
	for _, k := range []string{a, b} {
		l, err := other.Lock(freeBy, k)
		if err != nil {
			t.Fatalf("Lock %s after the orphaned session's TTL: %v (%v after Orphan): the node's TTL of %v decides, not the session's %v",
				k, err, time.Since(orphaned).Round(time.Millisecond), nodeTTL, ttl)
		}
		t.Logf("%s freed %v after Orphan", k, time.Since(orphaned).Round(time.Millisecond))
		_ = l.Unlock(ctxT(t, 30*time.Second))
	}
}

// The node's default sessions are one per shard: a loss on one shard does
// not end locks on another, and the next Lock there starts a new session.
func TestDefaultSessionsArePerShard(t *testing.T) {
	peers := startCluster(t, clusterOpts{peers: 3, rf: 3, shards: 4})
	n := peers[0].node
	a, b := keysOnShards(t, n)
	la, err := n.Lock(ctxT(t, 10*time.Second), a)
	if err != nil {
		t.Fatal(err)
	}
	lb, err := n.Lock(ctxT(t, 10*time.Second), b)
	if err != nil {
		t.Fatal(err)
	}
	la.h.Session().Lose(fmt.Errorf("%w: lost by the test", ErrLeaseExpired))
	if !errors.Is(la.Err(), ErrLeaseExpired) {
		t.Fatalf("lock on the lost shard: %v", la.Err())
	}
	if err := lb.Err(); err != nil {
		t.Fatalf("lock on the other shard ended with it: %v", err)
	}
	l, err := n.Lock(ctxT(t, 10*time.Second), a)
	if err != nil {
		t.Fatalf("Lock after the default session was lost: %v", err)
	}
	if l.h.Session().Session() == la.h.Session().Session() {
		t.Fatal("the lost default session was reused")
	}
	_ = l.Unlock(ctxT(t, 10*time.Second))
	_ = lb.Unlock(ctxT(t, 10*time.Second))
}

func TestNewSessionRefusesABadTTL(t *testing.T) {
	n := leaseTestNode(&faultClock{})
	n.cfg.RTT = 10 * time.Millisecond
	if _, err := n.NewSession(ctxT(t, time.Second), WithTTL(100*time.Millisecond)); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("TTL below 40 RTT: %v", err)
	}
	if _, err := n.NewSession(ctxT(t, time.Second), WithTTL(MaxSessionTTL+time.Millisecond)); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("TTL above MaxSessionTTL: %v", err)
	}
}

// A Session locking a key it holds fails at once with ErrAlreadyHeld
// instead of queueing behind itself until ctx ends (issue 18); the node's
// shared default session still lets a second caller wait for the first.
func TestSessionLockOfAHeldKeyFailsAtOnce(t *testing.T) {
	peers := startCluster(t, clusterOpts{peers: 1, rf: 1, shards: 1})
	n := peers[0].node
	s, err := n.NewSession(ctxT(t, time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctxT(t, 5*time.Second))
	l, err := s.Lock(ctxT(t, 5*time.Second), "self")
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 30*time.Second) // a self-wait would last until this ends
	if _, err := s.Lock(ctx, "self"); !errors.Is(err, ErrAlreadyHeld) || ctx.Err() != nil {
		t.Fatalf("second Lock of a held key: %v (ctx %v), want ErrAlreadyHeld at once", err, ctx.Err())
	}
	if _, err := s.TryLock(ctx, "self"); !errors.Is(err, ErrAlreadyHeld) {
		t.Fatalf("TryLock of a held key: %v, want ErrAlreadyHeld", err)
	}
	_ = l.Unlock(ctx)

	held, err := n.Lock(ctx, "shared")
	if err != nil {
		t.Fatal(err)
	}
	second := make(chan error, 1)
	go func() {
		l, err := n.Lock(ctx, "shared")
		if err == nil {
			l.Release()
		}
		second <- err
	}()
	pollUntil(t, 10*time.Second, "the second caller queued", func() bool {
		info, err := n.Inspect(ctx, "shared")
		return err == nil && len(info.Waiters) == 1
	})
	_ = held.Unlock(ctx)
	if err := <-second; err != nil {
		t.Fatalf("a second caller of Node.Lock: %v, want it granted after the first unlocked", err)
	}
}
