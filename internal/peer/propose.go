package peer

import (
	"context"
	"fmt"
	"time"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/level"
	"github.com/lockmesh/lockmesh/internal/lockerr"
	"github.com/lockmesh/lockmesh/internal/replica"
	"github.com/lockmesh/lockmesh/internal/router"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// The routes of commands and reads: the router (internal/router: batching,
// forwarding to the leader's peer, retries, the leader cache) and the
// local replica it proposes on and reads through (routerHost).

// routerHost is the peer as internal/router sees it.
type routerHost struct{ n *Peer }

var _ router.Host = routerHost{}

func (h routerHost) Placement() *layout.Placement { return h.n.placement.Load() }
func (h routerHost) Hosts(shard uint64) bool      { return h.n.HostsShard(shard) }
func (h routerHost) Addr(name string) (string, bool) {
	return h.n.rpcAddr(name)
}
func (h routerHost) TopLevel() level.Level { return h.n.TopLevel() }

func (h routerHost) LocalLeader(shard uint64) (uint64, bool) {
	id, _, ok, err := h.n.nh.GetLeaderID(shard)
	return id, err == nil && ok
}

// ProposeLocal commits data through this peer's replica of shard.
func (h routerHost) ProposeLocal(ctx context.Context, shard uint64, data []byte) ([]lockfsm.Result, error) {
	r, err := h.n.nh.SyncPropose(ctx, h.n.nh.GetNoOPSession(shard), data)
	if err != nil {
		return nil, err
	}
	if r.Value == replica.ResultHalted {
		// The entry committed, but this replica did not apply it: the
		// outcome is unknown here, and other replicas know it.
		return nil, fmt.Errorf("%w: %s", lockerr.ReplicaHalted, r.Data)
	}
	return lockfsm.DecodeResults(r.Data)
}

// ServeKeepAlive serves a keepalive this peer sends to itself: no RPC,
// and no authorization (the sessions are this peer's own).
func (h routerHost) ReadLocal(ctx context.Context, shard uint64, q replica.Query) (replica.Answer, error) {
	return h.n.ReadLocal(ctx, shard, q)
}

func (h routerHost) ServeKeepAlive(ctx context.Context, req router.KeepAliveRequest) (router.KeepAliveResponse, error) {
	return h.n.leading.ServeKeepAlive(ctx, req)
}

// newRouter starts the router of n's commands.
func (n *Peer) newRouter() *router.Router {
	return router.New(router.Config{Name: n.cfg.Name, RTT: n.cfg.RTT, Peers: n.peers,
		ProposeMethod: MethodPropose, KeepAliveMethod: MethodKeepAlive, ReadMethod: MethodRead,
		Tracer: n.obs.Tracer(), OnProposed: n.obs.OnProposed},
		routerHost{n})
}

// Apply runs one command on its shard and returns its result, retrying
// unchanged while the outcome is unknown (see router.Router.Apply).
func (n *Peer) Apply(ctx context.Context, shard uint64, cmd lockfsm.Command) (lockfsm.Result, error) {
	return n.router.Apply(ctx, shard, cmd)
}

// proposalTimeout bounds one try of a proposal or read.
func (n *Peer) proposalTimeout() time.Duration { return n.router.ProposalTimeout() }

// read answers a query linearizably (router.Router.Read).
func (n *Peer) read(ctx context.Context, shard uint64, q replica.Query) (replica.Answer, error) {
	return n.router.Read(ctx, shard, q)
}

// ReadLocal answers q through this peer's replica of shard, with a
// ReadIndex round (routerHost.ReadLocal).
func (n *Peer) ReadLocal(ctx context.Context, shard uint64, q replica.Query) (replica.Answer, error) {
	// dragonboat needs a deadline on every request.
	ctx, cancel := context.WithTimeout(ctx, n.proposalTimeout())
	defer cancel()
	v, err := n.nh.SyncRead(ctx, shard, q)
	if err != nil {
		return replica.Answer{}, err
	}
	a, ok := v.(replica.Answer)
	if !ok {
		return replica.Answer{}, fmt.Errorf("shard %d answered %T", shard, v)
	}
	return a, nil
}

// The leader cache lives in the router.
func (n *Peer) SetLeader(shard uint64, name string) { n.router.SetLeader(shard, name) }

// LeaderGuess names the peer most likely leading shard: what dragonboat
// says locally if this peer hosts a replica, else the last known leader,
// else "".
func (n *Peer) LeaderGuess(shard uint64) string { return n.router.LeaderGuess(shard) }
