package node

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/lni/dragonboat/v4/raftio"

	"github.com/lockmesh/lockmesh/lockfsm"
)

// Leader-side leases.
//
// Keepalives are not written to the Raft log: the leader of a shard keeps,
// in memory, when it last heard from each session (the etcd and Chubby
// model) and proposes ExpireSession once a session has been silent for a
// full TTL. Four rules keep that safe across leader changes:
//
//  0. A leader first commits a LeaderTerm entry with its Raft term, and
//     acknowledges no keepalive and expires no session before its own
//     replica has applied it. An ExpireSession carries the term of the
//     leader that decided it, and the state machine applies it only if
//     that is the term it has recorded: an expiry decided by a leader
//     whose term has ended (it was paused, its disk stalled, its view of
//     leadership lagged) never takes effect, even when its proposal is
//     forwarded to and committed by its successor.
//  1. A leader acknowledges a keepalive only after a ReadIndex round has
//     confirmed, after the keepalive arrived, that it is still the leader,
//     and after its replica has applied everything up to that index. So an
//     acknowledged keepalive was received before any later leader was
//     elected, and any ExpireSession an old leader left in the log has
//     already been applied (the session then reads as expired).
//  2. A new leader starts every session's timer at its election plus a
//     grace of two election timeouts, so a holder whose last keepalive went
//     to the old leader keeps its full TTL.
//  3. Once a leader decides to expire a session it never acknowledges that
//     session again, even if the ExpireSession proposal is slow to commit.
//
// The holder counts its lease from the time it sent the keepalive, minus a
// margin, on its own monotonic clock; the leader counts from when it
// received it. So the holder always gives up first, as long as clock rates
// differ by less than the margin over one TTL.
type leaseTable struct {
	mu     sync.Mutex
	shards map[uint64]*shardLeases
	// kick wakes the expiry loop when this peer becomes a leader, so it
	// records its term at once instead of at the next tick.
	kick chan struct{}
}

type shardLeases struct {
	leader   bool
	term     uint64
	since    time.Time            // when this peer became leader in term
	lastSeen map[uint64]time.Time // session -> last keepalive received (or since+grace)
	expiring map[uint64]bool      // sessions being expired: never acknowledged again
	// recording is set while a LeaderTerm proposal for term is in flight.
	recording bool
}

func (t *leaseTable) init() {
	t.shards = map[uint64]*shardLeases{}
	t.kick = make(chan struct{}, 1)
}

// leaderUpdated records a leader change reported by dragonboat.
func (t *leaseTable) leaderUpdated(info raftio.LeaderInfo, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	leader := info.LeaderID != 0 && info.LeaderID == info.ReplicaID
	sl := t.shards[info.ShardID]
	if leader && sl != nil && sl.leader && sl.term == info.Term {
		return
	}
	if !leader {
		delete(t.shards, info.ShardID)
		return
	}
	t.shards[info.ShardID] = newShardLeases(info.Term, now)
	select {
	case t.kick <- struct{}{}:
	default:
	}
}

func newShardLeases(term uint64, now time.Time) *shardLeases {
	return &shardLeases{leader: true, term: term, since: now, lastSeen: map[uint64]time.Time{}, expiring: map[uint64]bool{}}
}

// drop forgets a shard whose local replica stopped.
func (t *leaseTable) drop(shard uint64) {
	t.mu.Lock()
	delete(t.shards, shard)
	t.mu.Unlock()
}

func (t *leaseTable) isLeader(shard uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	sl := t.shards[shard]
	return sl != nil && sl.leader
}

// leaderState returns the shard's lease state for term, starting it if
// dragonboat reported the leadership to a query before its event arrived.
func (t *leaseTable) leaderState(shard, term uint64, now time.Time) *shardLeases {
	sl := t.shards[shard]
	if sl == nil || sl.term != term {
		sl = newShardLeases(term, now)
		t.shards[shard] = sl
	}
	return sl
}

// leaderGrace is how long a new leader waits beyond the TTL before it
// expires sessions it has not heard from: about the longest a deposed
// leader can go on acknowledging keepalives (an election timeout with
// CheckQuorum), twice.
func (n *Node) leaderGrace() time.Duration {
	if n.cfg.unsafeExpireAfter > 0 {
		return 0
	}
	return 20 * n.cfg.RTT
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
	a, err := n.readLocal(ctx, req.Shard, lockQuery{Kind: querySessions})
	if err != nil {
		return keepAliveResp{}, rpcError(codeBusy, "shard %d: confirm leadership: %v", req.Shard, err)
	}
	if _, term2, valid, err := n.nh.GetLeaderID(req.Shard); err != nil || !valid || term2 != term {
		return keepAliveResp{}, rpcError(codeBusy, "shard %d: leadership changed during keepalive", req.Shard)
	}
	// Rule 0: not before this term is recorded in the replicated state, so
	// that no expiry decided in an earlier term can commit after this ack.
	if a.Term != term {
		n.kickLeases()
		return keepAliveResp{}, rpcError(codeBusy, "shard %d: the leader of term %d has not recorded its term yet (state has %d)", req.Shard, term, a.Term)
	}
	live := make(map[uint64]bool, len(a.Sessions))
	for _, s := range a.Sessions {
		live[s.ID] = true
	}
	var resp keepAliveResp
	n.leases.mu.Lock()
	sl := n.leases.leaderState(req.Shard, term, received)
	for _, id := range req.Sessions {
		if !live[id] || sl.expiring[id] {
			resp.Expired = append(resp.Expired, id)
			continue
		}
		if received.After(sl.lastSeen[id]) {
			sl.lastSeen[id] = received
		}
	}
	n.leases.mu.Unlock()
	return resp, nil
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

func (n *Node) kickLeases() {
	select {
	case n.leases.kick <- struct{}{}:
	default:
	}
}

func (n *Node) expireLapsed() {
	n.leases.mu.Lock()
	var shards []uint64
	for id, sl := range n.leases.shards {
		// The meta shard holds the layout, not sessions.
		if sl.leader && id != metaShardID {
			shards = append(shards, id)
		}
	}
	n.leases.mu.Unlock()
	for _, shard := range shards {
		v, err := n.nh.StaleRead(shard, lockQuery{Kind: querySessions})
		if err != nil {
			continue
		}
		a, ok := v.(lockAnswer)
		if !ok {
			continue
		}
		now := n.now()
		var lapsed []lockfsm.SessionInfo
		n.leases.mu.Lock()
		sl := n.leases.shards[shard]
		if sl == nil || !sl.leader {
			n.leases.mu.Unlock()
			continue
		}
		term := sl.term
		if a.Term != term {
			// Rule 0: record this term first (a higher recorded term
			// means this view of leadership is stale: do nothing).
			if a.Term < term && !sl.recording {
				sl.recording = true
				n.goFunc(func() { n.recordTerm(shard, term) })
			}
			n.leases.mu.Unlock()
			continue
		}
		live := make(map[uint64]bool, len(a.Sessions))
		for _, s := range a.Sessions {
			live[s.ID] = true
			seen, ok := sl.lastSeen[s.ID]
			if !ok {
				// First sight in this term (rule 2), or a session opened since.
				seen = max64(now, sl.since.Add(n.leaderGrace()))
				sl.lastSeen[s.ID] = seen
			}
			ttl := time.Duration(s.TTLMillis) * time.Millisecond
			if n.cfg.unsafeExpireAfter > 0 {
				ttl = n.cfg.unsafeExpireAfter
			}
			if !sl.expiring[s.ID] && now.Sub(seen) > ttl {
				sl.expiring[s.ID] = true // rule 3
				lapsed = append(lapsed, s)
			}
		}
		for id := range sl.lastSeen {
			if !live[id] {
				delete(sl.lastSeen, id)
				delete(sl.expiring, id)
			}
		}
		n.leases.mu.Unlock()
		for _, s := range lapsed {
			n.log.Info("expiring session", "shard", shard, "term", term, "session", s.ID, "owner", s.Owner, "held", s.Held, "waiting", s.Waiting)
			n.goFunc(func() {
				ctx, cancel := context.WithTimeout(n.ctx, n.cfg.SessionTTL)
				defer cancel()
				res, err := n.apply(ctx, shard, lockfsm.Command{Op: lockfsm.OpExpireSession, Session: s.ID, Term: term})
				if err == nil && res.Status == lockfsm.StatusStaleTerm {
					n.log.Info("session expiry refused: decided in a term that has ended", "shard", shard, "session", s.ID, "err", res.Err)
				}
			})
		}
	}
}

// recordTerm commits LeaderTerm for term on shard (rule 0), as long as this
// peer still leads the shard in that term. The expiry loop proposes it
// again if this try does not land.
func (n *Node) recordTerm(shard, term uint64) {
	defer func() {
		n.leases.mu.Lock()
		if sl := n.leases.shards[shard]; sl != nil && sl.term == term {
			sl.recording = false
		}
		n.leases.mu.Unlock()
	}()
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

func max64(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// keepAliveLoop sends this peer's keepalives: one call per shard per round
// to the shard's leader, carrying every session this peer has there.
func (n *Node) keepAliveLoop() {
	n.every(n.keepAliveInterval(), func() {
		byShard := map[uint64][]*session{}
		for _, s := range n.liveSessions() {
			byShard[s.shard] = append(byShard[s.shard], s)
		}
		var wg sync.WaitGroup
		for shard, ss := range byShard {
			wg.Add(1)
			go func() {
				defer wg.Done()
				n.keepAlive(shard, ss)
			}()
		}
		wg.Wait()
	})
}

func (n *Node) keepAliveInterval() time.Duration { return n.cfg.SessionTTL / 4 }

func (n *Node) keepAlive(shard uint64, ss []*session) {
	ctx, cancel := context.WithTimeout(n.ctx, n.keepAliveInterval())
	defer cancel()
	req := keepAliveReq{Shard: shard}
	for _, s := range ss {
		req.Sessions = append(req.Sessions, s.id)
	}
	sent := n.now()
	resp, err := n.sendKeepAlive(ctx, req)
	if err != nil {
		n.log.Debug("keepalive failed", "shard", shard, "err", err)
		return
	}
	expired := map[uint64]bool{}
	for _, id := range resp.Expired {
		expired[id] = true
	}
	for _, s := range ss {
		if expired[s.id] {
			s.lose(fmt.Errorf("%w: the leader of shard %d no longer counts session %d as live", ErrLeaseExpired, shard, s.id))
		} else {
			s.extend(sent)
		}
	}
}

// sendKeepAlive delivers a keepalive to the shard's leader. It follows
// not-leader hints and, when the peer it tried is unreachable or slow,
// moves on to the shard's other replicas: a crashed leader must not keep
// the keepalives of its shard from reaching the new one.
func (n *Node) sendKeepAlive(ctx context.Context, req keepAliveReq) (keepAliveResp, error) {
	body, err := encodeBody(req)
	if err != nil {
		return keepAliveResp{}, err
	}
	var avoid string
	for attempt := 0; ; attempt++ {
		target := n.leaderGuess(req.Shard)
		if target == "" || target == avoid {
			target = n.otherReplica(req.Shard, avoid, attempt)
		}
		actx, cancel := context.WithTimeout(ctx, n.proposalTimeout()/4)
		resp, err := n.keepAliveCall(actx, target, req, body)
		cancel()
		switch {
		case err == nil && resp.Leader == "":
			n.setLeader(req.Shard, target)
			return resp, nil
		case err == nil && resp.Leader != target && attempt < 3:
			n.setLeader(req.Shard, resp.Leader) // follow the hint at once
			continue
		}
		avoid = target
		n.forgetLeader(req.Shard, target)
		if err := n.backoff(ctx, attempt); err != nil {
			return keepAliveResp{}, err
		}
	}
}

// keepAliveCall sends one keepalive to target, locally when it is this
// peer. A reply with Leader set means target is not the leader.
func (n *Node) keepAliveCall(ctx context.Context, target string, req keepAliveReq, body []byte) (keepAliveResp, error) {
	if target == n.cfg.Name {
		return n.serveKeepAlive(ctx, req)
	}
	addr, ok := n.rpcAddr(target)
	if !ok {
		return keepAliveResp{}, fmt.Errorf("no address for peer %q", target)
	}
	raw, err := n.peers.Call(ctx, addr, methodKeepAlive, body)
	if err != nil {
		return keepAliveResp{}, err
	}
	var resp keepAliveResp
	err = decodeBody(raw, &resp)
	return resp, err
}

// otherReplica picks a replica of shard other than avoid, rotating with
// attempt.
func (n *Node) otherReplica(shard uint64, avoid string, attempt int) string {
	p := n.placement.Load()
	if p == nil {
		return ""
	}
	var hosts []string
	for _, h := range p.HostNames(shard) {
		if h != avoid {
			hosts = append(hosts, h)
		}
	}
	if len(hosts) == 0 {
		return avoid
	}
	return hosts[attempt%len(hosts)]
}

// leaderGuess names the peer most likely leading shard: what dragonboat
// says locally if this peer hosts a replica, else the last known leader,
// else "".
func (n *Node) leaderGuess(shard uint64) string {
	p := n.placement.Load()
	if p == nil {
		return ""
	}
	if n.hostsShard(shard) {
		if id, _, ok, err := n.nh.GetLeaderID(shard); err == nil && ok {
			if pe, ok := p.PeerByReplica(id); ok {
				return pe.Name
			}
		}
	}
	// A hint from an answer: only while the layout still has the named
	// peer hosting the shard (it may have left since).
	if name := n.leader(shard); name != "" && p.Hosts(shard, name) {
		return name
	}
	return ""
}
