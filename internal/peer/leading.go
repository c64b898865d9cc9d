package peer

import (
	"context"
	"fmt"
	"time"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/leader"
	"github.com/lockmesh/lockmesh/internal/lease"
	"github.com/lockmesh/lockmesh/internal/replica"
	"github.com/lockmesh/lockmesh/internal/replicas"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// The leader side of sessions (internal/leader: keepalives served, terms
// recorded, lapsed sessions expired, grant notices pushed), wired to the
// peer: its replicas, proposals and RPC client (leaderHost). The RPC
// handler authorizes keepalives and notices before they reach it (handle),
// and dragonboat's leader changes come through leaderListener.

// newLeading builds this peer's leader side. It is called before the
// replicas start: they report leader changes and grants to it.
func newLeading(n *Peer) *leader.Sessions {
	return leader.New(leader.Config{
		Name:              n.cfg.Name,
		SessionTTL:        n.cfg.SessionTTL,
		RTT:               n.cfg.RTT,
		ElectionTimeout:   replicas.ElectionRTT * n.cfg.RTT, // every replica's election timeout
		UnsafeExpireAfter: n.hooks.UnsafeExpireAfter,
		Now:               n.Now,
		Log:               n.log,
		Waiters:           n.client.Waiters(),
		NotifyMethod:      MethodNotify,
	}, leaderHost{n})
}

// leaderHost is the peer as internal/leader sees it.
type leaderHost struct{ n *Peer }

var _ leader.Host = leaderHost{}

func (h leaderHost) Placement() *layout.Placement { return h.n.placement.Load() }
func (h leaderHost) Hosts(shard uint64) bool      { return h.n.HostsShard(shard) }
func (h leaderHost) LocalReplica(shard uint64) (uint64, bool) {
	return h.n.localReplica(shard)
}
func (h leaderHost) LeaderID(shard uint64) (uint64, uint64, bool, error) {
	return h.n.nh.GetLeaderID(shard)
}
func (h leaderHost) ProposalTimeout() time.Duration { return h.n.proposalTimeout() }
func (h leaderHost) Addr(name string) (string, bool) {
	return h.n.rpcAddr(name)
}
func (h leaderHost) Apply(ctx context.Context, shard uint64, cmd lockfsm.Command) (lockfsm.Result, error) {
	return h.n.Apply(ctx, shard, cmd)
}
func (h leaderHost) Call(ctx context.Context, addr string, method uint8, body []byte) ([]byte, error) {
	return h.n.peers.Call(ctx, addr, method, body)
}

// ReadSessions reads shard's sessions through the local replica with a
// ReadIndex round (rule 1).
func (h leaderHost) ReadSessions(ctx context.Context, shard uint64) (lease.State, error) {
	a, err := h.n.ReadLocal(ctx, shard, replica.Query{Kind: replica.QuerySessions})
	if err != nil {
		return lease.State{}, err
	}
	return lease.State{Term: a.Term, Sessions: a.Sessions, Holds: a.Holds}, nil
}

// StaleSessions reads shard's sessions from the local replica as it is.
func (h leaderHost) StaleSessions(shard uint64) (lease.State, error) {
	v, err := h.n.nh.StaleRead(shard, replica.Query{Kind: replica.QuerySessions})
	if err != nil {
		return lease.State{}, err
	}
	a, ok := v.(replica.Answer)
	if !ok {
		return lease.State{}, fmt.Errorf("shard %d answered %T", shard, v)
	}
	return lease.State{Term: a.Term, Sessions: a.Sessions, Holds: a.Holds}, nil
}
