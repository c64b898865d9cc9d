package membership

import (
	"errors"

	"github.com/lockmesh/lockmesh/internal/level"
)

// The messages of the membership RPCs, as they travel in msgpack.

// PeerStatus is what a peer says of the replicas it runs. It is also the
// answer to Methods.Status on the wire.
type PeerStatus struct {
	Replicas map[uint64]uint64 `msgpack:"r"` // shard -> the peer's replica id
	Leaders  map[uint64]uint64 `msgpack:"l"` // shard -> leader replica id, as the peer sees it
	Leading  []uint64          `msgpack:"x"` // shards the peer leads
	// Level is the newest feature level the peer speaks; 0 from releases
	// before levels, which speak only level 1.
	Level level.Level `msgpack:"v,omitempty"`
	// Applied is, per lock shard, the index of the last entry the peer's
	// replica applied (for the status page's lag); written from feature
	// level 3, which every peer then reads.
	Applied map[uint64]uint64 `msgpack:"a,omitempty"`
}

// MembershipChange adds (Add) or removes replica Replica of Shard; an
// added replica runs on the NodeHost NodeHostID. It is also the request
// of Methods.ConfigChange on the wire.
type MembershipChange struct {
	Shard      uint64 `msgpack:"s"`
	Add        bool   `msgpack:"a"`
	Replica    uint64 `msgpack:"r"`
	NodeHostID string `msgpack:"h"`
}

// Membership is a shard's Raft membership, read linearizably. It is also
// the answer to Methods.Membership on the wire.
type Membership struct {
	Members []uint64 `msgpack:"m"` // voting replica ids
	Removed []uint64 `msgpack:"r"` // ids removed from the shard, never to return
}

// ErrReplicaRemoved says a replica id cannot be added to its shard: it was
// a member before and was removed, and Raft never takes an id back.
var ErrReplicaRemoved = errors.New("replica id was removed from the shard before")
