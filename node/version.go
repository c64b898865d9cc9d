package node

import (
	"context"
	"fmt"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/lockfsm"
	"github.com/lockmesh/lockmesh/mesh"
)

// Feature levels. A cluster runs at one feature level, recorded in its
// layout in the meta shard; every peer writes log entries in the format of
// that level, so every replica can read every entry. A peer speaks the
// levels minLevel to maxLevel and gossips that range (mesh.Meta.MinVersion
// and Version); the meta leader raises the cluster's level only when every
// peer of the layout and every member of the gossip mesh speaks the new one
// (see raiseLevel and docs/UPGRADING.md).
//
//	level 1: commands in lockfsm.FormatPositional (releases before levels).
//	level 2: commands in lockfsm.FormatTagged; new clusters hash keys with
//	         hash tags (layout.KeySchemeHashTag).
const (
	minLevel uint8 = 1
	maxLevel uint8 = 2
)

// commandFormat is the lockfsm command format a cluster at level writes.
func commandFormat(level uint8) byte {
	if level >= 2 {
		return lockfsm.FormatTagged
	}
	return lockfsm.FormatPositional
}

// topLevel is the newest level this peer speaks: maxLevel, or lower when a
// test holds the peer back to play an older release.
func (n *Node) topLevel() uint8 {
	if n.hooks.holdLevel != 0 {
		return n.hooks.holdLevel
	}
	return maxLevel
}

// levelError says a peer cannot serve a cluster whose level it does not
// speak.
func levelError(level, top uint8) error {
	return fmt.Errorf("%w: the cluster runs at feature level %d, and this peer speaks levels %d to %d: "+
		"upgrade it (see docs/UPGRADING.md)", ErrIncompatible, level, minLevel, top)
}

// levelOf is the feature level layout p records; layouts written before
// levels existed have none and are level 1.
func levelOf(p *layout.Placement) uint8 {
	if p == nil || p.Level == 0 {
		return 1
	}
	return uint8(min(p.Level, 255))
}

// clusterLevel is the feature level of the layout this peer knows: what
// it writes entries at. Before it knows a layout, 1.
func (n *Node) clusterLevel() uint8 { return levelOf(n.placement.Load()) }

// checkLevel refuses a layout whose level this peer does not speak, and
// otherwise tells the mesh the level, so peers that do not speak it are
// refused. A refusal is logged once per level and kept for waitReady.
func (n *Node) checkLevel(p *layout.Placement) error {
	level := levelOf(p)
	if level > n.topLevel() || level < minLevel {
		err := levelError(level, n.topLevel())
		if old := n.levelRefusal.Swap(&err); old == nil || (*old).Error() != err.Error() {
			n.log.Error("refusing the cluster layout", "err", err)
		}
		return err
	}
	n.levelRefusal.Store(nil)
	n.mesh.SetLevel(level)
	return nil
}

// speaks reports whether a peer with metadata m speaks level. A Version of
// 0 reads as 1, as everywhere levels are compared (newClusterLevel).
func speaks(m mesh.Meta, level uint8) bool {
	lo, hi := m.Versions()
	return lo <= level && level <= max(hi, 1)
}

// newClusterLevel is the level a cluster formed by members starts at: the
// newest they all speak.
func newClusterLevel(top uint8, members []mesh.Member) uint8 {
	level := top
	for _, m := range members {
		level = min(level, max(m.Meta.Version, 1))
	}
	return level
}

// keySchemeFor is the key scheme a new cluster at level uses: hash tags
// from level 2 on. Peers of level 1 (releases before levels) hash whole
// keys and ignore the scheme field, so a cluster they may serve must hash
// whole keys for ever.
func keySchemeFor(level uint8) uint8 {
	if level >= 2 {
		return layout.KeySchemeHashTag
	}
	return layout.KeySchemeWhole
}

// raiseLevel, run by the controller on the meta leader, raises the
// cluster's feature level to the newest that every peer of the layout and
// every member of the mesh speaks. A peer of the layout that gossip does
// not see alive holds the level where it is: it may be an old release
// that comes back. It returns whether it proposed a new layout.
func (n *Node) raiseLevel(ctx context.Context, p *layout.Placement, members []mesh.Member) (bool, error) {
	seen := map[string]bool{}
	var alive []mesh.Member
	for _, m := range members {
		if m.State == mesh.StateAlive {
			seen[m.Name] = true
			alive = append(alive, m)
		}
	}
	target := newClusterLevel(n.topLevel(), alive)
	for _, pe := range p.Peers {
		if !seen[pe.Name] {
			return false, nil
		}
	}
	if target <= levelOf(p) {
		return false, nil
	}
	// Gossip may still show the metadata of a peer's previous run (a peer
	// restarted on an older release); each peer of the layout, which runs
	// replicas, is asked itself.
	for _, pe := range p.Peers {
		st, err := n.peerStatus(ctx, pe.Name)
		if err != nil {
			return false, nil
		}
		target = min(target, max(st.Level, 1))
	}
	if target <= levelOf(p) {
		return false, nil
	}
	q := p.Next()
	q.Level = uint32(target)
	n.log.Info("raising the cluster's feature level", "from", levelOf(p), "to", target, "epoch", q.Epoch)
	return true, n.proposePlacement(ctx, q)
}
