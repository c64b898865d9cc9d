package node

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/lni/dragonboat/v4/raftio"

	"github.com/lockmesh/lockmesh/internal/cluster"
	"github.com/lockmesh/lockmesh/internal/lease"
	"github.com/lockmesh/lockmesh/internal/replica"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// Leader-side leases: the Raft and RPC side of internal/lease. The table
// there decides, by the rules of docs/SAFETY.md (listed at the top of
// internal/lease), which keepalives are acknowledged, when a new leader's
// term must be recorded and which sessions have lapsed; this file confirms
// leadership (ReadIndex), reads the shards' sessions and recorded terms,
// and proposes LeaderTerm and ExpireSession as the table decides.

// leaseTable is this peer's lease table and the wake-up of its expiry
// loop.
type leaseTable struct {
	*lease.Table
	// kick wakes the expiry loop when this peer becomes a leader, so it
	// records its term at once instead of at the next tick.
	kick chan struct{}
}

func (t *leaseTable) init(cfg Config, hooks testHooks) {
	t.Table = lease.New(lease.Options{
		ElectionTimeout:   cluster.ElectionRTT * cfg.RTT, // every replica's election timeout
		UnsafeExpireAfter: hooks.unsafeExpireAfter,
	})
	t.kick = make(chan struct{}, 1)
}

// leaderUpdated records a leader change reported by dragonboat.
func (t *leaseTable) leaderUpdated(info raftio.LeaderInfo, now time.Time) {
	if t.LeaderChanged(info.ShardID, info.ReplicaID, info.LeaderID, info.Term, now) {
		t.wake()
	}
}

func (t *leaseTable) wake() {
	select {
	case t.kick <- struct{}{}:
	default:
	}
}

// serveKeepAlive runs on the leader of a shard for keepalives of the
// sessions of one peer.
func (n *Node) serveKeepAlive(ctx context.Context, req keepAliveReq) (keepAliveResp, error) {
	received := n.now()
	p := n.placement.Load()
	if p == nil || !n.hostsShard(req.Shard) {
		return keepAliveResp{}, rpcError(codeNotHosted, "peer %s hosts no replica of shard %d", n.cfg.Name, req.Shard)
	}
	self, _ := n.localReplica(req.Shard)
	leaderID, term, valid, err := n.nh.GetLeaderID(req.Shard)
	if err != nil || !valid {
		return keepAliveResp{}, rpcError(codeBusy, "shard %d has no leader yet", req.Shard)
	}
	if leaderID != self {
		hint := "?" // not empty: an empty Leader means "acknowledged"
		if pe, ok := p.PeerByReplica(leaderID); ok {
			hint = pe.Name
		}
		return keepAliveResp{Leader: hint}, nil
	}
	ctx, cancel := context.WithTimeout(ctx, n.proposalTimeout())
	defer cancel()
	// Rule 1: confirm leadership and catch up the local replica first.
	a, err := n.readLocal(ctx, req.Shard, replica.Query{Kind: replica.QuerySessions})
	if err != nil {
		return keepAliveResp{}, rpcError(codeBusy, "shard %d: confirm leadership: %v", req.Shard, err)
	}
	if _, term2, valid, err := n.nh.GetLeaderID(req.Shard); err != nil || !valid || term2 != term {
		return keepAliveResp{}, rpcError(codeBusy, "shard %d: leadership changed during keepalive", req.Shard)
	}
	_, lost, err := n.leases.Ack(req.Shard, term, lease.State{Term: a.Term, Sessions: a.Sessions}, req.Sessions, received)
	switch {
	case errors.Is(err, lease.ErrTermNotRecorded):
		// Rule 0: the expiry loop records the term; the sender retries.
		n.leases.wake()
		return keepAliveResp{}, rpcError(codeBusy, "shard %d: the leader of term %d has not recorded its term yet (state has %d)", req.Shard, term, a.Term)
	case err != nil:
		return keepAliveResp{}, rpcError(codeBusy, "shard %d, leader term %d (state has %d): %v", req.Shard, term, a.Term, err)
	}
	return keepAliveResp{Expired: lost}, nil
}

// expiryLoop runs the leader side of leases on every shard this peer
// leads: it records a new leader's term (rule 0) and expires the sessions
// whose keepalives stopped for longer than the TTL. It wakes every
// TTL/20 and when this peer becomes a leader.
func (n *Node) expiryLoop() {
	t := time.NewTicker(max(n.cfg.SessionTTL/20, n.cfg.RTT))
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-n.leases.kick:
		case <-n.stop:
			return
		}
		n.expireLapsed()
	}
}

// expireLapsed does what the lease table decides for every lock shard this
// peer leads: record the leader's term, or expire the lapsed sessions with
// ExpireSession stamped with the term that decided it.
func (n *Node) expireLapsed() {
	for _, shard := range n.leases.Led() {
		if shard == metaShardID {
			continue // the meta shard holds the layout, not sessions
		}
		v, err := n.nh.StaleRead(shard, replica.Query{Kind: replica.QuerySessions})
		if err != nil {
			continue
		}
		a, ok := v.(replica.Answer)
		if !ok {
			continue
		}
		d := n.leases.Lapsed(shard, lease.State{Term: a.Term, Sessions: a.Sessions}, n.now())
		if d.RecordTerm {
			n.goFunc(func() { n.recordTerm(shard, d.Term) })
		}
		if len(d.Sessions) > 0 {
			n.goFunc(func() { n.expireSessions(shard, d.Term, d.Sessions) })
		}
	}
}

// maxExpiries bounds the ExpireSession proposals of one shard's round in
// flight at once; those in flight together share Raft entries.
const maxExpiries = 16

// expireSessions proposes the expiry, decided in term, of sessions of
// shard, at most maxExpiries at once: one goroutine per shard and round,
// not one per session, however many lapse together (a peer holding
// thousands of sessions died).
func (n *Node) expireSessions(shard, term uint64, sessions []lockfsm.SessionInfo) {
	ctx, cancel := context.WithTimeout(n.ctx, n.cfg.SessionTTL)
	defer cancel()
	slots := make(chan struct{}, maxExpiries)
	var wg sync.WaitGroup
	for _, s := range sessions {
		n.log.Info("expiring session", "shard", shard, "term", term, "session", s.ID, "owner", s.Owner, "held", s.Held, "waiting", s.Waiting)
		slots <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			res, err := n.apply(ctx, shard, lockfsm.Command{Op: lockfsm.OpExpireSession, Session: s.ID, Term: term})
			if err == nil && res.Status == lockfsm.StatusStaleTerm {
				n.log.Info("session expiry refused: decided in a term that has ended", "shard", shard, "session", s.ID, "err", res.Err)
			}
		}()
	}
	wg.Wait()
}

// recordTerm commits LeaderTerm for term on shard (rule 0), as long as this
// peer still leads the shard in that term. The expiry loop proposes it
// again if this try does not land.
func (n *Node) recordTerm(shard, term uint64) {
	defer n.leases.RecordingDone(shard, term)
	ctx, cancel := context.WithTimeout(n.ctx, n.proposalTimeout())
	defer cancel()
	res, err := n.apply(ctx, shard, lockfsm.Command{Op: lockfsm.OpLeaderTerm, Term: term})
	if err != nil {
		n.log.Debug("record leader term", "shard", shard, "term", term, "err", err)
		return
	}
	if res.Status == lockfsm.StatusOK {
		n.log.Debug("leader term recorded", "shard", shard, "term", term)
		// Keepalives refused meanwhile are retried by their senders.
	}
}
