package node

import (
	"fmt"

	"github.com/lockmesh/lockmesh/internal/cluster"
	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// Feature levels. A cluster runs at one feature level, recorded in its
// layout in the meta shard; every peer writes log entries in the format of
// that level, so every replica can read every entry. A peer speaks the
// levels minLevel to maxLevel and gossips that range (mesh.Meta.MinVersion
// and Version); the meta leader raises the cluster's level only when every
// peer of the layout and every member of the gossip mesh speaks the new one
// (see cluster.Controller and docs/UPGRADING.md).
//
//	level 1: commands in lockfsm.FormatPositional (releases before levels).
//	level 2: commands in lockfsm.FormatTagged; new clusters hash keys with
//	         hash tags (layout.KeySchemeHashTag).
//	level 3: sessions carry their Session's label (Session.ID, in
//	         OpenSession's tag 12 and lock snapshot format 3), and meta
//	         snapshots start with a version byte (format 2); the lock
//	         family's commands; forwarded proposals carry trace contexts,
//	         reads ask for ages (replica.Query.Ages) and contention
//	         summaries (QueryTop), and PeerStatus carries applied indexes;
//	         every OpenSession a peer writes is marked Capped
//	         (lockfsm.Command.Capped, tag 18), and the state machine
//	         refuses a marked one past the session caps on apply
//	         (StatusSessionLimit), so the caps are deterministic, O(1)
//	         and not racy. The mark gates the rule: unmarked opens, which
//	         is every entry written below level 3, apply as before, so a
//	         level-2 log replays as it was first applied. The peer that
//	         writes an entry marks it, forwarded opens included; an entry
//	         proposed over the Raft port must come marked (authz);
//	         shards answer the cross-shard deadlock check's wait-graph
//	         reads (replica.QueryWaits).
//
// A level's formats may still change until the release that introduces it
// is cut (internal/release): level 3 is this release's, 0.2.0.
const (
	minLevel uint8 = 1
	maxLevel uint8 = 3

	// labelLevel is the first level whose sessions carry labels.
	labelLevel uint8 = 3
	// traceLevel is the first level whose forwarded proposals carry trace
	// contexts and whose reads may ask for ages and contention summaries.
	traceLevel uint8 = 3
	// capsLevel is the first level whose OpenSessions are marked Capped:
	// the state machine enforces the session caps on them when it applies
	// them.
	capsLevel uint8 = 3
)

// FeatureLevels returns the oldest and newest feature levels this release
// speaks: a cluster at a level outside them is refused (ErrIncompatible).
// Rolling upgrades need the next release to speak this one's newest level
// (docs/UPGRADING.md).
func FeatureLevels() (oldest, newest uint8) { return minLevel, maxLevel }

// commandFormat is the lockfsm command format a cluster at level writes.
func commandFormat(level uint8) byte {
	if level >= 2 {
		return lockfsm.FormatTagged
	}
	return lockfsm.FormatPositional
}

// snapshotFormat is the lockfsm snapshot format a cluster at level writes.
// Snapshot version 2 came with command format 2 (both added the leader
// term), so every release at level 1 reads it, and level 2 added no
// snapshot format; level 3 added format 3 (session labels). A replica
// writes at least what its state needs (lockfsm.MinSnapshotFormat).
func snapshotFormat(level uint8) byte {
	if level >= labelLevel {
		return 3
	}
	return 2
}

// labels reports whether sessions opened now carry their label: the
// cluster runs at labelLevel or above.
func (n *Node) labels() bool { return n.clusterLevel() >= labelLevel }

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

// levelOf is the feature level layout p records (cluster.LevelOf); layouts
// written before levels existed have none and are level 1.
func levelOf(p *layout.Placement) uint8 { return cluster.LevelOf(p) }

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
