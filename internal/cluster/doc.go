// Package cluster runs lockmesh's Raft side on one peer: the dragonboat
// NodeHost and the table of replicas it runs ([Replicas]); the membership
// service ([Service]) that forms or joins a cluster, serves and makes the
// membership RPCs, keeps the peer's copy of the layout current and moves a
// leaving peer out; the
// layout controller that keeps the cluster's layout in line with the live
// peers ([Controller]), acting through the Service as its [Host]; and the
// rules by which peers form a cluster at bootstrap ([Decide], [Promises],
// [NewPlan]), as pure code that the Service runs.
//
// It decides nothing about where replicas go: that planning is pure code
// in internal/layout. It owns the membership messages ([PeerStatus],
// [MembershipChange], [Membership], [ShardRequest], [TransferRequest]) but
// not the RPC server or the table of method numbers: package node
// dispatches the membership methods to [Service.Serve] and the bootstrap
// ones to [Service.ServeBootstrap] (all but prepare, commit and abort
// after checking that the caller is a known peer), and lends the Service
// what it needs of the peer (its RPCs, the caller's identity, its state
// machines, records and adoption of the first layout) through the small
// [Local] interface. The state machines the
// replicas run come in from node as factories, so this package knows
// nothing of lock commands.
package cluster
