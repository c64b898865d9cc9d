package node

import (
	"context"
	"testing"
	"time"
)

// A session lost while its shard has no quorum cannot be closed then; its
// close must be tried again when the quorum returns, so its keys are freed
// at once instead of a full TTL after the new leader's grace.
func TestSessionCloseRetriedWhenQuorumReturns(t *testing.T) {
	const ttl = 3 * time.Second
	fc := startFaultCluster(t, faultOpts{ttl: ttl})
	ctx := ctxT(t, 60*time.Second)
	holder, other := fc.peers[0], fc.peers[1]
	l, err := holder.node().Lock(ctx, "close/retry")
	if err != nil {
		t.Fatal(err)
	}
	// No peer can reach another: no shard has a quorum.
	for _, p := range fc.peers {
		fc.net.Isolate(p.name)
	}
	select {
	case <-l.Done():
	case <-time.After(2 * ttl):
		t.Fatalf("lease still open %v after every peer was cut off", 2*ttl)
	}
	lost := time.Now()
	// The first close is tried for a TTL and fails; keep the cut for a
	// little longer so that only a later try can succeed.
	time.Sleep(ttl + 500*time.Millisecond)
	fc.net.Heal()
	healed := time.Now()
	t.Logf("lease lost; cut healed %v later", healed.Sub(lost).Round(time.Millisecond))

	next, err := other.node().Lock(ctx, "close/retry")
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(healed)
	t.Logf("%s granted the key %v after the cut healed, token %d", other.name, took.Round(time.Millisecond), next.Token())
	// Expiry by the (new) leader takes at least its grace plus a TTL after
	// the heal; only the retried close frees the key sooner.
	if limit := ttl; took >= limit {
		t.Fatalf("key freed %v after the quorum returned, not within %v: the failed session close was not retried", took, limit)
	}
	if next.Token() <= l.Token() {
		t.Fatalf("token %d not above the lost holder's %d", next.Token(), l.Token())
	}
	_ = next.Unlock(ctx)
}

// A waiter whose peer died is granted the key when the holder unlocks; the
// dead peer's session must then lose it no later than a TTL plus the new
// leader's grace (and an election) after the peer died.
func TestDeadWaiterKeepsKeyAtMostTTLPlusGrace(t *testing.T) {
	const ttl = time.Second
	peers := startCluster(t, clusterOpts{peers: 3, rf: 3, ttl: ttl})
	ctx := ctxT(t, 30*time.Second)
	const key = "dead/waiter"
	held, err := peers[0].node.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _, _ = peers[1].node.Lock(wctx, key) }()
	waitQueued(t, peers[0].node, key, 1)
	third := make(chan *Lock, 1)
	go func() {
		l, err := peers[2].node.Lock(ctx, key)
		if err != nil {
			t.Error(err)
		}
		third <- l
	}()
	waitQueued(t, peers[0].node, key, 2)

	peers[1].node.kill()
	died := time.Now()
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// The dead peer's waiter holds the key now.
	info, err := peers[0].node.Inspect(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(info.Holders) != 1 || info.Holders[0].Peer != peers[1].cfg.Name {
		t.Fatalf("after the unlock the key is %+v, want held by the dead %s", info, peers[1].cfg.Name)
	}
	deadToken := info.Holders[0].Token

	var l *Lock
	select {
	case l = <-third:
	case <-time.After(20 * time.Second):
		t.Fatal("the key never left the dead waiter")
	}
	if l == nil {
		t.FailNow()
	}
	took := time.Since(died)
	n := peers[0].node
	bound := ttl + n.leading.Grace() + 10*n.cfg.RTT + time.Second // + an election, + slack for a loaded machine
	t.Logf("the dead waiter kept the key %v after its peer died (bound %v); next token %d after %d", took.Round(time.Millisecond), bound, l.Token(), deadToken)
	if took > bound {
		t.Fatalf("the dead waiter kept the key %v, more than TTL + grace + election (%v)", took, bound)
	}
	if l.Token() <= deadToken {
		t.Fatalf("token %d not above the dead waiter's %d", l.Token(), deadToken)
	}
	_ = l.Unlock(ctx)
}
