// Package cluster runs lockmesh's Raft side on one peer: the dragonboat
// NodeHost and the table of replicas it runs ([Replicas]), and the layout
// controller that keeps the cluster's layout in line with the live peers
// ([Controller]); and the rules by which peers form a cluster at bootstrap
// ([Decide], [Promises], [NewPlan]), as pure code that package node runs.
//
// It decides nothing about where replicas go: that planning is pure code
// in internal/layout. It speaks no RPC either: package node owns the wire
// messages and the server, and lends the controller what it needs to reach
// the meta shard and the other peers through the small [Host] interface.
// The state machines the replicas run come in from node as factories, so
// this package knows nothing of lock commands.
package cluster
