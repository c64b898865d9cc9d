// Package level is the cluster's feature level: what every replica of a
// cluster reads, and so what every peer may write.
//
// A cluster runs at one level, recorded in its layout in the meta shard
// (layout.Placement.Level). Every peer writes log entries, snapshots and
// requests in the formats of that level, so every replica reads every
// entry whatever release it runs. A release speaks the levels Min to Max
// and gossips that range (mesh.Meta.MinLevel and MaxLevel).
//
// # Rules
//
//  1. A new cluster starts at the newest level every founder speaks.
//  2. The meta leader raises the level from N to N+1 (or higher) only once
//     every peer of the layout and every live member of the gossip mesh
//     speaks it (internal/controller). The level never goes down: the meta
//     shard refuses a layout that lowers it.
//  3. A peer writes a level's formats only after the meta shard committed
//     that level; a layout a peer holds may lag the level, never lead it,
//     which is safe because every release that speaks level N reads what
//     every level up to N writes.
//  4. A peer refuses a layout whose level it does not speak
//     (ErrIncompatible), and gossip drops members that do not speak the
//     cluster's level.
//  5. A level's formats may change until the release that introduces it
//     is cut (internal/release); after that they are fixed for good.
//     A new command, field or snapshot shape is a new level, never written
//     before every member speaks it.
//
// Rolling upgrades need the next release to speak this one's newest level
// (docs/UPGRADING.md).
//
// This package imports nothing: gossip, the layout and the state machines
// all use it. The format numbers it gives are pinned to the constants of
// the packages that define them by its tests.
package level

// Level is a cluster's feature level. On the wire it is a uint8 in gossip
// and requests, and a uint32 in the layout (layout.Placement.Level); 0
// there means a peer or layout from before levels, which is level 1 (Of).
type Level uint8

// The levels, with what each brought.
const (
	// Positional (1): commands in lockfsm.FormatPositional, lock
	// snapshots in format 2, meta snapshots in format 1, keys hashed
	// whole (layout.KeySchemeWhole). Releases before levels.
	Positional Level = 1

	// Tagged (2): commands in lockfsm.FormatTagged; new clusters hash
	// keys with hash tags (layout.KeySchemeHashTag). No new snapshot
	// format.
	Tagged Level = 2

	// Family (3), release 0.2.0:
	//   - sessions carry their Session's label (OpenSession's tag 12,
	//     lock snapshot format 3);
	//   - meta snapshots start with a version byte (format 2);
	//   - the lock family's commands (read/write locks, semaphores, groups,
	//     maximum hold times) and flags (refusal details, deadlock
	//     checks), and the wait graphs of the cross-shard deadlock check
	//     (replica.QueryWaits);
	//   - forwarded proposals carry trace contexts; reads ask for ages
	//     (replica.Query.Ages) and contention summaries (QueryTop);
	//     PeerStatus carries applied indexes;
	//   - every OpenSession a peer writes is marked Capped (tag 18), and the
	//     state machine refuses a marked one past the session caps on
	//     apply, so the caps are deterministic, O(1) and not racy. The mark
	//     gates the rule: unmarked opens, which is every entry written
	//     below this level, apply as before, so an older log replays as it
	//     was first applied. An entry proposed over the Raft port must come
	//     marked (internal/authz).
	Family Level = 3

	// Coordination (4), release 0.3.0:
	//   - a lock attempt carries its holder's value (lockfsm.Command.Value,
	//     tag 19) and a holder replaces it with OpSetValue, fenced on its
	//     hold: elections proclaim their leaders in it;
	//   - a waiting Acquire may carry a priority (Command.Priority, tag
	//     20), which orders it ahead of unchecked waiters of lower one;
	//   - lock snapshots keep the values and priorities (format 4);
	//   - watches: MethodWatch, and the reads QueryWatch and QueryKeys
	//     (InspectPrefix), which replicas of older releases do not answer.
	Coordination Level = 4
)

// Min and Max are the oldest and newest levels this release speaks.
const (
	Min = Positional
	Max = Coordination
)

// Of reads a level as a layout records it: 0, from layouts written before
// levels, is level 1; values beyond a uint8 read as 255, which no release
// speaks.
func Of(recorded uint32) Level {
	if recorded == 0 {
		return Positional
	}
	return Level(min(recorded, 255))
}

// CommandFormat is the lockfsm command format a cluster at l writes
// (lockfsm.FormatPositional or FormatTagged).
func (l Level) CommandFormat() byte {
	if l >= Tagged {
		return 3
	}
	return 2
}

// LockSnapshotFormat is the lock snapshot format a cluster at l writes.
// Snapshot format 2 came with command format 2, so every release reads
// it; format 3 (session labels) came with Family, format 4 (values) with
// Coordination. A replica writes at least what its state needs
// (lockfsm.MinSnapshotFormat).
func (l Level) LockSnapshotFormat() byte {
	switch {
	case l >= Coordination:
		return 4
	case l >= Family:
		return 3
	}
	return 2
}

// MetaSnapshotFormat is the meta snapshot format a cluster at l writes:
// releases before 0.2.0, which speak levels 1 and 2, read only format 1.
func (l Level) MetaSnapshotFormat() byte {
	if l >= Family {
		return 2
	}
	return 1
}

// HashesTags reports whether a new cluster at l maps keys to shards by
// their hash tags (layout.KeySchemeHashTag) rather than whole.
func (l Level) HashesTags() bool { return l >= Tagged }

// LabelsSessions reports whether sessions opened at l carry their
// Session's label.
func (l Level) LabelsSessions() bool { return l >= Family }

// HasLockFamily reports whether the lock family's commands (read/write
// locks, semaphores, groups, maximum hold times) and flags (refusal
// details, deadlock checks) may be written at l, and shards answer wait
// graph reads.
func (l Level) HasLockFamily() bool { return l >= Family }

// CarriesTraces reports whether forwarded proposals carry trace contexts
// at l, and reads may ask for ages and contention summaries.
func (l Level) CarriesTraces() bool { return l >= Family }

// CapsSessions reports whether every OpenSession written at l is marked
// Capped, so that the state machine enforces the session caps on apply.
func (l Level) CapsSessions() bool { return l >= Family }

// HasCoordination reports whether lock attempts may carry values and
// holders replace them (lockfsm.Command.Value, OpSetValue) at l: what
// elections and values on locks are made of.
func (l Level) HasCoordination() bool { return l >= Coordination }

// ReportsApplied reports whether peers' statuses carry their applied
// indexes at l.
func (l Level) ReportsApplied() bool { return l >= Family }
