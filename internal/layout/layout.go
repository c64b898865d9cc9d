package layout

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/lockmesh/lockmesh/internal/level"
	"github.com/lockmesh/lockmesh/mesh"
)

// Shard ids. dragonboat reserves nothing, but 0 reads as "unset" in too many
// places, so the meta shard is 1 and lock shards follow it.
const (
	// MetaShard is the shard that holds the layout itself.
	MetaShard uint64 = 1
	// FirstLockShard is the first of a layout's Shards lock shards; they
	// are numbered FirstLockShard .. FirstLockShard+Shards-1.
	FirstLockShard uint64 = 2
)

// maxShards bounds Placement.Shards; a layout with more is refused.
const maxShards = 4096

// Peer is one peer of the cluster as the layout knows it.
type Peer struct {
	Name       string `msgpack:"n"`
	NodeHostID string `msgpack:"h"`
	// Draining peers are leaving: the controller moves their replicas away.
	Draining bool `msgpack:"d,omitempty"`
}

// Replica is one replica of a shard. Replica ids are unique across the
// whole cluster and never reused, so a replica removed from a shard can
// never rejoin it under its old id.
type Replica struct {
	Peer string `msgpack:"p"`
	ID   uint64 `msgpack:"i"`
	// Join is true for replicas added to a running shard (they start empty
	// and catch up from the leader); false for the shard's initial members.
	Join bool `msgpack:"j,omitempty"`
}

// Placement is the cluster's layout: which peers host which shards, and
// how keys map to shards. It is agreed at bootstrap, replicated in the
// meta shard and cached in the data dir so a restarted peer knows which
// replicas to start. Its msgpack field tags are its wire format: they
// never change, and a new field is added with omitempty so that layouts
// without it encode as before.
type Placement struct {
	Epoch         uint64               `msgpack:"e"`
	ClusterID     uint64               `msgpack:"c"`
	Shards        int                  `msgpack:"s"`
	RF            int                  `msgpack:"f"`
	Peers         []Peer               `msgpack:"p"` // sorted by Name
	Replicas      map[uint64][]Replica `msgpack:"x"` // shard id -> replicas, sorted by peer
	NextReplicaID uint64               `msgpack:"n"`
	// KeyScheme is the rule that maps a key to its shard (KeySchemeWhole
	// or KeySchemeHashTag), fixed when the cluster is created: keys never
	// move between shards. Layouts written before it existed decode as
	// KeySchemeWhole, their rule.
	KeyScheme uint8 `msgpack:"k,omitempty"`
	// Level is the cluster's feature level (internal/level), recorded as a
	// uint32; 0 reads as 1. Read it with LevelOf.
	Level uint32 `msgpack:"l,omitempty"`
}

// LevelOf is the feature level layout p records; layouts written before
// levels existed have none and are level 1, and so is a nil layout.
func LevelOf(p *Placement) level.Level {
	if p == nil {
		return level.Positional
	}
	return level.Of(p.Level)
}

// New lays out shards lock shards and the meta shard over peers for a new
// cluster: rf replicas each (all peers if fewer), chosen by rendezvous
// hashing, with replica ids from 1, at epoch 1. Keys map to shards by
// keyScheme. The result lists peers sorted by name whatever their order
// in peers, and depends on nothing else than the arguments.
func New(clusterID uint64, shards, rf int, keyScheme uint8, peers []Peer) *Placement {
	p := &Placement{
		Epoch: 1, ClusterID: clusterID, Shards: shards, RF: rf, KeyScheme: keyScheme,
		Peers: slices.Clone(peers), Replicas: map[uint64][]Replica{}, NextReplicaID: 1,
	}
	slices.SortFunc(p.Peers, func(a, b Peer) int { return cmp.Compare(a.Name, b.Name) })
	names := make([]string, len(p.Peers))
	for i, pe := range p.Peers {
		names[i] = pe.Name
	}
	for _, id := range p.ShardIDs() {
		chosen := mesh.Replicas(id, names, rf)
		slices.Sort(chosen)
		for _, name := range chosen {
			p.Replicas[id] = append(p.Replicas[id], Replica{Peer: name, ID: p.NextReplicaID})
			p.NextReplicaID++
		}
	}
	return p
}

// ShardIDs lists the meta shard and then every lock shard, in increasing
// order, so ShardIDs()[1:] are the lock shards.
func (p *Placement) ShardIDs() []uint64 {
	ids := []uint64{MetaShard}
	for i := 0; i < p.Shards; i++ {
		ids = append(ids, FirstLockShard+uint64(i))
	}
	return ids
}

// Peer returns the listed peer called name.
func (p *Placement) Peer(name string) (Peer, bool) {
	for _, pe := range p.Peers {
		if pe.Name == name {
			return pe, true
		}
	}
	return Peer{}, false
}

// AddPeer lists pe, keeping Peers sorted by name. It does not check that
// the name is new.
func (p *Placement) AddPeer(pe Peer) {
	p.Peers = append(p.Peers, pe)
	slices.SortFunc(p.Peers, func(a, b Peer) int { return cmp.Compare(a.Name, b.Name) })
}

// PeerByReplica returns the peer hosting the replica with id, in any shard.
func (p *Placement) PeerByReplica(id uint64) (Peer, bool) {
	for _, rs := range p.Replicas {
		for _, r := range rs {
			if r.ID == id {
				return p.Peer(r.Peer)
			}
		}
	}
	return Peer{}, false
}

// ReplicaPeer returns the name of the peer hosting replica id of shard:
// PeerByReplica for a replica known to be shard's, which looks at that
// shard's replicas only (it runs for every proposal, with the id of the
// shard's leader).
func (p *Placement) ReplicaPeer(shard, id uint64) (string, bool) {
	for _, r := range p.Replicas[shard] {
		if r.ID == id {
			return r.Peer, true
		}
	}
	return "", false
}

// Replica returns name's replica of shard.
func (p *Placement) Replica(shard uint64, name string) (Replica, bool) {
	for _, r := range p.Replicas[shard] {
		if r.Peer == name {
			return r, true
		}
	}
	return Replica{}, false
}

// ReplicaID returns the id of name's replica of shard.
func (p *Placement) ReplicaID(shard uint64, name string) (uint64, bool) {
	r, ok := p.Replica(shard, name)
	return r.ID, ok
}

// Hosts reports whether peer name has a replica of shard.
func (p *Placement) Hosts(shard uint64, name string) bool {
	_, ok := p.Replica(shard, name)
	return ok
}

// HostNames lists the peers hosting shard, in the order of
// p.Replicas[shard].
func (p *Placement) HostNames(shard uint64) []string {
	names := make([]string, 0, len(p.Replicas[shard]))
	for _, r := range p.Replicas[shard] {
		names = append(names, r.Peer)
	}
	return names
}

// AddReplica gives peer a new replica of shard under the next unused
// replica id, marked Join (it starts empty and catches up from the shard's
// leader), keeps the shard's replicas sorted by peer, and returns it. It
// does not check that peer is listed or does not host shard already.
func (p *Placement) AddReplica(shard uint64, peer string) Replica {
	r := Replica{Peer: peer, ID: p.NextReplicaID, Join: true}
	p.NextReplicaID++
	p.Replicas[shard] = append(p.Replicas[shard], r)
	slices.SortFunc(p.Replicas[shard], func(a, b Replica) int { return cmp.Compare(a.Peer, b.Peer) })
	return r
}

// ReplicaCount is the number of replicas name hosts, over all shards.
func (p *Placement) ReplicaCount(name string) int {
	c := 0
	for _, rs := range p.Replicas {
		for _, r := range rs {
			if r.Peer == name {
				c++
			}
		}
	}
	return c
}

// ShortShards counts the shards with fewer replicas than the replication
// factor, and returns the fewest any of them has (RF when none is short).
func (p *Placement) ShortShards() (short, fewest int) {
	fewest = p.RF
	for _, shard := range p.ShardIDs() {
		if c := len(p.Replicas[shard]); c < p.RF {
			short++
			fewest = min(fewest, c)
		}
	}
	return short, fewest
}

// InitialMembers is the dragonboat member map of shard for a replica that
// starts it as an initial member: replica id -> NodeHostID of every
// replica that is not a Join replica.
func (p *Placement) InitialMembers(shard uint64) map[uint64]string {
	m := map[uint64]string{}
	for _, r := range p.Replicas[shard] {
		if pe, ok := p.Peer(r.Peer); ok && !r.Join {
			m[r.ID] = pe.NodeHostID
		}
	}
	return m
}

// CheckIdentity returns an error when p lists peer name with a NodeHostID
// other than nodeHostID, the one of the peer's data dir, and nil when p
// lists it with nodeHostID or does not list it (a peer new to the layout).
// A gossip member that fails it is not the peer the layout placed
// replicas on: nothing meant for that peer may reach it by name.
func (p *Placement) CheckIdentity(name, nodeHostID string) *IdentityError {
	pe, ok := p.Peer(name)
	if !ok || pe.NodeHostID == nodeHostID {
		return nil
	}
	return &IdentityError{Name: name, Listed: pe.NodeHostID, Local: nodeHostID}
}

// Clone returns a deep copy: changing it leaves p as it was.
func (p *Placement) Clone() *Placement {
	q := *p
	q.Peers = slices.Clone(p.Peers)
	q.Replicas = make(map[uint64][]Replica, len(p.Replicas))
	for id, rs := range p.Replicas {
		q.Replicas[id] = slices.Clone(rs)
	}
	return &q
}

// Next returns a deep copy with the epoch advanced: the successor of p, to
// be changed and proposed. The meta shard takes it only if p is still
// its current layout.
func (p *Placement) Next() *Placement {
	q := p.Clone()
	q.Epoch++
	return q
}

// validate checks what every peer relies on: a cluster id, a shard count
// in range, a key scheme this version knows, and every shard with at least
// one replica on a listed peer under an id already given out.
func (p *Placement) validate() error {
	switch {
	case p.ClusterID == 0:
		return errors.New("placement has no cluster id")
	case p.Shards < 1 || p.Shards > maxShards:
		return fmt.Errorf("placement has %d shards", p.Shards)
	case len(p.Peers) == 0:
		return errors.New("placement has no peers")
	case p.KeyScheme > KeySchemeHashTag:
		// A peer that routed keys by another rule than the cluster's
		// would send a key to a second shard: two holders at once.
		return fmt.Errorf("placement has key scheme %d, which this version does not know (it knows %d, whole key, and %d, hash tags): "+
			"upgrade this peer to a version that knows it", p.KeyScheme, KeySchemeWhole, KeySchemeHashTag)
	}
	for _, id := range p.ShardIDs() {
		if len(p.Replicas[id]) == 0 {
			return fmt.Errorf("placement has no replica for shard %d", id)
		}
		for _, r := range p.Replicas[id] {
			if _, ok := p.Peer(r.Peer); !ok {
				return fmt.Errorf("shard %d names unknown peer %q", id, r.Peer)
			}
			if r.ID == 0 || r.ID >= p.NextReplicaID {
				return fmt.Errorf("shard %d has replica id %d outside [1, %d)", id, r.ID, p.NextReplicaID)
			}
		}
	}
	return nil
}
