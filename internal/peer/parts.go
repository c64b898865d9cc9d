package peer

import (
	"github.com/lni/dragonboat/v4"

	"github.com/lockmesh/lockmesh/internal/controller"
	"github.com/lockmesh/lockmesh/internal/datadir"
	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/leader"
	"github.com/lockmesh/lockmesh/internal/membership"
	"github.com/lockmesh/lockmesh/internal/replicas"
	"github.com/lockmesh/lockmesh/mesh"
)

// The peer's parts, as lockmesh's own tests reach them to inject faults
// and to watch what the parts did. Nothing outside this module can.

// NodeHost is the replicas' NodeHost.
func (n *Peer) NodeHost() *dragonboat.NodeHost { return n.nh }

// Replicas is the table of the replicas this peer runs.
func (n *Peer) Replicas() *replicas.Table { return n.replicas }

// Mesh is the peer's gossip.
func (n *Peer) Mesh() *mesh.Mesh { return n.mesh }

// Membership is the peer's membership service.
func (n *Peer) Membership() *membership.Service { return n.membership }

// Controller is the peer's layout controller.
func (n *Peer) Controller() *controller.Controller { return n.ctrl }

// Leading is the leader side of the peer's sessions.
func (n *Peer) Leading() *leader.Sessions { return n.leading }

// DataDir is the peer's record of its cluster and known peers.
func (n *Peer) DataDir() datadir.Dir { return n.dir }

// RPCAddr is the address the peer's RPC port listens on.
func (n *Peer) RPCAddr() string { return n.rpc.Addr() }

// DeadlockChecks counts the cross-shard deadlock checks that read the
// shards' wait graphs.
func (n *Peer) DeadlockChecks() int64 { return n.deadlockChecks.Load() }

// RaftPort is the peer as the filter in front of its Raft port asks it.
func (n *Peer) RaftPort() replicas.RaftPeers { return raftPeers{n} }

// SetPlacement replaces the peer's copy of the layout with p, as a copy
// that lags the meta shard would be: tests make it stale with it.
func (n *Peer) SetPlacement(p *layout.Placement) { n.placement.Store(p) }
