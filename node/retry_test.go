package node

import (
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/lockfsm"
)

// A request whose outcome was unknown is sent again with the same request
// id: the repeat must be answered from the first grant, never grant twice.
func TestRetriedAcquireNeverGrantsTwice(t *testing.T) {
	peers := startCluster(t, clusterOpts{peers: 3, rf: 3})
	n := peers[0].node
	ctx := ctxT(t, 20*time.Second)
	p, _ := n.waitReady(ctx)
	shard := p.shardOf("retry")
	s, err := n.session(ctx, shard)
	if err != nil {
		t.Fatal(err)
	}
	req := s.newRequest()
	cmd := lockfsm.Command{Op: lockfsm.OpAcquire, Session: s.id, Req: req, Key: "retry", Wait: true, Limit: 1}
	first, err := n.apply(ctx, shard, cmd)
	if err != nil {
		t.Fatal(err)
	}
	// The same bytes again, as the retry loop sends them, through another
	// peer (the way a forwarded retry can land elsewhere).
	second, err := peers[2].node.apply(ctx, shard, cmd)
	if err != nil {
		t.Fatal(err)
	}
	if first.Status != lockfsm.StatusGranted || second.Status != lockfsm.StatusGranted || first.Token != second.Token {
		t.Fatalf("first %+v, retry %+v: want both granted with one token", first, second)
	}
	info, err := n.Inspect(ctx, "retry")
	if err != nil {
		t.Fatal(err)
	}
	if len(info.Holders) != 1 || len(info.Waiters) != 0 {
		t.Fatalf("after a retried acquire the key shows %+v", info)
	}
	// A second attempt (new request id) of the same session waits: the
	// session does not hold the key twice.
	third, err := n.apply(ctx, shard, lockfsm.Command{Op: lockfsm.OpAcquire, Session: s.id, Req: s.newRequest(), Key: "retry", Wait: false, Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	if third.Status != lockfsm.StatusLocked {
		t.Fatalf("a second attempt of the same session got %v", third.Status)
	}
}
