package peer

import (
	"fmt"

	"github.com/lockmesh/lockmesh/internal/authz"
	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/replicas"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// raftPeers is the peer as the filter in front of its Raft port sees it
// (internal/raftauth through replicas.RaftPeers): the layout says which
// member hosts a replica, and a Propose that arrives over Raft is
// authorized by the rules of a proposal forwarded over RPC.
type raftPeers struct{ n *Peer }

var _ replicas.RaftPeers = raftPeers{}

// Host returns the name and NodeHostID of the member this peer's copy of
// the layout places replica of shard on; before this peer has one, no
// member.
func (r raftPeers) Host(shard, replica uint64) (string, string, bool) {
	p := r.n.expectedLayout()
	if p == nil {
		return "", "", false
	}
	name, ok := p.ReplicaPeer(shard, replica)
	if !ok {
		return "", "", false
	}
	pe, ok := p.Peer(name)
	return name, pe.NodeHostID, ok
}

// Proposal decides whether c may propose payload on shard: a layout on
// the meta shard, lock commands on a lock shard, in a format every member
// reads, accepted by internal/authz as from c.
func (r raftPeers) Proposal(c authz.Caller, shard uint64, payload []byte) error {
	n := r.n
	if shard == layout.MetaShard {
		next, err := layout.Decode(payload)
		if err != nil {
			return fmt.Errorf("layout that does not decode: %w", err)
		}
		if lvl := layout.LevelOf(next); lvl > n.TopLevel() {
			return fmt.Errorf("layout of feature level %d, above this peer's %d", lvl, n.TopLevel())
		}
		cur := n.expectedLayout()
		if cur == nil || n.authzOff() {
			return nil
		}
		return authz.LayoutChange(c, cur, next)
	}
	if len(payload) > lockfsm.MaxEntrySize {
		return fmt.Errorf("commands of %d bytes, above %d", len(payload), lockfsm.MaxEntrySize)
	}
	if f := n.ClusterLevel().CommandFormat(); len(payload) > 0 && payload[0] > f {
		return fmt.Errorf("command format %d, above the cluster's %d", payload[0], f)
	}
	cmds, err := lockfsm.DecodeCommands(payload)
	if err != nil {
		return fmt.Errorf("commands that do not decode: %w", err)
	}
	if err := n.fitsLevel(cmds); err != nil {
		return err
	}
	if n.authzOff() {
		return nil
	}
	return authz.Commands(c, cmds, n.ShardSessions(shard))
}
