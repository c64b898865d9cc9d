package peer

import (
	"fmt"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/level"
	"github.com/lockmesh/lockmesh/internal/lockerr"
)

// TopLevel is the newest level this peer speaks: level.Max, or lower when
// a test holds the peer back to play an older release.
func (n *Peer) TopLevel() level.Level {
	if n.hooks.HoldLevel != 0 {
		return n.hooks.HoldLevel
	}
	return level.Max
}

// levelError says a peer cannot serve a cluster whose level it does not
// speak.
func levelError(l, top level.Level) error {
	return fmt.Errorf("%w: the cluster runs at feature level %d, and this peer speaks levels %d to %d: "+
		"upgrade it (see docs/UPGRADING.md)", lockerr.Incompatible, l, level.Min, top)
}

// ClusterLevel is the feature level of the layout this peer knows: what
// it writes entries at. Before it knows a layout, 1.
func (n *Peer) ClusterLevel() level.Level { return layout.LevelOf(n.placement.Load()) }

// checkLevel refuses a layout whose level this peer does not speak, and
// otherwise tells the mesh the level, so peers that do not speak it are
// refused. A refusal is logged once per level and kept for waitReady.
func (n *Peer) checkLevel(p *layout.Placement) error {
	l := layout.LevelOf(p)
	if l > n.TopLevel() || l < level.Min {
		err := levelError(l, n.TopLevel())
		if old := n.levelRefusal.Swap(&err); old == nil || (*old).Error() != err.Error() {
			n.log.Error("refusing the cluster layout", "err", err)
		}
		return err
	}
	n.levelRefusal.Store(nil)
	n.mesh.SetLevel(l)
	return nil
}
