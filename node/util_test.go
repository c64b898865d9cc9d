package node

import (
	"context"
	"errors"

	"github.com/lockmesh/lockmesh/internal/layout"
)

func errorsIs(err, target error) bool { return errors.Is(err, target) }

// readMetaPlacement reads the layout linearizably, as the controller does.
func (n *Node) readMetaPlacement(ctx context.Context) (*layout.Placement, error) {
	return n.peer.Membership().ReadPlacement(ctx)
}

// leadsShard reports whether this peer's replica of shard is its leader.
func (n *Node) leadsShard(shard uint64) bool { return n.peer.Replicas().Leads(shard) }
