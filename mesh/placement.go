package mesh

import (
	"cmp"
	"hash/fnv"
	"slices"
)

// Replicas returns the rf peers (by name) that should host shardID, chosen
// by rendezvous (highest random weight) hashing and ordered by weight,
// highest first. The result depends only on shardID, rf and the set of
// names: input order and duplicates do not matter. rf larger than the
// number of distinct peers returns them all; rf <= 0 returns nil.
//
// Adding a peer changes a shard's replicas only when the new peer is among
// them (it then displaces the lowest-weighted one); removing a peer changes
// only the shards it hosted. Replicas never mutates peers.
func Replicas(shardID uint64, peers []string, rf int) []string {
	if rf <= 0 || len(peers) == 0 {
		return nil
	}
	type weighted struct {
		name   string
		weight uint64
	}
	shardKey := mix64(shardID ^ 0x9e3779b97f4a7c15)
	ws := make([]weighted, 0, len(peers))
	for _, p := range peers {
		ws = append(ws, weighted{name: p, weight: mix64(peerHash(p) ^ shardKey)})
	}
	slices.SortFunc(ws, func(a, b weighted) int {
		if c := cmp.Compare(b.weight, a.weight); c != 0 {
			return c
		}
		return cmp.Compare(a.name, b.name)
	})
	ws = slices.CompactFunc(ws, func(a, b weighted) bool { return a.name == b.name })
	out := make([]string, 0, min(rf, len(ws)))
	for _, w := range ws[:min(rf, len(ws))] {
		out = append(out, w.name)
	}
	return out
}

// peerHash hashes a peer name; mix64 then spreads its bits, because FNV
// alone leaves names that differ in one trailing digit too correlated.
func peerHash(name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return mix64(h.Sum64())
}

// mix64 is the splitmix64 finalizer, a bijection with full avalanche.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
