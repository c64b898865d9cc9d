// Package peer is the running lockmesh peer ([Peer]): what node.Start
// starts behind the public node.Node.
//
// A Peer owns the peer's ports and parts and wires them together:
//
//   - its RPC port (rpc.go: the method table and handle, every request
//     authorized where it is accepted, authz.go) and its Raft port's
//     questions (raftport.go: which member hosts a replica, and whether a
//     Propose that arrived over Raft may be proposed);
//   - gossip (package mesh), the replicas (internal/replicas), the
//     membership service and the layout controller (internal/membership,
//     internal/controller), reached through membership.go;
//   - forming, joining or rejoining a cluster and adopting its layout
//     (node.go, bootstrap.go, rejoin.go, placement.go), and the feature
//     level it runs at (version.go);
//   - the routes of commands and reads (propose.go, over internal/router),
//     the leader side of sessions (leading.go, over internal/leader) and
//     the client side (client.go, over internal/client), with the
//     cross-shard deadlock check (deadlock.go);
//   - one shutdown signal: its context, which Close (after closing the
//     sessions) and Kill cancel; every loop ends with it.
//
// Each adapter to a part is a small type pinned to the part's interface
// with var _ (routerHost, leaderHost, membershipHost, raftPeers), and the
// peer reports what it does to an [Observer] (node's telemetry). [Hooks]
// are what lockmesh's own tests change about a peer; nothing outside this
// module can reach them.
package peer
