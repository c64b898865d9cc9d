package node

import (
	"context"
	"fmt"

	"github.com/lockmesh/lockmesh/internal/router"
)

// The network side of the client's keepalives. The loop itself, its
// schedule and what an answer does to a session's lease live in
// internal/client (Client.RunKeepAlives, Session.Extend; docs/SAFETY.md);
// this file delivers each keepalive to the shard's leader (served by
// serveKeepAlive in leases.go).

// keepAliveLoop runs the client's keepalive loop until the node stops.
func (n *Node) keepAliveLoop() { n.client.RunKeepAlives(n.ctx) }

// keepAliveShard is the client's keepalive sender: one keepalive for
// this peer's sessions ids on shard, answered with the ones the leader
// counts as expired.
func (n *Node) keepAliveShard(ctx context.Context, shard uint64, ids []uint64) ([]uint64, error) {
	resp, err := n.sendKeepAlive(ctx, keepAliveReq{Shard: shard, Sessions: ids})
	return resp.Expired, err
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
	var (
		avoid string
		resp  keepAliveResp
	)
	err = n.router.TryHosts(ctx, router.Tries{
		Shard: req.Shard,
		// One peer a round: the leader as far as this peer knows, else
		// (or when it just failed) another replica, rotating.
		Hosts: func(round int) []string {
			target := n.leaderGuess(req.Shard)
			if target == "" || target == avoid {
				target = n.otherReplica(req.Shard, avoid, round)
			}
			return []string{target}
		},
		Call: func(ctx context.Context, target string) error {
			actx, cancel := context.WithTimeout(ctx, n.proposalTimeout()/4)
			defer cancel()
			r, err := n.keepAliveCall(actx, target, req, body)
			if err != nil {
				return err
			}
			if r.Leader != "" {
				return &router.NotLeaderError{Host: target, Leader: r.Leader}
			}
			n.setLeader(req.Shard, target)
			resp = r
			return nil
		},
		FollowHints: 3,
		Judge: func(target string, _ error) router.Step {
			avoid = target
			n.forgetLeader(req.Shard, target)
			return router.NextRound
		},
	})
	return resp, err
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
