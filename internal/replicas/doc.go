// Package replicas runs lockmesh's Raft side on one peer: the dragonboat
// NodeHost and the table of the replicas it runs ([Table]). It starts
// replicas (from their data, by joining a shard, or as initial members),
// removes them with their data, and halts one that cannot read its log
// while keeping its data. It wraps, without forking, dragonboat's LogDB
// (logdb.go: an update that only moves the commit index is not synced by
// itself) and its transport (gate.go: every Raft message is authorized by
// internal/raftauth where it is accepted, with what the layout says of its
// sender, [RaftPeers]).
//
// It decides nothing about where replicas go: that is internal/layout's
// planning, carried out by internal/controller. The state machines the
// replicas run come in as factories, so this package knows nothing of
// lock commands.
package replicas
