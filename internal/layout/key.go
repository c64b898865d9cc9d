package layout

// ShardOf maps key to its lock shard: FNV-64a of the key's bytes, modulo
// Shards, from FirstLockShard. The answer depends only on the key and
// Shards, which never change for a cluster: keys never move between
// shards. p must be valid, as Decode and New make it.
func (p *Placement) ShardOf(key string) uint64 {
	return FirstLockShard + fnv64a(key)%uint64(p.Shards)
}

// fnv64a is FNV-1a, 64 bits (as hash/fnv's New64a), over the bytes of s
// without copying them.
func fnv64a(s string) uint64 {
	const (
		offset64 = 14695981039346656037
		prime64  = 1099511628211
	)
	h := uint64(offset64)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= prime64
	}
	return h
}
