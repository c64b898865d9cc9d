package router

import (
	"context"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/lockmesh/lockmesh/internal/msgcheck"
)

// The network side of the client's keepalives. The loop itself, its
// schedule and what an answer does to a session's lease live in
// internal/client (Client.RunKeepAlives, Session.Extend; docs/SAFETY.md);
// this file delivers each keepalive to the shard's leader (served by
// internal/leader's Sessions.ServeKeepAlive).

// KeepAliveRequest is a keepalive for the sessions of one peer on one
// shard, sent to the shard's leader (Config.KeepAliveMethod).
type KeepAliveRequest struct {
	Shard    uint64   `msgpack:"s"`
	Sessions []uint64 `msgpack:"i"`
}

// KeepAliveResponse answers a KeepAliveRequest.
type KeepAliveResponse struct {
	Expired []uint64 `msgpack:"x"` // sessions the leader does not know or is expiring
	Leader  string   `msgpack:"l"` // set when the peer asked is not the leader: its guess, or "?"
}

// KeepAlive is the client's keepalive sender (client.Config.KeepAlive):
// one keepalive for this peer's sessions ids on shard, answered with the
// ones the leader counts as expired.
func (r *Router) KeepAlive(ctx context.Context, shard uint64, ids []uint64) ([]uint64, error) {
	resp, err := r.sendKeepAlive(ctx, KeepAliveRequest{Shard: shard, Sessions: ids})
	return resp.Expired, err
}

// sendKeepAlive delivers a keepalive to the shard's leader. It follows
// not-leader hints and, when the peer it tried is unreachable or slow,
// moves on to the shard's other replicas: a crashed leader must not keep
// the keepalives of its shard from reaching the new one.
func (r *Router) sendKeepAlive(ctx context.Context, req KeepAliveRequest) (KeepAliveResponse, error) {
	body, err := msgpack.Marshal(req)
	if err != nil {
		return KeepAliveResponse{}, err
	}
	var (
		avoid string
		resp  KeepAliveResponse
	)
	err = r.TryHosts(ctx, Tries{
		Shard: req.Shard,
		// One peer a round: the leader as far as this peer knows, else
		// (or when it just failed) another replica, rotating.
		Hosts: func(round int) []string {
			target := r.LeaderGuess(req.Shard)
			if target == "" || target == avoid {
				target = r.otherReplica(req.Shard, avoid, round)
			}
			return []string{target}
		},
		Call: func(ctx context.Context, target string) error {
			actx, cancel := context.WithTimeout(ctx, r.ProposalTimeout()/4)
			defer cancel()
			kr, err := r.keepAliveCall(actx, target, req, body)
			if err != nil {
				return err
			}
			if kr.Leader != "" {
				return &NotLeaderError{Host: target, Leader: kr.Leader}
			}
			r.SetLeader(req.Shard, target)
			resp = kr
			return nil
		},
		FollowHints: 3,
		Judge: func(target string, _ error) Step {
			avoid = target
			r.ForgetLeader(req.Shard, target)
			return NextRound
		},
	})
	return resp, err
}

// keepAliveCall sends one keepalive to target, locally when it is this
// peer. A reply with Leader set means target is not the leader.
func (r *Router) keepAliveCall(ctx context.Context, target string, req KeepAliveRequest, body []byte) (KeepAliveResponse, error) {
	if target == r.cfg.Name {
		return r.host.ServeKeepAlive(ctx, req)
	}
	addr, ok := r.host.Addr(target)
	if !ok {
		return KeepAliveResponse{}, fmt.Errorf("no address for peer %q", target)
	}
	raw, err := r.cfg.Peers.Call(ctx, addr, r.cfg.KeepAliveMethod, body)
	if err != nil {
		return KeepAliveResponse{}, err
	}
	var resp KeepAliveResponse
	if err := msgcheck.Unmarshal(raw, &resp, msgcheck.MaxBody); err != nil {
		return KeepAliveResponse{}, fmt.Errorf("rpc body: %w", err)
	}
	return resp, nil
}

// otherReplica picks a replica of shard other than avoid, rotating with
// attempt.
func (r *Router) otherReplica(shard uint64, avoid string, attempt int) string {
	p := r.host.Placement()
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
