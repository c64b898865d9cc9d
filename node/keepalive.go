package node

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// The client side of leases: this peer's keepalives for the sessions it
// owns, sent to each shard's leader (served by serveKeepAlive in
// leases.go). A lock's deadline moves with every acknowledgement (see
// session.extend and docs/SAFETY.md).

// keepAliveLoop sends this peer's keepalives: one call per shard per round
// to the shard's leader, carrying every session this peer has there. A
// round starts every quarter of the shortest TTL among the live sessions,
// counted from the start of the last round (a slow round does not push
// the next one back), and a session opened with a shorter TTL moves the
// next round up.
func (n *Node) keepAliveLoop() {
	last := time.Now()
	t := time.NewTimer(n.cfg.SessionTTL / 4)
	defer t.Stop()
	for {
		select {
		case <-n.stop:
			return
		case <-n.keepAliveKick:
			t.Reset(max(0, time.Until(last.Add(n.keepAliveInterval(n.liveSessions())))))
			continue
		case <-t.C:
		}
		last = time.Now()
		ss := n.liveSessions()
		interval := n.keepAliveInterval(ss)
		byShard := map[uint64][]*session{}
		for _, s := range ss {
			byShard[s.shard] = append(byShard[s.shard], s)
		}
		var wg sync.WaitGroup
		for shard, ss := range byShard {
			wg.Add(1)
			go func() {
				defer wg.Done()
				n.keepAlive(shard, ss, interval)
			}()
		}
		wg.Wait()
		t.Reset(max(0, time.Until(last.Add(interval))))
	}
}

// keepAliveInterval is a quarter of the shortest TTL of ss, and of
// Config.SessionTTL.
func (n *Node) keepAliveInterval(ss []*session) time.Duration {
	interval := n.cfg.SessionTTL / 4
	for _, s := range ss {
		interval = min(interval, s.owner.ttl/4)
	}
	return interval
}

// kickKeepAlives tells the keepalive loop a session opened.
func (n *Node) kickKeepAlives() {
	select {
	case n.keepAliveKick <- struct{}{}:
	default:
	}
}

func (n *Node) keepAlive(shard uint64, ss []*session, interval time.Duration) {
	ctx, cancel := context.WithTimeout(n.ctx, interval)
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
func (n *Node) leaderGuess(shard uint64) string { return n.router.LeaderGuess(shard) }
