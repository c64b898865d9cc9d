// Package membership is one peer's part in its cluster's membership
// ([Service]): it forms a cluster with other founders at bootstrap or
// adopts a running one's layout (forming.go, by the rules of
// internal/bootstrap), serves and makes the membership RPCs (service.go,
// each authorized where it is accepted), keeps the peer's copy of the
// layout current and its replicas in line with it, and drains a leaving
// peer (placement.go). The layout controller (internal/controller) acts
// through it.
//
// It owns the membership messages ([PeerStatus], [MembershipChange],
// [Membership], [ShardRequest], [TransferRequest]) but not the RPC server
// or the table of method numbers: the running peer dispatches the
// membership methods to [Service.Serve] and the bootstrap ones to
// [Service.ServeBootstrap] (all but prepare, commit and abort after
// checking that the caller is a known peer), and lends the Service what it
// needs of the peer (its RPCs, the caller's identity, its state machines,
// records and adoption of the first layout) through the small [Peer]
// interface.
package membership
