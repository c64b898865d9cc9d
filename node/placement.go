package node

import (
	"errors"
	"fmt"
	"hash/fnv"
	"slices"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/lockmesh/lockmesh/mesh"
)

// Shard ids. dragonboat reserves nothing, but 0 reads as "unset" in too many
// places, so the meta shard is 1 and lock shards follow it.
const (
	metaShardID    uint64 = 1
	firstLockShard uint64 = 2
)

const placementVersion = 1

// peerEntry is one peer of the cluster as the placement knows it.
type peerEntry struct {
	Name       string `msgpack:"n"`
	NodeHostID string `msgpack:"h"`
	// Draining peers are leaving: the controller moves their replicas away.
	Draining bool `msgpack:"d,omitempty"`
}

// replica is one replica of a shard. Replica ids are unique across the
// whole cluster and never reused, so a replica removed from a shard can
// never rejoin it under its old id.
type replica struct {
	Peer string `msgpack:"p"`
	ID   uint64 `msgpack:"i"`
	// Join is true for replicas added to a running shard (they start empty
	// and catch up from the leader); false for the shard's initial members.
	Join bool `msgpack:"j,omitempty"`
}

// placement is the cluster's layout: which peers host which shards. It is
// agreed at bootstrap, replicated in the meta shard and cached in the data
// dir so a restarted peer knows which replicas to start.
type placement struct {
	Epoch         uint64               `msgpack:"e"`
	ClusterID     uint64               `msgpack:"c"`
	Shards        int                  `msgpack:"s"`
	RF            int                  `msgpack:"f"`
	Peers         []peerEntry          `msgpack:"p"` // sorted by Name
	Replicas      map[uint64][]replica `msgpack:"x"` // shard id -> replicas, sorted by peer
	NextReplicaID uint64               `msgpack:"n"`
}

// newPlacement lays out shards over peers by rendezvous hashing. Peers must
// be sorted by name.
func newPlacement(clusterID uint64, shards, rf int, peers []peerEntry) *placement {
	p := &placement{
		Epoch: 1, ClusterID: clusterID, Shards: shards, RF: rf,
		Peers: append([]peerEntry(nil), peers...), Replicas: map[uint64][]replica{}, NextReplicaID: 1,
	}
	names := make([]string, len(peers))
	for i, pe := range peers {
		names[i] = pe.Name
	}
	for _, id := range p.shardIDs() {
		chosen := mesh.Replicas(id, names, rf)
		slices.Sort(chosen)
		for _, name := range chosen {
			p.Replicas[id] = append(p.Replicas[id], replica{Peer: name, ID: p.NextReplicaID})
			p.NextReplicaID++
		}
	}
	return p
}

// shardIDs lists the meta shard and every lock shard.
func (p *placement) shardIDs() []uint64 {
	ids := []uint64{metaShardID}
	for i := 0; i < p.Shards; i++ {
		ids = append(ids, firstLockShard+uint64(i))
	}
	return ids
}

func (p *placement) peer(name string) (peerEntry, bool) {
	for _, pe := range p.Peers {
		if pe.Name == name {
			return pe, true
		}
	}
	return peerEntry{}, false
}

// identityError says that the layout lists this peer's name under another
// NodeHostID: the peer's data dir was wiped or replaced, so the replica ids
// the layout gives the name belong to Raft logs that are gone. Started with
// empty logs, those replicas could form a quorum with a lagging member and
// lose committed grants, so the peer must not run them.
type identityError struct {
	Name   string // the peer's name
	Listed string // the NodeHostID the layout lists under Name
	Local  string // the NodeHostID of this peer's data dir
}

func (e *identityError) Error() string {
	return fmt.Sprintf("the cluster layout lists peer %s with NodeHostID %s but this data dir has %s: "+
		"the data dir was wiped or replaced; this peer will be admitted as a new peer once the cluster "+
		"has replaced the old one (DeadAfter, default 30s), or start it under a new Name",
		e.Name, e.Listed, e.Local)
}

// checkIdentity returns an error when p lists peer name with a NodeHostID
// other than nodeHostID, the one of the peer's data dir, and nil when p
// lists it with nodeHostID or does not list it (a peer new to the layout).
func (p *placement) checkIdentity(name, nodeHostID string) *identityError {
	pe, ok := p.peer(name)
	if !ok || pe.NodeHostID == nodeHostID {
		return nil
	}
	return &identityError{Name: name, Listed: pe.NodeHostID, Local: nodeHostID}
}

// sameIdentity reports whether gossip member m is the NodeHost p lists
// under m's name, or a name p does not list. A member that gossips a
// listed name with another NodeHostID is not the peer the layout placed
// replicas on (its data dir was wiped): nothing meant for that peer may
// reach it by name.
func (p *placement) sameIdentity(m mesh.Member) bool {
	return p.checkIdentity(m.Name, m.Meta.NodeHostID) == nil
}

// peerByReplica returns the peer hosting the replica with id, in any shard.
func (p *placement) peerByReplica(id uint64) (peerEntry, bool) {
	for _, rs := range p.Replicas {
		for _, r := range rs {
			if r.ID == id {
				return p.peer(r.Peer)
			}
		}
	}
	return peerEntry{}, false
}

// replicaID returns the id of name's replica of shard.
func (p *placement) replicaID(shard uint64, name string) (uint64, bool) {
	for _, r := range p.Replicas[shard] {
		if r.Peer == name {
			return r.ID, true
		}
	}
	return 0, false
}

// hosts reports whether peer name has a replica of shard.
func (p *placement) hosts(shard uint64, name string) bool {
	_, ok := p.replicaID(shard, name)
	return ok
}

// shortShards counts the shards with fewer replicas than the replication
// factor, and returns the fewest any shard has.
func (p *placement) shortShards() (short, fewest int) {
	fewest = p.RF
	for _, shard := range p.shardIDs() {
		if c := len(p.Replicas[shard]); c < p.RF {
			short++
			fewest = min(fewest, c)
		}
	}
	return short, fewest
}

// hostNames lists the peers hosting shard.
func (p *placement) hostNames(shard uint64) []string {
	names := make([]string, 0, len(p.Replicas[shard]))
	for _, r := range p.Replicas[shard] {
		names = append(names, r.Peer)
	}
	return names
}

// initialMembers is the dragonboat member map of shard: replica id -> NodeHostID.
func (p *placement) initialMembers(shard uint64) map[uint64]string {
	m := map[uint64]string{}
	for _, r := range p.Replicas[shard] {
		if pe, ok := p.peer(r.Peer); ok && !r.Join {
			m[r.ID] = pe.NodeHostID
		}
	}
	return m
}

// replica returns name's replica of shard.
func (p *placement) replica(shard uint64, name string) (replica, bool) {
	for _, r := range p.Replicas[shard] {
		if r.Peer == name {
			return r, true
		}
	}
	return replica{}, false
}

// clone returns a deep copy, the starting point of the next epoch.
func (p *placement) clone() *placement {
	q := *p
	q.Peers = append([]peerEntry(nil), p.Peers...)
	q.Replicas = make(map[uint64][]replica, len(p.Replicas))
	for id, rs := range p.Replicas {
		q.Replicas[id] = append([]replica(nil), rs...)
	}
	return &q
}

// next returns a copy with the epoch advanced, to be changed and proposed.
func (p *placement) next() *placement {
	q := p.clone()
	q.Epoch++
	return q
}

// shardOf maps a key to its lock shard with a stable hash of the key bytes.
func (p *placement) shardOf(key string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(key))
	return firstLockShard + h.Sum64()%uint64(p.Shards)
}

func (p *placement) validate() error {
	switch {
	case p.ClusterID == 0:
		return errors.New("placement has no cluster id")
	case p.Shards < 1 || p.Shards > 4096:
		return fmt.Errorf("placement has %d shards", p.Shards)
	case len(p.Peers) == 0:
		return errors.New("placement has no peers")
	}
	for _, id := range p.shardIDs() {
		if len(p.Replicas[id]) == 0 {
			return fmt.Errorf("placement has no replica for shard %d", id)
		}
		for _, r := range p.Replicas[id] {
			if _, ok := p.peer(r.Peer); !ok {
				return fmt.Errorf("shard %d names unknown peer %q", id, r.Peer)
			}
			if r.ID == 0 || r.ID >= p.NextReplicaID {
				return fmt.Errorf("shard %d has replica id %d outside [1, %d)", id, r.ID, p.NextReplicaID)
			}
		}
	}
	return nil
}

func encodePlacement(p *placement) ([]byte, error) {
	b, err := msgpack.Marshal(p)
	if err != nil {
		return nil, err
	}
	return append([]byte{placementVersion}, b...), nil
}

func decodePlacement(b []byte) (*placement, error) {
	if len(b) == 0 || b[0] != placementVersion {
		return nil, errors.New("placement: unknown version")
	}
	if len(b) > maxBodySize {
		return nil, fmt.Errorf("placement: %d bytes is too large", len(b))
	}
	p := &placement{}
	if err := msgpack.Unmarshal(b[1:], p); err != nil {
		return nil, fmt.Errorf("placement: %w", err)
	}
	if err := p.validate(); err != nil {
		return nil, fmt.Errorf("placement: %w", err)
	}
	return p, nil
}
