package layout

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// goldenV1 is a layout as the code before this package encoded it (the
// run of its random map order that happened to sort the shards): epoch 7
// of cluster 0x1234567890abcdef, 2 lock shards, RF 2, peers a, b
// (draining) and c, and a joining replica 7 of shard 2 on c. Data dirs and
// meta-shard logs hold bytes like these.
const goldenV1 = "0187a165cf0000000000000007a163cf1234567890abcdefa17302a16602a1709382a16ea161a168a46e682d6183a16ea162a168a46e682d62a164c382a16ea163a168a46e682d63a17883cf00000000000000019282a170a161a169cf000000000000000182a170a163a169cf0000000000000002cf00000000000000029382a170a161a169cf000000000000000382a170a162a169cf000000000000000483a170a163a169cf0000000000000007a16ac3cf00000000000000039282a170a161a169cf000000000000000582a170a163a169cf0000000000000006a16ecf0000000000000008"

// goldenLayout is what goldenV1 holds.
func goldenLayout() *Placement {
	return &Placement{
		Epoch: 7, ClusterID: 0x1234567890abcdef, Shards: 2, RF: 2,
		Peers: []Peer{{Name: "a", NodeHostID: "nh-a"}, {Name: "b", NodeHostID: "nh-b", Draining: true}, {Name: "c", NodeHostID: "nh-c"}},
		Replicas: map[uint64][]Replica{
			1: {{Peer: "a", ID: 1}, {Peer: "c", ID: 2}},
			2: {{Peer: "a", ID: 3}, {Peer: "b", ID: 4}, {Peer: "c", ID: 7, Join: true}},
			3: {{Peer: "a", ID: 5}, {Peer: "c", ID: 6}},
		},
		NextReplicaID: 8,
	}
}

func mustHex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A layout written before KeyScheme and Level existed decodes as scheme 0,
// level 0, and encodes back to the same bytes.
func TestDecodeGoldenV1(t *testing.T) {
	golden := mustHex(t, goldenV1)
	p, err := Decode(golden)
	if err != nil {
		t.Fatalf("Decode(golden v1): %v", err)
	}
	if want := goldenLayout(); !reflect.DeepEqual(p, want) {
		t.Fatalf("Decode(golden v1) =\n%+v\nwant\n%+v", p, want)
	}
	if p.KeyScheme != KeySchemeWhole || p.Level != 0 {
		t.Fatalf("old layout decoded with key scheme %d, level %d; want %d, 0", p.KeyScheme, p.Level, KeySchemeWhole)
	}
	b, err := Encode(p)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b, golden) {
		t.Fatalf("Encode(old layout) =\n%x\nwant the bytes it was decoded from\n%x", b, golden)
	}
}

// New lays out a cluster exactly as the code before this package did:
// v1Layout is what that code made of 5 peers, 16 shards and RF 3. The key
// scheme changes nothing but itself.
func TestNewMatchesV1(t *testing.T) {
	const v1Layout = "1:peer-2/1,peer-3/2,peer-5/3, 2:peer-1/4,peer-2/5,peer-5/6, 3:peer-2/7,peer-3/8,peer-4/9, " +
		"4:peer-1/10,peer-2/11,peer-3/12, 5:peer-1/13,peer-3/14,peer-4/15, 6:peer-1/16,peer-4/17,peer-5/18, " +
		"7:peer-2/19,peer-3/20,peer-4/21, 8:peer-3/22,peer-4/23,peer-5/24, 9:peer-2/25,peer-3/26,peer-5/27, " +
		"10:peer-2/28,peer-4/29,peer-5/30, 11:peer-1/31,peer-3/32,peer-5/33, 12:peer-1/34,peer-2/35,peer-4/36, " +
		"13:peer-2/37,peer-3/38,peer-5/39, 14:peer-2/40,peer-3/41,peer-5/42, 15:peer-1/43,peer-4/44,peer-5/45, " +
		"16:peer-3/46,peer-4/47,peer-5/48, 17:peer-1/49,peer-2/50,peer-4/51, next=52 epoch=1"
	peers, _, _ := testPeers(5)
	slices.Reverse(peers) // New sorts them
	for _, scheme := range []uint8{KeySchemeWhole, KeySchemeHashTag} {
		p := New(42, 16, 3, scheme, peers)
		var b strings.Builder
		for _, s := range p.ShardIDs() {
			fmt.Fprintf(&b, "%d:", s)
			for _, r := range p.Replicas[s] {
				fmt.Fprintf(&b, "%s/%d,", r.Peer, r.ID)
			}
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "next=%d epoch=%d", p.NextReplicaID, p.Epoch)
		if got := b.String(); got != v1Layout {
			t.Errorf("scheme %d: New(5 peers, 16 shards, RF 3) =\n%s\nwant\n%s", scheme, got, v1Layout)
		}
		if p.KeyScheme != scheme || p.ClusterID != 42 || p.Shards != 16 || p.RF != 3 || !slices.IsSortedFunc(p.Peers, func(a, b Peer) int { return strings.Compare(a.Name, b.Name) }) {
			t.Errorf("scheme %d: New made %+v", scheme, p)
		}
	}
}

// wire must stay Placement's twin: same fields, order and tags.
func TestWireMatchesPlacement(t *testing.T) {
	pt, wt := reflect.TypeFor[Placement](), reflect.TypeFor[wire]()
	if pt.NumField() != wt.NumField() {
		t.Fatalf("Placement has %d fields, wire %d", pt.NumField(), wt.NumField())
	}
	for i := range pt.NumField() {
		pf, wf := pt.Field(i), wt.Field(i)
		if pf.Name != wf.Name || pf.Tag != wf.Tag || pf.Type.Kind() != wf.Type.Kind() {
			t.Errorf("field %d: Placement has %s %s %q, wire %s %s %q", i, pf.Name, pf.Type, pf.Tag, wf.Name, wf.Type, wf.Tag)
		}
	}
}

func TestCodecRoundTrip(t *testing.T) {
	peers, _, _ := testPeers(4)
	for _, p := range []*Placement{
		goldenLayout(),
		New(9, 1, 1, KeySchemeWhole, peers[:1]),
		New(9, 16, 3, KeySchemeHashTag, peers),
		func() *Placement {
			p := New(9, 4, 3, KeySchemeHashTag, peers)
			p.Level = 3
			p.Peers[1].Draining = true
			p.AddReplica(3, "peer-4")
			return p
		}(),
	} {
		b, err := Encode(p)
		if err != nil {
			t.Fatal(err)
		}
		if b[0] != 1 {
			t.Fatalf("version byte %d, want 1", b[0])
		}
		q, err := Decode(b)
		if err != nil {
			t.Fatalf("Decode(Encode(%s)): %v", describe(p), err)
		}
		if !reflect.DeepEqual(p, q) {
			t.Fatalf("round trip changed the layout:\n%+v\n%+v", p, q)
		}
		// Canonical: the same layout always encodes to the same bytes.
		for range 20 {
			if c, _ := Encode(q.Clone()); !bytes.Equal(c, b) {
				t.Fatalf("two encodings of one layout differ:\n%x\n%x", b, c)
			}
		}
	}
}

// The new fields are written only when set, under their own tags.
func TestEncodeNewFields(t *testing.T) {
	p := goldenLayout()
	p.KeyScheme, p.Level = KeySchemeHashTag, 2
	b, err := Encode(p)
	if err != nil {
		t.Fatal(err)
	}
	// fixstr "k" then uint8 1; fixstr "l" then uint32 2, after the
	// fields of the golden layout, in a map of 9 fields instead of 7.
	for _, want := range []string{"0189", "a16bcc01a16cce00000002"} {
		if !strings.Contains(hex.EncodeToString(b), want) {
			t.Errorf("encoding %x lacks %s", b, want)
		}
	}
}

func TestDecodeRefuses(t *testing.T) {
	encode := func(change func(p *Placement)) []byte {
		p := goldenLayout()
		change(p)
		b, err := Encode(p)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	golden := mustHex(t, goldenV1)
	for _, c := range []struct {
		name string
		b    []byte
		want string
	}{
		{"empty", nil, "unknown version"},
		{"version 0", append([]byte{0}, golden[1:]...), "unknown version"},
		{"version 2", append([]byte{2}, golden[1:]...), "unknown version"},
		{"too large", append([]byte{1}, make([]byte, maxEncodedSize)...), "too large"},
		{"not msgpack", []byte{1, 0xc1}, "placement:"},
		{"truncated", golden[:len(golden)/2], "placement:"},
		// msgpack would allocate for these claims before reading on.
		{"4G peers in 4 bytes", []byte{1, 0x81, 0xa1, 'p', 0xdd, 0xff, 0xff, 0xff, 0xff}, "claims 4294967295 elements in 0 bytes"},
		{"1M replicas in 4 bytes", []byte{1, 0x81, 0xa1, 'x', 0x81, 0x01, 0xdd, 0x00, 0x10, 0x00, 0x00, 0xc0, 0xc0, 0xc0, 0xc0}, "claims 1048576 elements in 4 bytes"},
		{"4G map entries", []byte{1, 0xdf, 0xff, 0xff, 0xff, 0xff}, "claims 8589934590 elements"},
		{"a 4 GiB string", []byte{1, 0x81, 0xa1, 'p', 0x91, 0x81, 0xa1, 'n', 0xdb, 0xff, 0xff, 0xff, 0xff, 'a'}, "truncated"},
		{"nested 1000 deep", append(append([]byte{1, 0x81, 0xa1, 'z'}, bytes.Repeat([]byte{0x91}, 1000)...), 0xc0), "nest deeper than 32"},
		{"unused code", []byte{1, 0x81, 0xa1, 'e', 0xc1}, "invalid msgpack code 0xc1"},
		{"no cluster id", encode(func(p *Placement) { p.ClusterID = 0 }), "no cluster id"},
		{"no shards", encode(func(p *Placement) { p.Shards = 0 }), "0 shards"},
		{"too many shards", encode(func(p *Placement) { p.Shards = 4097 }), "4097 shards"},
		{"no peers", encode(func(p *Placement) { p.Peers = nil }), "no peers"},
		{"unknown key scheme", encode(func(p *Placement) { p.KeyScheme = 2 }), "key scheme 2, which this version does not know"},
		{"last key scheme", encode(func(p *Placement) { p.KeyScheme = 255 }), "key scheme 255"},
		{"shard without replicas", encode(func(p *Placement) { delete(p.Replicas, 3) }), "no replica for shard 3"},
		{"meta shard without replicas", encode(func(p *Placement) { p.Replicas[1] = nil }), "no replica for shard 1"},
		{"unknown peer", encode(func(p *Placement) { p.Replicas[2][0].Peer = "z" }), `shard 2 names unknown peer "z"`},
		{"replica id 0", encode(func(p *Placement) { p.Replicas[1][0].ID = 0 }), "replica id 0 outside [1, 8)"},
		{"replica id not given out", encode(func(p *Placement) { p.NextReplicaID = 7 }), "replica id 7 outside [1, 7)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := Decode(c.b)
			if err == nil {
				t.Fatalf("Decode accepted %+v", p)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Decode error %q does not say %q", err, c.want)
			}
		})
	}
}

// Decoding arbitrary bytes never panics; whatever decodes is valid and
// survives a round trip unchanged.
func FuzzDecode(f *testing.F) {
	golden := mustHex(f, goldenV1)
	f.Add(golden)
	peers, _, _ := testPeers(3)
	for _, scheme := range []uint8{KeySchemeWhole, KeySchemeHashTag, 7} {
		b, _ := Encode(New(3, 4, 2, scheme, peers))
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{1})
	f.Add([]byte{1, 0x80})
	f.Add([]byte{1, 0xdf, 0xff, 0xff, 0xff, 0xff})                  // map claiming 4G entries
	f.Add([]byte{1, 0x81, 0xa1, 'p', 0xdd, 0xff, 0xff, 0xff, 0xff}) // peers claiming 4G entries
	f.Add(golden[:40])
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := Decode(b)
		if err != nil {
			return
		}
		if err := p.validate(); err != nil {
			t.Fatalf("Decode returned an invalid layout: %v", err)
		}
		for _, key := range []string{"", "k", "{t}k"} {
			if s := p.ShardOf(key); s < FirstLockShard || s >= FirstLockShard+uint64(p.Shards) {
				t.Fatalf("ShardOf(%q) = %d on a decoded layout of %d shards", key, s, p.Shards)
			}
		}
		enc, err := Encode(p)
		if err != nil {
			t.Fatalf("Encode(decoded layout): %v", err)
		}
		q, err := Decode(enc)
		if err != nil {
			t.Fatalf("Decode(Encode(decoded layout)): %v", err)
		}
		if again, _ := Encode(q); !bytes.Equal(again, enc) {
			t.Fatalf("round trip changed the encoding:\n%x\n%x", enc, again)
		}
	})
}
