package node

import (
	"context"
	"fmt"
	"time"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/level"
	"github.com/lockmesh/lockmesh/internal/replica"
	"github.com/lockmesh/lockmesh/internal/router"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// Commands reach their shards through internal/router (batching,
// forwarding to the leader's peer, retries, the leader cache). What stays
// here is the peer's side of it: the local replica the router proposes on
// (routerHost), and linearizable reads.

// routerHost is the peer as internal/router sees it.
type routerHost struct{ n *Node }

func (h routerHost) Placement() *layout.Placement { return h.n.placement.Load() }
func (h routerHost) Hosts(shard uint64) bool      { return h.n.hostsShard(shard) }
func (h routerHost) Addr(name string) (string, bool) {
	return h.n.rpcAddr(name)
}
func (h routerHost) TopLevel() level.Level { return h.n.topLevel() }

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
		return nil, fmt.Errorf("%w: %s", ErrReplicaHalted, r.Data)
	}
	return lockfsm.DecodeResults(r.Data)
}

// ServeKeepAlive serves a keepalive this peer sends to itself: no RPC,
// and no authorization (the sessions are this peer's own).
func (h routerHost) ReadLocal(ctx context.Context, shard uint64, q replica.Query) (replica.Answer, error) {
	return h.n.readLocal(ctx, shard, q)
}

func (h routerHost) ServeKeepAlive(ctx context.Context, req router.KeepAliveRequest) (router.KeepAliveResponse, error) {
	return h.n.leading.ServeKeepAlive(ctx, req)
}

// newRouter starts the router of n's commands.
func (n *Node) newRouter() *router.Router {
	return router.New(router.Config{Name: n.cfg.Name, RTT: n.cfg.RTT, Peers: n.peers,
		ProposeMethod: methodPropose, KeepAliveMethod: methodKeepAlive, ReadMethod: methodRead,
		Tracer: n.obs.tracer, OnProposed: n.obs.onProposed},
		routerHost{n})
}

// apply runs one command on its shard and returns its result, retrying
// unchanged while the outcome is unknown (see router.Router.Apply).
func (n *Node) apply(ctx context.Context, shard uint64, cmd lockfsm.Command) (lockfsm.Result, error) {
	return n.router.Apply(ctx, shard, cmd)
}

// proposalTimeout bounds one try of a proposal or read.
func (n *Node) proposalTimeout() time.Duration { return n.router.ProposalTimeout() }

// read answers a query linearizably (router.Router.Read).
func (n *Node) read(ctx context.Context, shard uint64, q replica.Query) (replica.Answer, error) {
	return n.router.Read(ctx, shard, q)
}

// readLocal answers q through this peer's replica of shard, with a
// ReadIndex round (routerHost.ReadLocal).
func (n *Node) readLocal(ctx context.Context, shard uint64, q replica.Query) (replica.Answer, error) {
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
func (n *Node) setLeader(shard uint64, name string) { n.router.SetLeader(shard, name) }

// leaderGuess names the peer most likely leading shard: what dragonboat
// says locally if this peer hosts a replica, else the last known leader,
// else "".
func (n *Node) leaderGuess(shard uint64) string { return n.router.LeaderGuess(shard) }
