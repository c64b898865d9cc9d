package layout

import (
	"fmt"
	"hash/fnv"
	"testing"
)

func TestHashTag(t *testing.T) {
	for _, c := range []struct{ key, hashed string }{
		{"", ""},
		{"invoice/42", "invoice/42"},
		{"{order-42}/items", "order-42"},
		{"{order-42}/payment", "order-42"},
		{"user:{1000}:name", "1000"},
		{"{}", "{}"},       // empty tag: the whole key
		{"{}x", "{}x"},     // likewise
		{"{}{a}", "{}{a}"}, // the first '}' after the first '{' closes an empty tag
		{"{", "{"},         // no closing brace
		{"}", "}"},         // no opening brace
		{"a{b", "a{b"},     // no closing brace
		{"a}b{c", "a}b{c"}, // the only '}' comes before the '{'
		{"}{a}", "a"},      // a '}' before the first '{' does not count
		{"a{b}c{d}", "b"},  // only the first tag
		{"{{a}}", "{a"},    // the tag runs from the first '{' to the first '}'
		{"{a}b}", "a"},     // a later '}' does not count
		{"x{日本}y", "日本"},   // multi-byte UTF-8 tags are bytes like any other
		{"{é}1", "é"},
		{"{\x00}", "\x00"},  // any byte, even NUL
		{"pre{ }post", " "}, // one space is a tag
		{"{tag}", "tag"},    // a key that is only a tag
		{"no braces at all", "no braces at all"},
	} {
		if got := hashTag(c.key); got != c.hashed {
			t.Errorf("hashTag(%q) = %q, want %q", c.key, got, c.hashed)
		}
	}
}

// Scheme 0 is the rule every existing cluster routes by: these numbers were
// computed with the code before hash tags, and must never change.
func TestShardOfWholeKeyPinned(t *testing.T) {
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
		p := &Placement{Shards: c.shards} // KeyScheme 0, as every layout written before it existed decodes
		if got := p.ShardOf(c.key); got != c.shard {
			t.Errorf("scheme 0, %d shards: ShardOf(%q) = %d, want %d", c.shards, c.key, got, c.shard)
		}
	}
}

// Under KeySchemeHashTag a key lands where scheme 0 puts the bytes it
// hashes: its tag, or the whole key when it has none.
func TestShardOfHashTag(t *testing.T) {
	for _, shards := range []int{1, 3, 16, 64, 4096} {
		whole := &Placement{Shards: shards, KeyScheme: KeySchemeWhole}
		tagged := &Placement{Shards: shards, KeyScheme: KeySchemeHashTag}
		for _, c := range []struct{ key, hashed string }{
			{"", ""},
			{"invoice/42", "invoice/42"},
			{"{order-42}/items", "order-42"},
			{"{order-42}/payment", "order-42"},
			{"{}", "{}"},
			{"{}x", "{}x"},
			{"{", "{"},
			{"}{a}", "a"},
			{"a{b}c{d}", "b"},
			{"x{日本}y", "日本"},
		} {
			if got, want := tagged.ShardOf(c.key), whole.ShardOf(c.hashed); got != want {
				t.Errorf("%d shards: ShardOf(%q) = %d, want %d (the shard of %q)", shards, c.key, got, want, c.hashed)
			}
		}
		// Related keys share a shard whatever follows the tag.
		want := tagged.ShardOf("{order-42}")
		for i := range 50 {
			key := fmt.Sprintf("{order-42}/line/%d", i)
			if got := tagged.ShardOf(key); got != want {
				t.Fatalf("%d shards: ShardOf(%q) = %d, want %d, the shard of its tag", shards, key, got, want)
			}
		}
	}
	// Pinned, so a change to the tag rule is caught.
	p := &Placement{Shards: 16, KeyScheme: KeySchemeHashTag}
	for key, want := range map[string]uint64{
		"{order-42}/items":   6,
		"{order-42}/payment": 6,
		"invoice/42":         13,
		"{}x":                9,
		"a{b}c{d}":           7, // the shard of "b"
	} {
		if got := p.ShardOf(key); got != want {
			t.Errorf("scheme 1, 16 shards: ShardOf(%q) = %d, want %d", key, got, want)
		}
	}
}

// Every key lands in a lock shard, never in the meta shard or past the last.
func TestShardOfRange(t *testing.T) {
	for _, scheme := range []uint8{KeySchemeWhole, KeySchemeHashTag} {
		for _, shards := range []int{1, 2, 16, 4096} {
			p := &Placement{Shards: shards, KeyScheme: scheme}
			for i := range 2000 {
				key := fmt.Sprintf("{k%d}/%d", i%97, i)
				if s := p.ShardOf(key); s < FirstLockShard || s >= FirstLockShard+uint64(shards) {
					t.Fatalf("scheme %d, %d shards: ShardOf(%q) = %d, outside [%d, %d)", scheme, shards, key, s, FirstLockShard, FirstLockShard+uint64(shards))
				}
			}
		}
	}
}

// A scheme this version does not know routes nowhere rather than guess.
func TestShardOfUnknownScheme(t *testing.T) {
	p := &Placement{Shards: 16, KeyScheme: 2}
	if got := p.ShardOf("{a}b"); got != 0 {
		t.Fatalf("ShardOf under unknown scheme 2 = %d, want 0 (no shard)", got)
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

// Only a prefix that holds a whole hash tag fixes the shard of every key
// that extends it, and only under hash tags.
func TestPrefixShard(t *testing.T) {
	peers := []Peer{{Name: "a"}, {Name: "b"}, {Name: "c"}}
	tagged, whole := New(1, 16, 3, KeySchemeHashTag, peers), New(1, 16, 3, KeySchemeWhole, peers)
	for _, tc := range []struct {
		prefix string
		ok     bool
	}{{"{o-1}/", true}, {"{o-1}", true}, {"x{o-1}", true}, {"{o-1", false}, {"{}", false}, {"orders/", false}} {
		shard, ok := tagged.PrefixShard(tc.prefix)
		if ok != tc.ok {
			t.Errorf("PrefixShard(%q) ok=%v, want %v", tc.prefix, ok, tc.ok)
		}
		if ok && (shard != tagged.ShardOf(tc.prefix+"rest") || shard != tagged.ShardOf(tc.prefix)) {
			t.Errorf("PrefixShard(%q) = %d, its keys' shard is %d", tc.prefix, shard, tagged.ShardOf(tc.prefix+"rest"))
		}
		if _, ok := whole.PrefixShard(tc.prefix); ok {
			t.Errorf("PrefixShard(%q) under whole-key hashing: ok", tc.prefix)
		}
	}
}
