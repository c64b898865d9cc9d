package node

import (
	"time"
)

// Status is one peer's view of the mesh and of the cluster's shards, for
// operators: what the status page (Handler) shows. It is assembled from
// what this peer knows and what the peers it asks answer; it is not a
// linearizable read.
type Status struct {
	// Peer is this peer's name and Release its build's release.
	Peer, Release string
	// Cluster is the cluster's id, 0 before this peer knows one.
	Cluster uint64
	// Level is the cluster's feature level (docs/UPGRADING.md).
	Level uint8
	// Ready is true once the peer serves locks (it knows the layout).
	Ready bool
	// Members are the peers gossip sees and those the layout lists, as
	// Members returns them, with the feature levels they speak.
	Members []MemberStatus
	// Shards are the cluster's lock shards, by id.
	Shards []ShardStatus
}

// MemberStatus is a member of the mesh with what it gossips of itself.
type MemberStatus struct {
	Member
	// Level is the newest feature level the peer speaks; 0 when unknown
	// (not Alive).
	Level uint8
	// NoReplicas marks a client-only peer.
	NoReplicas bool
}

// ShardStatus is one lock shard.
type ShardStatus struct {
	Shard uint64
	// Leader names the peer leading the shard as this peer sees it; ""
	// when none is known (an election, or no replica reachable).
	Leader string
	// Replicas are the shard's replicas in the layout, by peer name.
	Replicas []ReplicaStatus
	// Counted is true when the counts below come from the shard's state:
	// this peer hosts a replica, or the leader's peer answered.
	Counted bool
	// Sessions, Keys, Holders and Waiters count the shard's live
	// sessions, keys held or waited for, holders and waiters.
	Sessions, Keys, Holders, Waiters int
}

// ReplicaStatus is one replica of a shard.
type ReplicaStatus struct {
	Peer    string
	Replica uint64
	// Leader is true for the replica leading the shard.
	Leader bool
	// Reported is true when the replica's peer answered; Applied and
	// Lag are then set.
	Reported bool
	// Applied is the index of the last Raft entry the replica applied,
	// and Lag how many entries it is behind the most advanced replica
	// that reported.
	Applied, Lag uint64
}

// Top is the most contended keys and the longest current holds across
// the cluster's shards (Node.Top).
type Top struct {
	// Contended are the keys waited for the most, most first: by the
	// total time grants to waiters waited plus the age of the waits going
	// on now.
	Contended []ContendedKey
	// LongestHolds are the holds granted longest ago that still hold,
	// longest first.
	LongestHolds []LongHold
	// Missing lists the shards that did not answer; the lists cover the
	// others.
	Missing []uint64
}

// ContendedKey is a key that was or is waited for.
type ContendedKey struct {
	Key   string
	Shard uint64
	// Waiters is how many wait for the key now, and OldestWait how long
	// the first of them has waited (0 when the shard's leader did not see
	// it queue: see docs/OBSERVABILITY.md).
	Waiters    int
	OldestWait time.Duration
	// Handoffs counts the grants to waiters the shard leader's summary
	// recorded for the key since Since, and TotalWait their summed waits.
	// The summary is approximate (space-saving, bounded per shard): a key
	// that entered it late may be over-counted by at most Overcount.
	Handoffs  uint64
	TotalWait time.Duration
	Overcount time.Duration
	// Since is when the summary started: the answering replica's start.
	Since time.Time
}

// LongHold is a lock held for long.
type LongHold struct {
	Key   string
	Shard uint64
	// Peer and Session identify the holder (as in Holder), Token its grant.
	Peer    string
	Session uint64
	Token   uint64
	// HeldFor is how long ago the grant was made, as the shard leader's
	// replica saw it. AtLeast is true when the grant came before that
	// replica started (or was too long ago to place exactly): it was
	// made at least HeldFor ago.
	HeldFor time.Duration
	AtLeast bool
}
