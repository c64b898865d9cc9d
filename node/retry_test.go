package node

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/lni/dragonboat/v4"

	"github.com/lockmesh/lockmesh/internal/lockerr"
	"github.com/lockmesh/lockmesh/internal/membership"
	"github.com/lockmesh/lockmesh/internal/peer"
	"github.com/lockmesh/lockmesh/internal/router"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// A request whose outcome was unknown is sent again with the same request
// id: the repeat must be answered from the first grant, never grant twice.
func TestRetriedAcquireNeverGrantsTwice(t *testing.T) {
	peers := startCluster(t, clusterOpts{peers: 3, rf: 3})
	n := peers[0].node
	ctx := ctxT(t, 20*time.Second)
	p, _ := n.peer.WaitReady(ctx)
	shard := p.ShardOf("retry")
	owner, err := n.client.Default(shard)
	if err != nil {
		t.Fatal(err)
	}
	s, err := owner.OnShard(ctx, shard)
	if err != nil {
		t.Fatal(err)
	}
	req := s.Attempts().Begin()
	cmd := lockfsm.Command{Op: lockfsm.OpAcquire, Session: s.ID(), Req: req, Key: "retry", Wait: true, Limit: 1}
	first, err := n.peer.Apply(ctx, shard, cmd)
	if err != nil {
		t.Fatal(err)
	}
	// The same bytes again, as the retry loop sends them, through another
	// peer (the way a forwarded retry can land elsewhere).
	second, err := peers[2].node.peer.Apply(ctx, shard, cmd)
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
	third, err := n.peer.Apply(ctx, shard, lockfsm.Command{Op: lockfsm.OpAcquire, Session: s.ID(), Req: s.Attempts().Begin(), Key: "retry", Wait: false, Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	if third.Status != lockfsm.StatusLocked {
		t.Fatalf("a second attempt of the same session got %v", third.Status)
	}
}

// A release retried after its first try committed, while the session's
// other requests moved the acknowledged id past the lock, is answered OK:
// the release's own pending request id keeps the attempt remembered.
func TestRetriedReleaseAfterAckMoved(t *testing.T) {
	peers := startCluster(t, clusterOpts{peers: 3, rf: 3})
	n := peers[0].node
	ctx := ctxT(t, 20*time.Second)
	l, err := n.Lock(ctx, "retry-release")
	if err != nil {
		t.Fatal(err)
	}
	s, shard := l.h.Session(), l.h.Session().Shard()
	p, _ := n.peer.WaitReady(ctx)
	other := ""
	for i := 0; other == ""; i++ {
		if k := fmt.Sprintf("other-%d", i); p.ShardOf(k) == shard {
			other = k
		}
	}
	// moveAck runs another acquire and release of the session, carrying
	// the current acknowledged id, so the state machine prunes what it may.
	moveAck := func() {
		t.Helper()
		o, err := n.Lock(ctx, other)
		if err != nil {
			t.Fatal(err)
		}
		if err := o.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}

	cmd, done := s.ReleaseCommand(l.h.Req())
	for try := range 2 {
		res, err := n.peer.Apply(ctx, shard, cmd)
		if err != nil {
			t.Fatal(err)
		}
		if res.Status != lockfsm.StatusOK {
			t.Fatalf("release try %d: %v, want OK", try+1, res.Status)
		}
		moveAck()
	}
	// Once the answer is in, the attempt may go: the same release is then
	// unknown, which is why the request id must stay pending until then.
	done()
	moveAck()
	moveAck()
	res, err := n.peer.Apply(ctx, shard, cmd)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != lockfsm.StatusNotHeld {
		t.Fatalf("release after its answer was acknowledged: %v, want NotHeld (pruned)", res.Status)
	}
}

// Errors that say "not here, not now" are retried elsewhere instead of
// failing the caller; a replica that closed because it moved is one
// (issue 11: a lock failed during rebalancing with "raft shard already
// closed"), and so is a remote peer's answer for one.
func TestRetryableErrors(t *testing.T) {
	for _, err := range []error{
		dragonboat.ErrShardClosed,
		fmt.Errorf("propose: %w", dragonboat.ErrShardClosed),
		membership.Busy(3, dragonboat.ErrShardClosed),
		dragonboat.ErrShardNotFound,
		dragonboat.ErrTimeout,
		peer.RPCError(lockerr.CodeNotHosted, "moved"),
	} {
		if !router.Retryable(err) {
			t.Errorf("%v: not retryable", err)
		}
	}
	for _, err := range []error{ErrClosed, ErrInvalidKey, errors.New("corrupt entry")} {
		if router.Retryable(err) {
			t.Errorf("%v: retryable", err)
		}
	}
}
