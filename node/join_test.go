package node

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/internal/datadir"
)

// Start returns once the peer listens even when no Join address answers:
// the join goes on in the background, a lock call meanwhile fails with
// ErrUnavailable naming the addresses, and the peer joins as soon as one
// comes up (issue 11: Start blocked until its ctx ended).
func TestStartDoesNotWaitForJoin(t *testing.T) {
	seedAddr := freeAddr(t)
	cfg := testConfig(t, "joiner", clusterOpts{rf: 1, shards: 2, ttl: time.Second})
	cfg.Join = []string{seedAddr}
	ctx := ctxT(t, 60*time.Second)
	n, err := Start(ctx, cfg)
	if err != nil {
		t.Fatalf("Start with an unreachable seed: %v", err)
	}
	t.Cleanup(func() { n.Close() })
	lctx, cancel := context.WithTimeout(ctx, time.Second)
	_, err = n.Lock(lctx, "k")
	cancel()
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), seedAddr) {
		t.Fatalf("Lock before the join: %v; want ErrUnavailable naming %s", err, seedAddr)
	}
	t.Logf("before the seed is up: %v", err)

	scfg := testConfig(t, "seed", clusterOpts{expect: 1, rf: 1, shards: 2, ttl: time.Second})
	scfg.GossipAddr = seedAddr
	// The seed sees the joiner in gossip at once: a join-only peer must
	// not count among the peers that form the cluster ("joiner" sorts
	// before "seed" and would be picked to coordinate; CI once saw the
	// seed never bootstrap).
	scfg.Join = []string{n.GossipAddr()}
	seed := &testPeer{cfg: scfg}
	seed.start(t)
	t.Cleanup(seed.stop)
	seed.waitReady(t)
	select {
	case <-n.Ready():
	case <-ctx.Done():
		t.Fatal("the joiner did not join once its seed came up")
	}
	l, err := n.Lock(ctx, "k")
	if err != nil {
		t.Fatalf("Lock after the join: %v", err)
	}
	l.Release()
}

// A restarted peer whose Join addresses are all gone finds its cluster
// through the peers it last saw alive (datadir.KnownPeersFile), as the
// membership-faults soak saw: a replaced peer restarted with the seeds of
// its first start, which had left since.
func TestRestartRejoinsThroughKnownPeers(t *testing.T) {
	if testing.Short() {
		t.Skip("starts four peers and restarts one")
	}
	o := clusterOpts{peers: 3, rf: 3, shards: 2, ttl: time.Second}
	peers := startCluster(t, o)
	cfg := testConfig(t, "peer-4", o)
	cfg.Join = []string{peers[0].node.GossipAddr()}
	p4 := &testPeer{cfg: cfg}
	p4.start(t)
	t.Cleanup(p4.stop)
	p4.waitReady(t)
	ctx := ctxT(t, 90*time.Second)
	// Wait until peer-4 has recorded the other peers, then take its only
	// seed away for good.
	for {
		known := p4.node.peer.DataDir().LoadKnownPeers()
		if len(known) >= 3 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("peer-4 knows only %v", known)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := peers[0].node.Leave(ctx); err != nil {
		t.Fatalf("peer-1 leave: %v", err)
	}
	p4.node.peer.Kill()
	p4.start(t)
	p4.waitReady(t)
	for _, key := range []string{"a", "b", "c", "d"} {
		l, err := p4.node.Lock(ctx, key)
		if err != nil {
			t.Fatalf("lock %q on the restarted peer-4, whose seed left: %v", key, err)
		}
		l.Release()
	}
}

// The known peers file is only a cache of addresses: one torn by a crash
// (or from a newer release) is ignored with a warning that says it is
// safe, and the peer starts and serves (issue 18: it refused to start,
// with an error that did not say the file may be deleted).
func TestTornKnownPeersFileIsIgnored(t *testing.T) {
	for name, content := range map[string][]byte{
		"torn":          {0x82, 0xa1, 0x76},                       // a map cut short
		"newer release": {0x82, 0xa1, 'v', 0x09, 0xa1, 'a', 0x90}, // version 9
	} {
		t.Run(name, func(t *testing.T) {
			rec := newLogRecorder()
			peers := startClusterWith(t, clusterOpts{peers: 1, rf: 1, shards: 1}, func(_ int, c *Config) {
				c.Logger = slog.New(rec)
				if err := c.fs.MkdirAll(c.DataDir, 0o700); err != nil {
					t.Fatal(err)
				}
				f, err := c.fs.Create(c.fs.PathJoin(c.DataDir, datadir.KnownPeersFile))
				if err != nil {
					t.Fatal(err)
				}
				f.Write(content)
				f.Close()
			})
			lockAndUnlock(t, peers[0].node, "known/a")
			if !slices.ContainsFunc(rec.warnings(), func(m string) bool { return strings.HasPrefix(m, "ignoring the known peers file") }) {
				t.Fatalf("no warning about the unreadable file; warnings: %v", rec.warnings())
			}
		})
	}
}

// Ready closes as soon as a restarted peer has read its layout, before the
// shards have leaders again; WaitServing returns once every lock shard has
// one, and a Lock then needs no election (issue 11: the first Lock came
// 2.5 s after Ready, 7.3 s after a whole-cluster restart).
func TestWaitServingAfterWholeClusterRestart(t *testing.T) {
	// Fixed gossip ports: restarted peers find each other at the same
	// addresses, as real ones do.
	o := clusterOpts{peers: 3, rf: 3, shards: 4, mutate: func(c *Config) { c.GossipAddr = freeAddr(t) }}
	peers := startCluster(t, o)
	for _, p := range peers {
		p.node.peer.Kill()
	}
	for _, p := range peers {
		p.start(t)
	}
	ctx := ctxT(t, 60*time.Second)
	n := peers[0].node
	if err := n.WaitServing(ctx); err != nil {
		t.Fatalf("WaitServing after a whole-cluster restart: %v", err)
	}
	for _, shard := range n.peer.Placement().ShardIDs()[1:] {
		if _, _, ok, err := n.peer.NodeHost().GetLeaderID(shard); err != nil || !ok {
			t.Errorf("WaitServing returned but shard %d has no leader known here (%v)", shard, err)
		}
	}
	l, err := n.Lock(ctx, "after-restart")
	if err != nil {
		t.Fatalf("Lock after WaitServing: %v", err)
	}
	l.Release()

	// A peer alone (the others down) is Ready but never serving.
	for _, p := range peers[1:] {
		p.node.peer.Kill()
	}
	n.peer.Kill()
	peers[0].start(t)
	peers[0].waitReady(t)
	sctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := peers[0].node.WaitServing(sctx); !errors.Is(err, ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitServing on a peer without a quorum: %v; want ErrUnavailable and the deadline", err)
	}
}
