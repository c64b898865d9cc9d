package node

import (
	"fmt"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/mesh"
)

// Forming a cluster: the rules and the loop and RPCs that run them are
// internal/cluster's (bootstrap.go, forming.go); what stays here is the
// peer's side of the result: the layout's record in the data dir, the
// gossip metadata, and why a layout is refused.

const recordFile = "cluster.lockmesh"

// refuseLayout records why this peer does not adopt the layout, for lock
// calls waiting for it, and logs it when the reason is new. The bootstrap
// loop keeps asking for the layout: once the cluster has replaced the old
// identity and forgotten the name, the layout no longer lists it and the
// peer is admitted as a new one, with new replica ids.
func (n *Node) refuseLayout(ie *layout.IdentityError) {
	if old := n.refusal.Swap(ie); old == nil || *old != *ie {
		n.log.Error("refusing the cluster layout", "err", ie)
	}
}

func (n *Node) localMeta() mesh.Meta {
	if m, ok := n.mesh.Member(n.cfg.Name); ok {
		return m.Meta
	}
	return n.baseMeta()
}

// baseMeta is what this peer gossips about itself before it belongs to a
// cluster.
func (n *Node) baseMeta() mesh.Meta {
	m := mesh.Meta{RaftAddr: n.cfg.RaftAddr, RPCAddr: n.rpc.Addr(), MinVersion: minLevel, Version: n.topLevel(), NoReplicas: n.cfg.NoReplicas,
		JoinOnly: n.cfg.BootstrapExpect == 0}
	if n.nh != nil {
		m.NodeHostID = n.nh.ID()
	}
	return m
}

// saveRecord writes the layout to the data dir atomically and durably: the
// record is synced, renamed into place, and the directory synced so the
// rename survives a power cut. A peer that lost its record would come back
// with Raft data and no cluster, and could form a new one.
func (n *Node) saveRecord(p *layout.Placement) error {
	raw, err := layout.Encode(p)
	if err != nil {
		return err
	}
	if err := n.writeDurably(recordFile, raw); err != nil {
		return fmt.Errorf("cluster record: %w", err)
	}
	return nil
}

// loadRecord reads the layout from the data dir; nil when there is none.
func (n *Node) loadRecord() (*layout.Placement, error) {
	path := n.cfg.fs.PathJoin(n.cfg.DataDir, recordFile)
	raw, err := n.readSmall(recordFile)
	if raw == nil || err != nil {
		return nil, err
	}
	p, err := layout.Decode(raw)
	if err != nil {
		return nil, fmt.Errorf("cluster record %s is corrupt: %w", path, err)
	}
	if _, ok := p.Peer(n.cfg.Name); !ok && len(n.cfg.Join) == 0 {
		return nil, fmt.Errorf("cluster record %s does not list peer %q", path, n.cfg.Name)
	}
	if ie := p.CheckIdentity(n.cfg.Name, n.nh.ID()); ie != nil {
		return nil, fmt.Errorf("cluster record %s lists peer %q with NodeHostID %s but the Raft data beside it has %s: "+
			"part of the data dir was deleted or replaced, or it was copied; delete the whole data dir to rejoin as a new peer, or start under a new Name",
			path, n.cfg.Name, ie.Listed, ie.Local)
	}
	return p, nil
}
