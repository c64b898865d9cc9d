package leader

import (
	"context"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/lockmesh/lockmesh/internal/client"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// Grant delivery (client.Waiters). A queued attempt learns of its grant
// in one way: a wake on its channel. Its value is the token when this
// peer's own replica applied the hand-off (the replicated state itself
// says so), or client.Verify when a peer pushed a notice, which the
// waiter checks with a linearizable read of its attempt before Lock
// returns: a notice proves nothing, since anyone who reaches the RPC port
// can send one. The leader pushes notices only to owners that host no
// replica of the shard, and only for hand-offs (an Acquire granted at
// once is answered by its result). A waiter also re-reads its attempt at
// a slow interval, so a lost notice delays a grant but never strands it.

// Notice is a grant notice a shard's leader pushes to the peer owning the
// granted sessions (Config.NotifyMethod). It is a hint: nothing in it is
// trusted.
type Notice struct {
	Shard  uint64          `msgpack:"s"`
	Grants []lockfsm.Grant `msgpack:"g"`
}

// notifyJob is a grant to push to the peer owning the session.
type notifyJob struct {
	owner string
	shard uint64
	grant lockfsm.Grant
}

// notifyQueue is how many grants wait to be pushed; a full queue drops
// notices.
const notifyQueue = 4096

// OnApplyGrants is called by a lock shard's state machine, on dragonboat's
// apply goroutine, for the hand-offs an entry made. It must not block:
// grants for this peer's sessions wake their waiters, and the leader
// queues notices for owners that host no replica of the shard. Replaying
// the log after a restart calls it again; nobody waits for those attempts
// any more, so nothing happens.
func (s *Sessions) OnApplyGrants(shard uint64, grants []lockfsm.Grant) {
	leader := s.leases.IsLeader(shard)
	p := s.host.Placement()
	for _, g := range grants {
		switch {
		case g.Owner == s.cfg.Name:
			s.cfg.Waiters.Wake(client.WaiterKey{Shard: shard, Session: g.Session, Req: g.Req}, g.Token)
		case leader && (p == nil || !p.Hosts(shard, g.Owner)):
			select {
			case s.notifyQ <- notifyJob{owner: g.Owner, shard: shard, grant: g}:
			default:
				// A full queue drops the notice; the waiter's slow
				// re-read still finds the grant.
			}
		}
	}
}

// OnNotice handles a grant notice pushed by a shard leader, once node has
// checked that its sender hosts the shard: each grant for this peer wakes
// its waiter to verify the grant. Nothing in a notice is trusted.
func (s *Sessions) OnNotice(req Notice) {
	for _, g := range req.Grants {
		if g.Owner == s.cfg.Name {
			s.cfg.Waiters.Wake(client.WaiterKey{Shard: req.Shard, Session: g.Session, Req: g.Req}, client.Verify)
		}
	}
}

// maxNotifyCalls bounds the grant notices being pushed at once.
const maxNotifyCalls = 64

// notifyLoop pushes queued grants to their owners, one batched call per
// owner and shard, at most maxNotifyCalls at once.
func (s *Sessions) notifyLoop(ctx context.Context) {
	for {
		var first notifyJob
		select {
		case first = <-s.notifyQ:
		case <-ctx.Done():
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
			case j := <-s.notifyQ:
				d := dest{j.owner, j.shard}
				batch[d] = append(batch[d], j.grant)
			default:
				break drain
			}
		}
		for d, grants := range batch {
			addr, ok := s.host.Addr(d.owner)
			if !ok {
				continue
			}
			body, err := msgpack.Marshal(Notice{Shard: d.shard, Grants: grants})
			if err != nil {
				continue
			}
			// At most maxNotifyCalls pushes at once: the loop waits for a
			// slot, the queue fills meanwhile, and a full queue drops
			// notices (the waiters' re-read finds their grants).
			select {
			case s.notifySlots <- struct{}{}:
			case <-ctx.Done():
				return
			}
			s.goFunc(func() {
				defer func() { <-s.notifySlots }()
				ctx, cancel := context.WithTimeout(ctx, time.Second)
				defer cancel()
				if _, err := s.host.Call(ctx, addr, s.cfg.NotifyMethod, body); err != nil {
					s.log.Debug("grant notification lost", "owner", d.owner, "shard", d.shard, "err", err)
				}
			})
		}
	}
}
