package node

import (
	"context"
	"time"

	"github.com/lockmesh/lockmesh/lockfsm"
)

// waiterKey names one queued acquire attempt.
type waiterKey struct{ shard, session, req uint64 }

// Grant delivery. A queued attempt learns of its grant in one way: a wake
// on its channel. Its value is the token when this peer's own replica
// applied the hand-off (the replicated state itself says so), or
// verifyGrant when a peer pushed a notice, which the waiter checks with a
// linearizable read of its attempt before Lock returns: a notice proves
// nothing, since anyone who reaches the RPC port can send one. The leader
// pushes notices only to owners that host no replica of the shard, and
// only for hand-offs (an Acquire granted at once is answered by its
// result). A waiter also re-reads its attempt at a slow interval, so a
// lost notice delays a grant but never strands it.
const verifyGrant uint64 = 0

func (n *Node) addWaiter(shard, session, req uint64) <-chan uint64 {
	ch := make(chan uint64, 1)
	n.waitMu.Lock()
	n.waiters[waiterKey{shard, session, req}] = ch
	n.waitMu.Unlock()
	return ch
}

func (n *Node) removeWaiter(shard, session, req uint64) {
	n.waitMu.Lock()
	delete(n.waiters, waiterKey{shard, session, req})
	n.waitMu.Unlock()
}

// wake hands token (or verifyGrant) to the waiter of (shard, session, req),
// if it is still waiting. A token replaces a pending notice; a notice
// never replaces anything.
func (n *Node) wake(shard, session, req, token uint64) {
	n.waitMu.Lock()
	defer n.waitMu.Unlock()
	ch := n.waiters[waiterKey{shard, session, req}]
	if ch == nil {
		return
	}
	select {
	case ch <- token:
		return
	default:
	}
	if token == verifyGrant {
		return
	}
	// Full: it holds a notice (or this same token). Swap it for the token;
	// wakes are sent under waitMu, so nothing refills it meanwhile.
	select {
	case <-ch:
	default:
	}
	ch <- token
}

// notifyJob is a grant to push to the peer owning the session.
type notifyJob struct {
	owner string
	shard uint64
	grant lockfsm.Grant
}

// onApplyGrants is called by a lock shard's state machine, on dragonboat's
// apply goroutine, for the hand-offs an entry made. It must not block:
// grants for this peer's sessions wake their waiters, and the leader
// queues notices for owners that host no replica of the shard. Replaying
// the log after a restart calls it again; nobody waits for those attempts
// any more, so nothing happens.
func (n *Node) onApplyGrants(shard uint64, grants []lockfsm.Grant) {
	leader := n.leases.IsLeader(shard)
	p := n.placement.Load()
	for _, g := range grants {
		switch {
		case g.Owner == n.cfg.Name:
			n.wake(shard, g.Session, g.Req, g.Token)
		case leader && (p == nil || !p.Hosts(shard, g.Owner)):
			select {
			case n.notifyQ <- notifyJob{owner: g.Owner, shard: shard, grant: g}:
			default:
				// A full queue drops the notice; the waiter's slow
				// re-read still finds the grant.
			}
		}
	}
}

// onNotice handles grant notices pushed by a shard leader: each wakes its
// waiter to verify the grant. Nothing in a notice is trusted.
func (n *Node) onNotice(req notifyReq) {
	for _, g := range req.Grants {
		if g.Owner == n.cfg.Name {
			n.wake(req.Shard, g.Session, g.Req, verifyGrant)
		}
	}
}

// notifyLoop pushes queued grants to their owners, one batched call per
// owner and shard.
func (n *Node) notifyLoop() {
	for {
		var first notifyJob
		select {
		case first = <-n.notifyQ:
		case <-n.stop:
			return
		}
		type dest struct {
			owner string
			shard uint64
		}
		batch := map[dest][]lockfsm.Grant{{first.owner, first.shard}: {first.grant}}
	drain:
		for {
			select {
			case j := <-n.notifyQ:
				d := dest{j.owner, j.shard}
				batch[d] = append(batch[d], j.grant)
			default:
				break drain
			}
		}
		for d, grants := range batch {
			addr, ok := n.rpcAddr(d.owner)
			if !ok {
				continue
			}
			body, err := encodeBody(notifyReq{Shard: d.shard, Grants: grants})
			if err != nil {
				continue
			}
			n.goFunc(func() {
				ctx, cancel := context.WithTimeout(n.ctx, time.Second)
				defer cancel()
				if _, err := n.peers.Call(ctx, addr, methodNotify, body); err != nil {
					n.log.Debug("grant notification lost", "owner", d.owner, "shard", d.shard, "err", err)
				}
			})
		}
	}
}
