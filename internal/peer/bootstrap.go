package peer

import (
	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/level"
	"github.com/lockmesh/lockmesh/mesh"
)

// The peer's side of forming a cluster (whose rules, loop and RPCs are
// internal/bootstrap and internal/membership): why it refuses a layout,
// and what it gossips about itself.

// refuseLayout records why this peer does not adopt the layout, for lock
// calls waiting for it, and logs it when the reason is new. The bootstrap
// loop keeps asking for the layout: once the cluster has replaced the old
// identity and forgotten the name, the layout no longer lists it and the
// peer is admitted as a new one, with new replica ids.
func (n *Peer) refuseLayout(ie *layout.IdentityError) {
	if old := n.refusal.Swap(ie); old == nil || *old != *ie {
		n.log.Error("refusing the cluster layout", "err", ie)
	}
}

func (n *Peer) localMeta() mesh.Meta {
	if m, ok := n.mesh.Member(n.cfg.Name); ok {
		return m.Meta
	}
	return n.baseMeta()
}

// baseMeta is what this peer gossips about itself before it belongs to a
// cluster.
func (n *Peer) baseMeta() mesh.Meta {
	m := mesh.Meta{RaftAddr: n.cfg.RaftAddr, RPCAddr: n.rpc.Addr(), MinLevel: level.Min, MaxLevel: n.TopLevel(), NoReplicas: n.cfg.NoReplicas,
		JoinOnly: n.cfg.BootstrapExpect == 0}
	if n.nh != nil {
		m.NodeHostID = n.nh.ID()
	}
	return m
}
