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
	ReplicaID  uint64 `msgpack:"r"`
}

// placement is the cluster's layout: which peers host which shards. It is
// agreed at bootstrap, replicated in the meta shard and cached in the data
// dir so a restarted peer knows which replicas to start.
type placement struct {
	Epoch     uint64              `msgpack:"e"`
	ClusterID uint64              `msgpack:"c"`
	Shards    int                 `msgpack:"s"`
	RF        int                 `msgpack:"f"`
	Peers     []peerEntry         `msgpack:"p"` // sorted by Name
	Replicas  map[uint64][]string `msgpack:"x"` // shard id -> peer names
}

// newPlacement lays out shards over peers by rendezvous hashing. Peers must
// be sorted by name; replica ids are their 1-based positions.
func newPlacement(clusterID uint64, shards, rf int, peers []peerEntry) *placement {
	p := &placement{Epoch: 1, ClusterID: clusterID, Shards: shards, RF: rf, Replicas: map[uint64][]string{}}
	names := make([]string, len(peers))
	for i, pe := range peers {
		pe.ReplicaID = uint64(i + 1)
		p.Peers = append(p.Peers, pe)
		names[i] = pe.Name
	}
	for _, id := range p.shardIDs() {
		r := mesh.Replicas(id, names, rf)
		slices.Sort(r)
		p.Replicas[id] = r
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

func (p *placement) peerByReplica(id uint64) (peerEntry, bool) {
	for _, pe := range p.Peers {
		if pe.ReplicaID == id {
			return pe, true
		}
	}
	return peerEntry{}, false
}

// hosts reports whether peer name has a replica of shard.
func (p *placement) hosts(shard uint64, name string) bool {
	return slices.Contains(p.Replicas[shard], name)
}

// initialMembers is the dragonboat member map of shard: replica id -> NodeHostID.
func (p *placement) initialMembers(shard uint64) map[uint64]string {
	m := map[uint64]string{}
	for _, name := range p.Replicas[shard] {
		if pe, ok := p.peer(name); ok {
			m[pe.ReplicaID] = pe.NodeHostID
		}
	}
	return m
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
		for _, name := range p.Replicas[id] {
			if _, ok := p.peer(name); !ok {
				return fmt.Errorf("shard %d names unknown peer %q", id, name)
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
