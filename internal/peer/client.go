package peer

import (
	"context"
	"errors"
	"time"

	"github.com/lockmesh/lockmesh/internal/client"
	"github.com/lockmesh/lockmesh/internal/clock"
	"github.com/lockmesh/lockmesh/internal/replica"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// The client side of sessions (internal/client) reaches the cluster
// through the calls newClient gives it; the peer keeps the routing.

// newClient builds this peer's client side: its sessions, their leases and
// keepalives, and the waiters of its queued attempts.
func newClient(n *Peer) *client.Client {
	return client.New(client.Config{
		Name:         n.cfg.Name,
		SessionTTL:   n.cfg.SessionTTL,
		LeaseMargin:  n.cfg.LeaseMargin,
		CloseTimeout: 20 * n.cfg.RTT,
		Clock:        HolderClock(n.cfg.Clock),
		// Rounds on Go's clock, as before the split: a jump of the lease
		// clock moves deadlines, not the keepalives that keep them.
		RoundClock:  clock.System{},
		Log:         n.log,
		Apply:       n.clientApply,
		ApplyGroup:  n.clientApplyGroup,
		ReadAttempt: n.readAttempt,
		ReadKey:     n.readKey,
		// The router is made later, in open; keepalives start after it.
		KeepAlive: func(ctx context.Context, shard uint64, ids []uint64) ([]uint64, error) {
			start := time.Now()
			expired, err := n.router.KeepAlive(ctx, shard, ids)
			n.obs.OnKeepAlive(shard, start, err)
			return expired, err
		},
		Go:       func(f func(context.Context)) { n.goFunc(func() { f(n.ctx) }) },
		Stop:     n.ctx.Done(),
		Level:    n.ClusterLevel,
		OnQueued: n.obs.OnQueued,
		OnLost:   n.obs.OnLost,
	})
}

// keepAliveLoop runs the client's keepalive loop (internal/client); the
// router delivers each keepalive to its shard's leader.
func (n *Peer) keepAliveLoop() { n.client.RunKeepAlives(n.ctx) }

// clientApply is apply for the client side, where a test can make the
// withdrawal of an abandoned attempt fail as one that cannot commit does.
func (n *Peer) clientApply(ctx context.Context, shard uint64, cmd lockfsm.Command) (lockfsm.Result, error) {
	if cmd.Op == lockfsm.OpCancel && n.hooks.DropCancels != nil && n.hooks.DropCancels() {
		return lockfsm.Result{}, errors.New("cancel dropped by a test")
	}
	res, err := n.Apply(ctx, shard, cmd)
	if err == nil && cmd.Op == lockfsm.OpAcquire && n.hooks.UnsafeGrantQueued {
		res = grantQueued(res)
	}
	return res, err
}

// clientApplyGroup is ApplyGroup for the client side, where a test can
// break it as clientApply.
func (n *Peer) clientApplyGroup(ctx context.Context, shard uint64, cmds []lockfsm.Command) ([]lockfsm.Result, error) {
	res, err := n.router.ApplyGroup(ctx, shard, cmds)
	if err == nil && n.hooks.UnsafeGrantQueued {
		for i := range res {
			res[i] = grantQueued(res[i])
		}
	}
	return res, err
}

// grantQueued is peer.Hooks.UnsafeGrantQueued's broken reading of an
// acquire's answer: queued counts as granted.
func grantQueued(res lockfsm.Result) lockfsm.Result {
	if res.Status == lockfsm.StatusQueued {
		res.Status = lockfsm.StatusGranted
	}
	return res
}

// readAttempt reads a lock attempt from the replicated state, for a
// waiter checking a grant notice.
func (n *Peer) readAttempt(ctx context.Context, shard, session, req uint64) (bool, lockfsm.RequestInfo, error) {
	a, err := n.read(ctx, shard, replica.Query{Kind: replica.QueryRequest, Session: session, Req: req})
	return a.SessionFound, a.Request, err
}

// readKey reads a key's holders and waiters from the replicated state,
// for a wait that gave up (WaitError).
func (n *Peer) readKey(ctx context.Context, shard uint64, key string) (lockfsm.KeyInfo, bool, error) {
	a, err := n.router.ReadRetrying(ctx, shard, replica.Query{Kind: replica.QueryKey, Key: key})
	return a.Key, a.KeyFound, err
}

// closeSessions ends every session of this peer, handing their locks to
// waiters at once; orphaned ones are left to their TTL. Used by Close;
// bounded by a few RTTs per shard.
func (n *Peer) closeSessions() { n.client.Close(n.ctx) }

// HolderClock is the clock the holder's side counts its lease and hold
// deadlines on: for clock.System, the leader's, clock.Boot, which counts
// the time the machine spent suspended; a test's clock as it is, read by
// both sides. Each side errs the safe way for it (docs/SAFETY.md).
func HolderClock(c clock.Clock) clock.Clock {
	if _, ok := c.(clock.System); ok {
		return clock.Boot{}
	}
	return c
}

// Client returns the client side of this peer's sessions.
func (n *Peer) Client() *client.Client { return n.client }
