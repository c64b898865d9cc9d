// Package controller keeps a cluster's layout in line with its live peers
// ([Controller]): one loop that acts only on the peer leading the meta
// shard. It admits peers that vouch for their name, forgets dead ones,
// moves replicas with quorum checks, reconciles the layout with every
// shard's Raft membership, balances leaders and raises the feature level.
// What to do is planned by internal/layout; the controller carries it out
// through the [Cluster] interface, which internal/membership's Service
// implements over the membership RPCs.
package controller
