package node

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/internal/peer"
)

// checker is the protected resource of the cluster tests: per key, it
// counts who is inside the critical section and the highest token seen.
type checker struct {
	mu         sync.Mutex
	inside     map[string]int
	lastToken  map[string]uint64
	violations []string
	grants     atomic.Int64
	// failures counts, by text, the errors Lock and Unlock returned that
	// are neither ErrClosed (the peer left) nor the op's own deadline.
	failures map[string]int
	timeouts atomic.Int64
}

func newChecker() *checker {
	return &checker{inside: map[string]int{}, lastToken: map[string]uint64{}, failures: map[string]int{}}
}

// failed records err from op unless it is ErrClosed; it reports whether
// there was an error.
func (c *checker) failed(op string, err error) bool {
	switch {
	case err == nil:
		return false
	case errors.Is(err, ErrClosed), errors.Is(err, context.Canceled): // the peer left, the load stopped
	case errors.Is(err, context.DeadlineExceeded):
		c.timeouts.Add(1)
	default:
		c.mu.Lock()
		c.failures[op+": "+err.Error()]++
		c.mu.Unlock()
	}
	return true
}

// checkNoFailures fails t for every error that was not ErrClosed or a
// deadline: a healthy or rebalancing cluster must not fail a lock call.
func (c *checker) checkNoFailures(t *testing.T) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for text, count := range c.failures {
		t.Errorf("%d times: %s", count, text)
	}
	if n := c.timeouts.Load(); n > 0 {
		t.Logf("%d lock calls reached their 5s deadline", n)
	}
}

func (c *checker) enter(key string, token uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.grants.Add(1)
	c.inside[key]++
	if c.inside[key] > 1 {
		c.violations = append(c.violations, fmt.Sprintf("key %s: %d holders inside", key, c.inside[key]))
	}
	if token <= c.lastToken[key] {
		c.violations = append(c.violations, fmt.Sprintf("key %s: token %d after %d", key, token, c.lastToken[key]))
	}
	c.lastToken[key] = token
}

func (c *checker) leave(key string) {
	c.mu.Lock()
	c.inside[key]--
	c.mu.Unlock()
}

func (c *checker) check(t *testing.T) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, v := range c.violations {
		t.Error(v)
	}
}

// hammer runs workers on every peer that lock one of keys, step inside the
// checker, and unlock, until ctx ends. Errors from a lost lease or an
// unavailable shard are expected under faults; the checker is what counts.
func hammer(ctx context.Context, peers []*testPeer, keys []string, perPeer int, c *checker) *sync.WaitGroup {
	var wg sync.WaitGroup
	for _, p := range peers {
		for w := 0; w < perPeer; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					key := keys[rand.IntN(len(keys))]
					opCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
					l, err := p.node.Lock(opCtx, key)
					cancel()
					if c.failed("lock", err) {
						if errors.Is(err, ErrClosed) {
							return
						}
						continue
					}
					c.enter(key, l.Token())
					time.Sleep(time.Duration(rand.IntN(500)) * time.Microsecond)
					c.leave(key)
					if rand.IntN(2) == 0 {
						_ = l.Release()
						continue
					}
					uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					c.failed("unlock", l.Unlock(uctx))
					cancel()
				}
			}()
		}
	}
	return &wg
}

func TestMutualExclusion3Peers(t *testing.T) {
	peers := startCluster(t, clusterOpts{peers: 3, rf: 3})
	c := newChecker()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	hammer(ctx, peers, []string{"a", "b", "c"}, 4, c).Wait()
	c.check(t)
	if c.grants.Load() < 50 {
		t.Fatalf("only %d grants in 3s", c.grants.Load())
	}
	t.Logf("%d grants", c.grants.Load())
}

func TestMutualExclusion5PeersForwarding(t *testing.T) {
	peers := startCluster(t, clusterOpts{peers: 5, rf: 3, shards: 4})
	p := peers[0].node.peer.Placement()
	forwarding := 0
	for _, tp := range peers {
		for _, shard := range p.ShardIDs()[1:] {
			if !p.Hosts(shard, tp.cfg.Name) {
				forwarding++
			}
		}
	}
	if forwarding == 0 {
		t.Fatal("every peer hosts every shard; the test would not exercise forwarding")
	}
	c := newChecker()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	keys := []string{"k1", "k2", "k3", "k4", "k5", "k6"}
	hammer(ctx, peers, keys, 3, c).Wait()
	c.check(t)
	if c.grants.Load() < 50 {
		t.Fatalf("only %d grants in 3s", c.grants.Load())
	}
	t.Logf("%d grants, %d (peer, shard) pairs forwarding", c.grants.Load(), forwarding)
}

func TestFIFOHandoff(t *testing.T) {
	peers := startCluster(t, clusterOpts{peers: 3, rf: 3})
	ctx := ctxT(t, 20*time.Second)
	first, err := peers[0].node.Lock(ctx, "fifo")
	if err != nil {
		t.Fatal(err)
	}
	order := make(chan int, 3)
	var wg sync.WaitGroup
	for i := 1; i <= 3; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := peers[i%3].node.Lock(ctx, "fifo")
			if err != nil {
				t.Error(err)
				return
			}
			order <- i
			time.Sleep(20 * time.Millisecond)
			_ = l.Unlock(ctx)
		}()
		waitQueued(t, peers[0].node, "fifo", i)
	}
	if err := first.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(order)
	want := 1
	for got := range order {
		if got != want {
			t.Fatalf("waiter %d granted in place %d", got, want)
		}
		want++
	}
}

// waitQueued waits until key has n waiters.
func waitQueued(t testing.TB, n *Node, key string, waiters int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second) // fails a waiter that never queues, not a slow one
	var info KeyInfo
	var err error
	for time.Now().Before(deadline) {
		info, err = n.Inspect(ctxT(t, time.Second), key)
		if err == nil && len(info.Waiters) == waiters {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("key %s never had %d waiters: last saw %+v, %v", key, waiters, info, err)
}

func TestCancelLeavesQueue(t *testing.T) {
	peers := startCluster(t, clusterOpts{peers: 3, rf: 3})
	ctx := ctxT(t, 20*time.Second)
	held, err := peers[0].node.Lock(ctx, "cancel")
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		_, err := peers[1].node.Lock(wctx, "cancel")
		errc <- err
	}()
	waitQueued(t, peers[0].node, "cancel", 1)
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Lock returned %v", err)
	}
	waitQueued(t, peers[0].node, "cancel", 0)
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// Nobody leaked the lock: it is free.
	l, err := peers[2].node.TryLock(ctx, "cancel")
	if err != nil {
		t.Fatalf("key not free after the waiter cancelled: %v", err)
	}
	_ = l.Unlock(ctx)
}

// A waiter whose context ends in the same instant as its grant must not
// leak the lock: either it returns the lock or the lock is released.
func TestCancelRacingGrantNeverLeaks(t *testing.T) {
	peers := startCluster(t, clusterOpts{peers: 3, rf: 3})
	ctx := ctxT(t, 60*time.Second)
	for i := 0; i < 30; i++ {
		held, err := peers[0].node.Lock(ctx, "race")
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithCancel(ctx)
		got := make(chan *Lock, 1)
		go func() {
			l, _ := peers[1].node.Lock(wctx, "race")
			got <- l
		}()
		waitQueued(t, peers[0].node, "race", 1)
		go held.Unlock(ctx)
		time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
		cancel()
		if l := <-got; l != nil {
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
		// The key must become free again within a few RTT.
		deadline := time.Now().Add(5 * time.Second)
		for {
			l, err := peers[2].node.TryLock(ctx, "race")
			if err == nil {
				_ = l.Unlock(ctx)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: lock leaked: %v", i, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

func TestHolderKilledWaiterGetsLockAfterTTL(t *testing.T) {
	peers := startCluster(t, clusterOpts{peers: 3, rf: 3, ttl: time.Second})
	ctx := ctxT(t, 30*time.Second)
	victim := peers[2]
	held, err := victim.node.Lock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	victim.node.peer.Kill()
	// The holder's own view of its lease: until this deadline it could
	// still believe it holds the lock.
	deadline := held.h.Session().Deadline()
	l, err := peers[0].node.Lock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	// The deadline is on the holder's clock (internal/clock's Boot), so the
	// grant is dated on it too, not on Go's.
	granted, grantedMono := peer.HolderClock(victim.node.cfg.clock).Now(), time.Now()
	if l.Token() <= held.Token() {
		t.Fatalf("token %d after %d", l.Token(), held.Token())
	}
	if granted.Before(deadline) {
		t.Fatalf("granted %v before the dead holder's lease deadline", deadline.Sub(granted))
	}
	t.Logf("waiter granted %v after the holder was killed, %v after its lease deadline", grantedMono.Sub(killed), granted.Sub(deadline))
}

func TestLeaderStoppedUnderLoad(t *testing.T) {
	peers := startCluster(t, clusterOpts{peers: 3, rf: 3, shards: 2, ttl: 2 * time.Second})
	c := newChecker()
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Second)
	defer cancel()
	wg := hammer(ctx, peers[:2], []string{"a", "b", "c", "d"}, 3, c)
	time.Sleep(time.Second)
	// Stop the peer leading the most shards, including the workers' own
	// replicas' leaders: leaders must move and locks keep working.
	var victim *testPeer
	best := -1
	for _, tp := range peers {
		led := 0
		for _, shard := range tp.node.peer.Placement().ShardIDs() {
			if id, _, ok, _ := tp.node.peer.NodeHost().GetLeaderID(shard); ok {
				if pe, _ := tp.node.peer.Placement().PeerByReplica(id); pe.Name == tp.cfg.Name {
					led++
				}
			}
		}
		if led > best {
			best, victim = led, tp
		}
	}
	before := c.grants.Load()
	victim.node.peer.Kill()
	time.Sleep(4 * time.Second)
	after := c.grants.Load()
	cancel()
	wg.Wait()
	c.check(t)
	if after-before < 20 {
		t.Fatalf("only %d grants after the leader (%s, leading %d shards) stopped", after-before, victim.cfg.Name, best)
	}
	t.Logf("killed %s leading %d shards; %d grants before, %d after", victim.cfg.Name, best, before, after-before)
}

func TestRestartKeepsLocksAndTokens(t *testing.T) {
	o := clusterOpts{peers: 3, expect: 3, shards: 2, rf: 3, ttl: 5 * time.Second}
	var peers []*testPeer
	var gossip []string
	for i := 0; i < 3; i++ {
		cfg := testConfig(t, fmt.Sprintf("peer-%d", i+1), o)
		cfg.GossipAddr = freeAddr(t)
		gossip = append(gossip, cfg.GossipAddr)
		peers = append(peers, &testPeer{cfg: cfg})
	}
	for i, p := range peers {
		p.cfg.Join = append(append([]string(nil), gossip[:i]...), gossip[i+1:]...)
		p.start(t)
	}
	t.Cleanup(func() {
		for _, p := range peers {
			p.stop()
		}
	})
	for _, p := range peers {
		p.waitReady(t)
	}
	ctx := ctxT(t, 60*time.Second)
	held, err := peers[0].node.Lock(ctx, "durable")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range peers {
		p.node.peer.Kill()
	}
	restarted := time.Now()
	for _, p := range peers {
		p.start(t)
	}
	for _, p := range peers {
		p.waitReady(t)
	}
	t.Logf("3 peers restarted and ready in %v", time.Since(restarted))
	info, err := peers[1].node.Inspect(ctx, "durable")
	if err != nil {
		t.Fatal(err)
	}
	if len(info.Holders) != 1 || info.Holders[0].Token != held.Token() {
		t.Fatalf("after restart the key shows %+v, want the holder with token %d", info, held.Token())
	}
	// The holder's session is gone with its process: the lock is granted
	// again after the TTL, with a higher token.
	l, err := peers[1].node.Lock(ctx, "durable")
	if err != nil {
		t.Fatal(err)
	}
	if l.Token() <= held.Token() {
		t.Fatalf("token %d after restart, was %d", l.Token(), held.Token())
	}
	_ = l.Unlock(ctx)
}

func TestLeaseLostClosesDone(t *testing.T) {
	peers := startCluster(t, clusterOpts{peers: 3, rf: 3, ttl: time.Second})
	ctx := ctxT(t, 30*time.Second)
	p := peers[0].node
	l, err := p.Lock(ctx, "lease")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Done():
		t.Fatalf("Done closed while keepalives flow: %v", l.Err())
	case <-time.After(3 * time.Second):
	}
	// Cut this peer off from everyone: keepalives stop being acknowledged.
	for _, other := range peers[1:] {
		other.node.peer.Kill()
	}
	select {
	case <-l.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("Done not closed 30s after keepalives stopped (TTL 1s)")
	}
	if !errors.Is(l.Err(), ErrLeaseExpired) {
		t.Fatalf("Err() = %v, want ErrLeaseExpired", l.Err())
	}
	// The loss is known here: Unlock fails at once, not when ctx ends.
	uctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := l.Unlock(uctx); !errors.Is(err, ErrLeaseExpired) || uctx.Err() != nil {
		t.Fatalf("Unlock of a lost lock: %v (ctx %v), want ErrLeaseExpired at once", err, uctx.Err())
	}
}

func TestCallsAfterCloseAndBadInput(t *testing.T) {
	peers := startCluster(t, clusterOpts{peers: 3, rf: 3})
	n := peers[0].node
	ctx := ctxT(t, 10*time.Second)
	if _, err := n.Lock(ctx, ""); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("empty key: %v", err)
	}
	long := make([]byte, MaxKeyLen+1)
	for i := range long {
		long[i] = 'x'
	}
	if _, err := n.TryLock(ctx, string(long)); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("oversized key: %v", err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := n.Lock(ctx, "k"); !errors.Is(err, ErrClosed) {
		t.Fatalf("Lock after Close: %v", err)
	}
}
