package layout

import (
	"fmt"
	"hash/fnv"
	"testing"
)

// Every existing cluster routes keys by this rule: these numbers were
// computed with the code before this package, and must never change.
func TestShardOfPinned(t *testing.T) {
	for _, c := range []struct {
		shards int
		key    string
		shard  uint64
	}{
		{1, "", 2}, {1, "invoice/42", 2}, {1, "{order-42}/items", 2},
		{16, "", 7},
		{16, "a", 14},
		{16, "invoice/42", 13},
		{16, "{order-42}/items", 11},
		{16, "{order-42}/payment", 5},
		{16, "order-42", 6},
		{16, "{}x", 9},
		{16, "日本{語}", 15},
		{64, "", 39},
		{64, "a", 14},
		{64, "invoice/42", 13},
		{64, "{order-42}/items", 27},
		{64, "{order-42}/payment", 53},
		{64, "order-42", 22},
		{64, "{}x", 9},
		{64, "日本{語}", 31},
	} {
		p := &Placement{Shards: c.shards}
		if got := p.ShardOf(c.key); got != c.shard {
			t.Errorf("%d shards: ShardOf(%q) = %d, want %d", c.shards, c.key, got, c.shard)
		}
	}
}

// Every key lands in a lock shard, never in the meta shard or past the last.
func TestShardOfRange(t *testing.T) {
	for _, shards := range []int{1, 2, 16, 4096} {
		p := &Placement{Shards: shards}
		for i := range 2000 {
			key := fmt.Sprintf("{k%d}/%d", i%97, i)
			if s := p.ShardOf(key); s < FirstLockShard || s >= FirstLockShard+uint64(shards) {
				t.Fatalf("%d shards: ShardOf(%q) = %d, outside [%d, %d)", shards, key, s, FirstLockShard, FirstLockShard+uint64(shards))
			}
		}
	}
}

// fnv64a is the standard library's FNV-64a, without the copy.
func TestFNV64a(t *testing.T) {
	for _, s := range []string{"", "a", "invoice/42", "日本", "\x00\xff", string(make([]byte, 300))} {
		h := fnv.New64a()
		h.Write([]byte(s))
		if got, want := fnv64a(s), h.Sum64(); got != want {
			t.Errorf("fnv64a(%q) = %#x, want %#x", s, got, want)
		}
	}
}
