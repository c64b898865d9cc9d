package layout

import (
	"strings"

	"github.com/lockmesh/lockmesh/internal/level"
)

// Key schemes: the rule by which a layout maps a key to its shard. A
// cluster's scheme is fixed when it is created and never changes, because
// a key must never move between shards: its fencing tokens come from its
// shard's counter, and two peers routing one key to two shards would grant
// it twice.
const (
	// KeySchemeWhole hashes the whole key: the rule of every cluster
	// created before hash tags, and what a layout without a KeyScheme
	// field decodes as.
	KeySchemeWhole uint8 = 0
	// KeySchemeHashTag hashes only a key's hash tag when it has one
	// (Redis Cluster's rule): if the key contains '{' and a '}' follows
	// it with at least one byte between, only the bytes between the first
	// '{' and the first '}' after it are hashed, so "{order-42}/items" and
	// "{order-42}/payment" share a shard. A key without a tag, or with an
	// empty one ("{}x"), is hashed whole.
	KeySchemeHashTag uint8 = 1
)

// ShardOf maps key to its lock shard: FNV-64a of the bytes p's KeyScheme
// hashes, modulo Shards, from FirstLockShard. The answer depends only on
// the key, KeyScheme and Shards, which never change for a cluster. p must
// be valid, as Decode and New make it; for a KeyScheme this version does
// not know ShardOf returns 0, which is no shard, rather than guess.
func (p *Placement) ShardOf(key string) uint64 {
	switch p.KeyScheme {
	case KeySchemeWhole:
	case KeySchemeHashTag:
		key = hashTag(key)
	default:
		return 0
	}
	return FirstLockShard + fnv64a(key)%uint64(p.Shards)
}

// hashTag returns the bytes of key that KeySchemeHashTag hashes: the tag
// between the first '{' and the first '}' after it if that is not empty,
// else the whole key.
func hashTag(key string) string {
	open := strings.IndexByte(key, '{')
	if open < 0 {
		return key
	}
	end := strings.IndexByte(key[open+1:], '}')
	if end <= 0 {
		return key
	}
	return key[open+1 : open+1+end]
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

// KeySchemeFor is the key scheme a new cluster at l uses: hash tags from
// level 2 on. Peers of level 1 (releases before levels) hash whole keys and
// ignore the scheme field, so a cluster they may serve must hash whole
// keys for ever.
func KeySchemeFor(l level.Level) uint8 {
	if l.HashesTags() {
		return KeySchemeHashTag
	}
	return KeySchemeWhole
}

// PrefixShard maps every key that starts with prefix to its shard, and
// reports false when they may lie on several: only a prefix that holds a
// whole hash tag ("{order-42}/", "{order-42}") under KeySchemeHashTag
// fixes the shard of every key that extends it.
func (p *Placement) PrefixShard(prefix string) (uint64, bool) {
	if p.KeyScheme != KeySchemeHashTag || hashTag(prefix) == prefix {
		return 0, false
	}
	return p.ShardOf(prefix), true
}
