package peer

import (
	"context"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/replica"
	"github.com/lockmesh/lockmesh/mesh"
)

// What node's public calls read of the peer besides its lock path:
// its layout, gossip and shards, for Inspect, Status, Members and
// Placement.

// Placement is this peer's copy of the cluster layout; nil until it has
// one.
func (n *Peer) Placement() *layout.Placement { return n.placement.Load() }

// Members lists the gossip members, sorted by name; Member finds one.
func (n *Peer) Members() []mesh.Member { return n.mesh.Members() }

// Member finds the gossip member of that name.
func (n *Peer) Member(name string) (mesh.Member, bool) { return n.mesh.Member(name) }

// ReadRetrying answers q linearizably through shard's leader, retrying
// until ctx ends (router.Router.ReadRetrying).
func (n *Peer) ReadRetrying(ctx context.Context, shard uint64, q replica.Query) (replica.Answer, error) {
	return n.router.ReadRetrying(ctx, shard, q)
}

// AskLeaders asks the hosts of p's shards that this peer does not host
// who leads them (membership.Service.AskLeaders).
func (n *Peer) AskLeaders(ctx context.Context, p *layout.Placement) map[uint64]string {
	return n.membership.AskLeaders(ctx, p)
}

// Applied returns how many lock shard entries and commands this peer's
// replicas applied.
func (n *Peer) Applied() (entries, commands uint64) {
	return n.counts.Entries.Load(), n.counts.Commands.Load()
}

// Hooks returns the test hooks the peer runs with (zero in a release).
func (n *Peer) Hooks() Hooks { return n.hooks }
