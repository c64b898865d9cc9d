package node

import (
	"context"
	"time"

	"github.com/lockmesh/lockmesh/lockfsm"
)

// waiterKey names one queued acquire attempt.
type waiterKey struct{ shard, session, req uint64 }

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

// notifyJob is a grant to push to the peer owning the session.
type notifyJob struct {
	owner string
	shard uint64
	grant lockfsm.Grant
}

// onApplyGrants is called by a lock shard's state machine, on dragonboat's
// apply goroutine, for the grants an entry made. It must not block: grants
// for local sessions are handed to their waiters, and the leader queues the
// others for their owners. Replaying the log after a restart calls it
// again; nobody waits for those attempts any more, so nothing happens.
func (n *Node) onApplyGrants(shard uint64, grants []lockfsm.Grant) {
	n.deliverGrants(shard, grants, true)
}

func (n *Node) deliverGrants(shard uint64, grants []lockfsm.Grant, applied bool) {
	leader := applied && n.leases.IsLeader(shard)
	for _, g := range grants {
		if g.Owner == n.cfg.Name {
			n.waitMu.Lock()
			ch := n.waiters[waiterKey{shard, g.Session, g.Req}]
			n.waitMu.Unlock()
			if ch != nil {
				select {
				case ch <- g.Token:
				default:
				}
			}
			continue
		}
		if leader {
			select {
			case n.notifyQ <- notifyJob{owner: g.Owner, shard: shard, grant: g}:
			default:
				// A full queue drops the notification; the waiter's slow
				// poll still finds the grant.
			}
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
