package node

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/internal/peer"
)

// A lock attempt abandoned when its ctx ended must not keep the key when
// the withdrawal cannot commit: the session's keepalives would keep the
// queued request alive, and when granted it is held by nobody, for as long
// as the peer lives. The delay-drop nemesis saw a free-looking key stay
// unlockable. Now the session is lost and closed on the cluster instead.
func TestAbandonedAttemptWhoseCancelFailsDoesNotKeepTheKey(t *testing.T) {
	var drop atomic.Bool
	o := clusterOpts{peers: 3, rf: 3, shards: 2, hook: func(h *peer.Hooks) { h.DropCancels = drop.Load }}
	peers := startCluster(t, o)
	ctx := ctxT(t, 30*time.Second)
	holder, err := peers[0].node.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	drop.Store(true)
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = peers[1].node.Lock(wctx, "k")
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("queued Lock with a short ctx: %v, want the deadline", err)
	}
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// The abandoned request must not have the key for longer than the
	// session takes to be closed or to expire (a TTL and a little).
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	l, err := peers[2].node.Lock(lctx, "k")
	if err != nil {
		info, _ := peers[2].node.Inspect(ctx, "k")
		t.Fatalf("key still taken after the holder unlocked and the waiter gave up: %v; holders %v waiters %v", err, info.Holders, info.Waiters)
	}
	l.Release()
}
