package node

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/internal/client"
	"github.com/lockmesh/lockmesh/internal/leader"
	"github.com/lockmesh/lockmesh/internal/peer"
	"github.com/lockmesh/lockmesh/lockfsm"
	"github.com/lockmesh/lockmesh/transport"
)

// A grant notice pushed to the RPC port is only a hint: anyone who reaches
// the port can send one (without TLS, anyone at all), so a waiting Lock
// returns only once the replicated state says its attempt holds the lock,
// and with the token the state gave it.
func TestForgedGrantNoticeDoesNotGrant(t *testing.T) {
	peers := startCluster(t, clusterOpts{peers: 3, rf: 3, shards: 2})
	holderNode, waiterNode := peers[0].node, peers[1].node
	const key = "forged"
	held, err := holderNode.Lock(ctxT(t, 10*time.Second), key)
	if err != nil {
		t.Fatal(err)
	}

	type result struct {
		l   *Lock
		err error
		at  time.Time
	}
	got := make(chan result, 1)
	go func() {
		l, err := waiterNode.Lock(ctxT(t, 30*time.Second), key)
		got <- result{l, err, time.Now()}
	}()
	shard := waiterNode.peer.Placement().ShardOf(key)
	var w client.WaiterKey
	deadline := time.Now().Add(30 * time.Second) // fails a waiter that never queues, not a slow one
	for w == (client.WaiterKey{}) {
		if time.Now().After(deadline) {
			t.Fatal("the waiter never queued")
		}
		for _, k := range waiterNode.client.Waiters().Keys() {
			if k.Shard == shard {
				w = k
			}
		}
		time.Sleep(5 * time.Millisecond)
	}

	// An outsider with no cluster credentials sends a notice naming the
	// waiter's exact attempt, with a made-up token. Call returns once the
	// waiter's peer has handled it.
	forger, err := transport.NewClient(transport.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer forger.Close()
	const forgedToken = 999
	body, err := peer.EncodeBody(leader.Notice{Shard: shard, Grants: []lockfsm.Grant{{Key: key, Session: w.Session, Req: w.Req, Token: forgedToken, Owner: waiterNode.Name(), HandOff: true}}})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := forger.Call(ctxT(t, 5*time.Second), waiterNode.peer.RPCAddr(), peer.MethodNotify, body); err != nil {
			t.Fatalf("sending the forged notice: %v", err)
		}
	}

	// The waiter re-reads its attempt on the notice; give that time to
	// happen, then release. Lock must return only after the release.
	time.Sleep(time.Second)
	var released atomic.Int64
	released.Store(time.Now().UnixNano())
	if err := held.Unlock(ctxT(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("waiter: %v", r.err)
	}
	defer r.l.Unlock(context.Background())
	if r.at.UnixNano() < released.Load() {
		t.Fatalf("Lock returned at %v, before the holder released at %v: a forged notice granted it", r.at, time.Unix(0, released.Load()))
	}
	if r.l.Token() == forgedToken || r.l.Token() <= held.Token() {
		t.Fatalf("waiter's token %d (holder had %d): not the one the state granted", r.l.Token(), held.Token())
	}
}

// A peer that hosts no replica of a shard learns of a hand-off from the
// leader's notice (verified by a read), not from the slow re-read: with a
// 10 minute TTL the re-read comes every 150s at the earliest, so a grant
// within a minute of the release (and half a minute at most of queueing
// before it) came from the notice. The minute fails a lost notice, not a
// slow machine: the notice takes milliseconds.
func TestHandOffReachesClientOnlyPeer(t *testing.T) {
	const ttl = 10 * time.Minute
	peers := startCluster(t, clusterOpts{peers: 3, rf: 3, shards: 2, ttl: ttl})
	o := clusterOpts{shards: 2, rf: 3, ttl: ttl}
	client := &testPeer{cfg: testConfig(t, "client", o)}
	client.cfg.NoReplicas = true
	client.cfg.Join = []string{peers[0].node.GossipAddr()}
	client.start(t)
	t.Cleanup(client.stop)
	client.waitReady(t)

	const key = "handoff"
	held, err := peers[0].node.Lock(ctxT(t, 30*time.Second), key)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	var l *Lock
	go func() {
		var err error
		l, err = client.node.Lock(ctxT(t, ttl/4), key)
		got <- err
	}()
	// Unlock only once the client waits in the key's queue.
	pollUntil(t, 30*time.Second, "the client queued", func() bool {
		ki, err := peers[0].node.Inspect(ctxT(t, 5*time.Second), key)
		return err == nil && len(ki.Waiters) == 1
	})
	released := time.Now()
	if err := held.Unlock(ctxT(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
		defer l.Unlock(context.Background())
		if l.Token() <= held.Token() {
			t.Fatalf("token %d after %d", l.Token(), held.Token())
		}
		t.Logf("the client was granted the key %v after the release", time.Since(released).Round(time.Millisecond))
	case <-time.After(time.Minute):
		t.Fatalf("no grant a minute after the release: the notice did not arrive (the re-read comes every %v)", ttl/4)
	}
}
