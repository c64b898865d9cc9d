// Package mesh is lockmesh's membership layer: a thin wrapper around
// hashicorp/memberlist that gives every peer a gossiped view of the others.
//
// It provides
//
//   - gossip membership: [Create] starts the local peer, [Mesh.Join] contacts
//     existing peers, [Mesh.Leave] and [Mesh.Close] take it out again;
//   - node metadata: each peer gossips a small [Meta] (dragonboat NodeHostID,
//     raft and RPC addresses, protocol version, cluster id), encoded with
//     [EncodeMeta] and decoded defensively with [DecodeMeta];
//   - member events: [Config.OnEvent] receives [Event]s in order from one
//     goroutine, fed by an unbounded queue so memberlist is never blocked;
//   - gossip encryption: [Config.SecretKey] turns on AES-GCM encryption and
//     rejects unencrypted traffic in both directions;
//   - a gossip guard in front of memberlist that refuses streams and
//     packets announcing far more than they carry (a push-pull header
//     claiming more than [Config.MaxMembers] members, a compressed message
//     that inflates beyond the largest legitimate one), so that a few
//     bytes cannot make memberlist allocate megabytes;
//   - a dragonboat v4 node registry ([Mesh.NodeRegistryFactory], [Registry])
//     that resolves raft targets (NodeHostIDs) to the raft address the owning
//     peer gossips: the first live member to gossip a NodeHostID holds it,
//     and others gossiping it are refused ([Mesh.Conflicts]). It goes in
//     NodeHostConfig.Expert.NodeRegistryFactory, in
//     place of dragonboat's own gossip registry
//     (NodeHostConfig.DefaultNodeRegistryEnabled, which stays false);
//   - placement: [Replicas] is a pure rendezvous-hashing function that maps a
//     shard to the peers that should host its replicas.
//
// memberlist's own logging is routed through the [log/slog] logger from
// [Config.Logger]; the package never writes to stdout or stderr.
//
// Of lockmesh, mesh imports only internal/throttle (its rate-limited
// warnings): nothing of the lock state, the Raft side or node.
package mesh
