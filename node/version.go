package node

import (
	"fmt"

	"github.com/lockmesh/lockmesh/lockfsm"
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
