package node

import (
	"context"
	"testing"
	"time"
)

// A power cut takes every peer down at once and each loses what it had
// not fsynced. What the cluster had committed must come back: the same
// cluster, the lock still held, and later tokens above it.
func TestPowerLossKeepsLocksAndTokens(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts a cluster")
	}
	fc := startFaultCluster(t, faultOpts{shards: 2, ttl: 5 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	held, err := fc.peers[0].node().Lock(ctx, "durable")
	if err != nil {
		t.Fatal(err)
	}
	before := fc.peers[1].node().peer.Placement()
	for _, p := range fc.peers {
		t.Logf("%s lost %v", p.name, fc.kill(p))
	}
	for _, p := range fc.peers {
		fc.start(p)
	}
	for _, p := range fc.peers {
		fc.waitReady(p)
		p.gate.open()
	}
	after := fc.peers[1].node().peer.Placement()
	if after.ClusterID != before.ClusterID {
		// The cluster record was lost (its rename not made durable) and
		// the peers formed a new cluster: held locks forgotten, tokens
		// starting again.
		t.Fatalf("after the power cut the peers formed cluster %x; they were cluster %x", after.ClusterID, before.ClusterID)
	}
	info, err := fc.peers[1].node().Inspect(ctx, "durable")
	if err != nil {
		t.Fatal(err)
	}
	if len(info.Holders) != 1 || info.Holders[0].Token != held.Token() {
		t.Fatalf("after the power cut the key shows %+v, want the holder with token %d", info, held.Token())
	}
	l, err := fc.peers[1].node().Lock(ctx, "durable")
	if err != nil {
		t.Fatal(err)
	}
	if l.Token() <= held.Token() {
		t.Fatalf("token %d granted after the power cut, not above %d granted before", l.Token(), held.Token())
	}
}
