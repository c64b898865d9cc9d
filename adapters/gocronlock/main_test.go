package gocronlock_test

import (
	"bytes"
	"context"
	"log"
	"net"
	"os"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/node"
	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind: an
// Elector's campaign, a scheduler or a peer.
func TestMain(m *testing.M) {
	log.SetOutput(quietPebble{})
	goleak.VerifyTestMain(m,
		// memberlist's Shutdown does not wait for a probe in flight; the
		// probe returns by itself within the probe timeout.
		goleak.IgnoreTopFunction("github.com/hashicorp/memberlist.(*Memberlist).probeNode"),
	)
}

// quietPebble drops pebble's "vfs: not supported" background lines, as
// node's tests do.
type quietPebble struct{}

func (quietPebble) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte("vfs: not supported")) {
		return len(p), nil
	}
	return os.Stderr.Write(p)
}

// startPeer starts a one-peer cluster on 127.0.0.1 with its data in a
// temporary directory, ready for locks, and closes it when the test ends.
func startPeer(t testing.TB) *node.Node {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	raft := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	n, err := node.Start(ctx, node.Config{
		Name:              "gocron-test",
		DataDir:           t.TempDir(),
		GossipAddr:        "127.0.0.1:0",
		RaftAddr:          raft,
		RPCAddr:           "127.0.0.1:0",
		BootstrapExpect:   1,
		ReplicationFactor: 1,
		Shards:            2,
		RTT:               10 * time.Millisecond, // one machine: elect in ~0.1s
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	select {
	case <-n.Ready():
	case <-ctx.Done():
		t.Fatal("the peer was not ready within 15 s")
	}
	return n
}

// newSession opens a Session on n, closed when the test ends.
func newSession(t testing.TB, n *node.Node) *node.Session {
	t.Helper()
	s, err := n.NewSession(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	return s
}

// testCtx is a context that ends after d, or when the test does.
func testCtx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
