package node

// Stats are counters of a peer's work since it started. They only grow;
// the difference of two readings is what happened in between.
type Stats struct {
	// RaftEntries is the lock-shard Raft entries this peer's replicas
	// applied, and Commands the lock commands in them. Each replica
	// applies every entry of its shard, leader or not, so
	// Commands/RaftEntries is how many commands the shards' entries carry
	// on average: under load proposals share entries (the batching of
	// docs/ARCHITECTURE.md), and each entry costs a replication round and
	// a place in every replica's log.
	RaftEntries, Commands uint64
}

// Stats returns this peer's counters. It is cheap and safe to call at any
// time, also after Close.
func (n *Node) Stats() Stats {
	entries, commands := n.peer.Applied()
	return Stats{RaftEntries: entries, Commands: commands}
}
