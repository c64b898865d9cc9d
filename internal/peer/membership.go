package peer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/lockmesh/lockmesh/internal/authz"
	"github.com/lockmesh/lockmesh/internal/controller"
	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/lockerr"
	"github.com/lockmesh/lockmesh/internal/membership"
	"github.com/lockmesh/lockmesh/internal/replica"
)

// The peer's membership service (internal/membership) and layout
// controller (internal/controller), and what they reach of the peer:
// its RPCs, its state machines, its records and adopt (membershipHost).

// newMembership builds this peer's membership service (internal/membership)
// over its gossip, replicas and router; start runs its bootstrap and
// placement loops.
func (n *Peer) newMembership() *membership.Service {
	return membership.New(membershipHost{n}, membership.Config{
		Name:    n.cfg.Name,
		Applied: n.appliedIndexes,
		Methods: membership.Methods{
			Prepare:        MethodPrepare,
			Commit:         MethodCommit,
			Abort:          MethodAbort,
			GetPlacement:   MethodGetPlacement,
			Status:         MethodStatus,
			ConfigChange:   MethodConfigChange,
			TransferLeader: MethodTransferLeader,
			CaughtUp:       MethodCaughtUp,
			SetPlacement:   MethodSetPlacement,
			Membership:     MethodMembership,
		},
		Interval:      n.ControlInterval(),
		TopLevel:      n.TopLevel(),
		TLS:           n.cfg.TLS,
		Dial:          n.hooks.RPCDial,
		UnsafeNoAuthz: n.authzOff(),
		Logger:        n.log,

		BootstrapExpect:   n.cfg.BootstrapExpect,
		Shards:            n.cfg.Shards,
		ReplicationFactor: n.cfg.ReplicationFactor,
		BootstrapInterval: max(4*n.cfg.RTT, 100*time.Millisecond),
		Now:               n.Now,

		Mesh:      n.mesh,
		Replicas:  n.replicas,
		Router:    n.router,
		Peers:     n.peers,
		Placement: &n.placement,
		Adopting:  &n.adopting,
	})
}

// newController builds the layout controller (internal/controller), acting
// through this peer's membership service; start runs it.
func (n *Peer) newController() *controller.Controller {
	return controller.New(n.membership, controller.Config{
		Interval:        n.ControlInterval(),
		RTT:             n.cfg.RTT,
		ProposalTimeout: n.proposalTimeout(),
		DeadAfter:       n.cfg.DeadAfter,
		TopLevel:        n.TopLevel(),
		Now:             n.Now,
		Logger:          n.log,
	})
}

func (n *Peer) ControlInterval() time.Duration { return max(5*n.cfg.RTT, 100*time.Millisecond) }

// membershipHost is what the membership service reaches of its peer.
type membershipHost struct{ n *Peer }

var _ membership.Peer = membershipHost{}

func (h membershipHost) Call(ctx context.Context, name string, method uint8, body []byte) ([]byte, error) {
	return h.n.callPeerName(ctx, name, method, body)
}

func (h membershipHost) Caller(ctx context.Context) authz.Caller { return callerOf(ctx) }

func (h membershipHost) Refused(err error) error { return h.n.refused(err) }

// ReadIndex reads shard linearizably through the local replica: any query
// will do (the meta shard answers every query with the layout).
func (h membershipHost) ReadIndex(ctx context.Context, shard uint64) error {
	_, err := h.n.nh.SyncRead(ctx, shard, replica.Query{Kind: replica.QuerySessions})
	return err
}

// ProposeLayout commits raw through the local meta replica; the entry's
// result is the epoch the meta shard holds after it (metaSM.Update).
func (h membershipHost) ProposeLayout(ctx context.Context, raw []byte) (uint64, error) {
	nh := h.n.nh
	r, err := nh.SyncPropose(ctx, nh.GetNoOPSession(metaShardID), raw)
	if err != nil {
		return 0, err
	}
	if r.Value == replica.MetaHalted {
		return 0, fmt.Errorf("%w: %s", lockerr.ReplicaHalted, r.Data)
	}
	return r.Value, nil
}

func (h membershipHost) CheckLevel(p *layout.Placement) error { return h.n.checkLevel(p) }

func (h membershipHost) SaveRecord(p *layout.Placement) error { return h.n.dir.SaveRecord(p) }

func (h membershipHost) RefuseLayout(ie *layout.IdentityError) { h.n.refuseLayout(ie) }

func (h membershipHost) StartReplica(p *layout.Placement, shard uint64, r layout.Replica) error {
	return h.n.startReplica(p, shard, r)
}

// Adopt adopts the layout bootstrap agreed on or fetched and gossips its
// cluster id; an identity refusal is recorded for waitReady, and cleared
// by an adoption.
func (h membershipHost) Adopt(p *layout.Placement) error {
	n := h.n
	if err := n.adopt(p); err != nil {
		var ie *layout.IdentityError
		if errors.As(err, &ie) {
			n.refuseLayout(ie)
		}
		return err
	}
	n.refusal.Store(nil)
	meta := n.localMeta()
	meta.Cluster = p.ClusterID
	if err := n.mesh.SetMeta(meta); err != nil {
		n.log.Warn("gossip cluster id", "err", err)
	}
	return nil
}

func (h membershipHost) Go(f func(ctx context.Context)) { h.n.goFunc(func() { f(h.n.ctx) }) }

// callPeerName calls the named peer, or serves the call here.
func (n *Peer) callPeerName(ctx context.Context, name string, method uint8, body []byte) ([]byte, error) {
	if name == n.cfg.Name {
		return n.handle(ctx, method, body)
	}
	addr, ok := n.rpcAddr(name)
	if !ok {
		return nil, fmt.Errorf("%w: no address for peer %q", lockerr.Unavailable, name)
	}
	return n.peers.Call(ctx, addr, method, body)
}

// Leave moves this peer out of the cluster and closes it (node.Node.Leave).
func (n *Peer) Leave(ctx context.Context) error {
	if n.IsClosed() {
		return lockerr.Closed
	}
	if _, err := n.WaitReady(ctx); err != nil {
		return err
	}
	if err := n.membership.Leave(ctx); err != nil {
		return err
	}
	return n.Close()
}
