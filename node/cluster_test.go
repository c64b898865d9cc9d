package node

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/lni/vfs"

	"github.com/lockmesh/lockmesh/internal/peer"
)

// testPeer is one peer of an in-process test cluster. Its file system is
// in memory and survives restarts of the peer.
type testPeer struct {
	cfg   Config
	hooks peer.Hooks
	node  *Node
}

type clusterOpts struct {
	peers, expect, shards, rf int
	ttl                       time.Duration
	deadAfter                 time.Duration     // 0: the default
	mutate                    func(*Config)     // changes each peer's config, if set
	hook                      func(*peer.Hooks) // sets each peer's test hooks, if set
}

var (
	handedOutMu sync.Mutex
	handedOut   = map[string]bool{} // addresses freeAddr returned
)

// freeAddr returns a loopback address whose port is free for TCP and UDP
// (memberlist binds both). The port is below Linux's ephemeral range
// (32768-60999), so the outgoing connections of tests running in other
// packages cannot take it between this check and the peer's bind, as
// happened to a gossip port picked with ":0".
//
// Each address is handed out once per test process: a port is free only
// until its peer binds it, and a fault cluster picks every address of its
// peers before starting them, so a repeat would make the later peer fail
// with "address already in use" (seen once in CI).
func freeAddr(t testing.TB) string {
	t.Helper()
	handedOutMu.Lock()
	defer handedOutMu.Unlock()
	for range 1000 {
		addr := fmt.Sprintf("127.0.0.1:%d", 20000+rand.IntN(12000))
		if handedOut[addr] {
			continue
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		u, err := net.ListenPacket("udp", addr)
		l.Close()
		if err != nil {
			continue
		}
		u.Close()
		handedOut[addr] = true
		return addr
	}
	t.Fatal("no free loopback port in 20000-31999")
	return ""
}

func testLogger() *slog.Logger {
	if os.Getenv("LOCKMESH_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return nil
}

func testConfig(t testing.TB, name string, o clusterOpts) Config {
	return Config{
		Name:              name,
		DataDir:           "/data/" + name,
		GossipAddr:        "127.0.0.1:0",
		RaftAddr:          freeAddr(t),
		RPCAddr:           "127.0.0.1:0",
		BootstrapExpect:   o.expect,
		Shards:            o.shards,
		ReplicationFactor: o.rf,
		SessionTTL:        o.ttl,
		DeadAfter:         o.deadAfter,
		RTT:               10 * time.Millisecond,
		Logger:            testLogger(),
		fs:                vfs.NewMem(),
	}
}

// startCluster starts o.peers peers that bootstrap together and waits until
// every one of them is ready.
func startCluster(t testing.TB, o clusterOpts) []*testPeer {
	t.Helper()
	if o.expect == 0 {
		o.expect = o.peers
	}
	if o.shards == 0 {
		o.shards = 4
	}
	if o.ttl == 0 {
		o.ttl = time.Second
	}
	var peers []*testPeer
	var seed string
	for i := 0; i < o.peers; i++ {
		cfg := testConfig(t, fmt.Sprintf("peer-%d", i+1), o)
		if seed != "" {
			cfg.Join = []string{seed}
		}
		if o.mutate != nil {
			o.mutate(&cfg)
		}
		p := &testPeer{cfg: cfg}
		if o.hook != nil {
			o.hook(&p.hooks)
		}
		p.start(t)
		if seed == "" {
			seed = p.node.GossipAddr()
		}
		peers = append(peers, p)
	}
	t.Cleanup(func() {
		for _, p := range peers {
			p.stop()
		}
	})
	for _, p := range peers {
		p.waitReady(t)
	}
	return peers
}

func (p *testPeer) start(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := start(ctx, p.cfg, p.hooks)
	if err != nil {
		t.Fatalf("start %s: %v", p.cfg.Name, err)
	}
	p.node = n
}

func (p *testPeer) waitReady(t testing.TB) {
	t.Helper()
	select {
	case <-p.node.Ready():
	case <-time.After(20 * time.Second):
		t.Fatalf("%s not ready after 20s", p.cfg.Name)
	}
}

func (p *testPeer) stop() {
	if p.node != nil {
		p.node.Close()
	}
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestClusterLockBasics(t *testing.T) {
	peers := startCluster(t, clusterOpts{peers: 3, rf: 3})
	a, b := peers[0].node, peers[1].node
	ctx := ctxT(t, 20*time.Second)

	l1, err := a.Lock(ctx, "invoice/42")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.TryLock(ctx, "invoice/42"); !errorsIs(err, ErrLocked) {
		t.Fatalf("TryLock on held key: %v, want ErrLocked", err)
	}
	if err := l1.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l1.Unlock(ctx); !errorsIs(err, ErrNotHeld) {
		t.Fatalf("second Unlock: %v, want ErrNotHeld", err)
	}
	l2, err := b.TryLock(ctx, "invoice/42")
	if err != nil {
		t.Fatal(err)
	}
	if l2.Token() <= l1.Token() {
		t.Fatalf("token did not grow: %d then %d", l1.Token(), l2.Token())
	}
	if err := l2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestReleaseHandsOnWithoutWaiting(t *testing.T) {
	peers := startCluster(t, clusterOpts{peers: 3, rf: 3})
	a, b := peers[0].node, peers[1].node
	ctx := ctxT(t, 20*time.Second)

	l1, err := a.Lock(ctx, "report/7")
	if err != nil {
		t.Fatal(err)
	}
	granted := make(chan *Lock, 1)
	go func() {
		l, err := b.Lock(ctx, "report/7")
		if err != nil {
			t.Error(err)
		}
		granted <- l
	}()
	waitQueued(t, a, "report/7", 1)
	if err := l1.Release(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l1.Done(): // closed by Release itself, before anything commits
	default:
		t.Fatal("Done still open after Release returned")
	}
	if !errorsIs(l1.Err(), ErrNotHeld) {
		t.Fatalf("Err after Release: %v, want ErrNotHeld", l1.Err())
	}
	if err := l1.Release(); !errorsIs(err, ErrNotHeld) {
		t.Fatalf("second Release: %v, want ErrNotHeld", err)
	}
	if err := l1.Unlock(ctx); !errorsIs(err, ErrNotHeld) {
		t.Fatalf("Unlock after Release: %v, want ErrNotHeld", err)
	}
	l2 := <-granted
	if l2 == nil {
		t.FailNow()
	}
	if l2.Token() <= l1.Token() {
		t.Fatalf("token did not grow: %d then %d", l1.Token(), l2.Token())
	}
	if err := l2.Release(); err != nil {
		t.Fatal(err)
	}
}

// A TryLock right after Release on the same node waits for the release
// instead of being refused by it.
func TestTryLockAfterReleaseOnSameNode(t *testing.T) {
	peers := startCluster(t, clusterOpts{peers: 3, rf: 3})
	n := peers[0].node
	ctx := ctxT(t, 30*time.Second)
	var last uint64
	for i := range 50 {
		l, err := n.TryLock(ctx, "hot")
		if err != nil {
			t.Fatalf("TryLock %d: %v", i, err)
		}
		if l.Token() <= last {
			t.Fatalf("TryLock %d: token %d after %d", i, l.Token(), last)
		}
		last = l.Token()
		if err := l.Release(); err != nil {
			t.Fatal(err)
		}
	}
	// On another node the key is free once the last release commits.
	pollUntil(t, 10*time.Second, "hot free", func() bool {
		info, err := peers[1].node.Inspect(ctx, "hot")
		return err == nil && len(info.Holders) == 0
	})
	l, err := peers[1].node.TryLock(ctx, "hot")
	if err != nil {
		t.Fatal(err)
	}
	if l.Token() <= last {
		t.Fatalf("token %d after %d", l.Token(), last)
	}
}
