package mesh

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func TestMetaRoundTrip(t *testing.T) {
	long := strings.Repeat("x", MaxMetaStringLen)
	for _, m := range []Meta{
		{},
		{NodeHostID: "3f2a1c9e-8d7b-4c6a-9e5f-1b2c3d4e5f60", RaftAddr: "10.0.0.5:7947", RPCAddr: "10.0.0.5:7948", MaxLevel: 1, Cluster: 42},
		{MaxLevel: 255, Cluster: ^uint64(0)},
		{NodeHostID: long, RaftAddr: "a:1", RPCAddr: "b:2"},
	} {
		b, err := EncodeMeta(m)
		if err != nil {
			t.Fatalf("EncodeMeta(%+v): %v", m, err)
		}
		if len(b) > MaxMetaSize {
			t.Fatalf("EncodeMeta(%+v) is %d bytes, over %d", m, len(b), MaxMetaSize)
		}
		got, err := DecodeMeta(b)
		if err != nil {
			t.Fatalf("DecodeMeta(EncodeMeta(%+v)): %v", m, err)
		}
		if got != m {
			t.Fatalf("round trip: got %+v, want %+v", got, m)
		}
		again, _ := EncodeMeta(got)
		if !bytes.Equal(again, b) {
			t.Fatalf("encoding is not deterministic: %x vs %x", again, b)
		}
	}
}

func TestEncodeMetaTooLarge(t *testing.T) {
	long := strings.Repeat("x", MaxMetaStringLen)
	for _, m := range []Meta{
		{NodeHostID: long + "x"},
		{RPCAddr: strings.Repeat("y", 1000)},
		{NodeHostID: long, RaftAddr: long, RPCAddr: long}, // each fits, total does not
	} {
		if _, err := EncodeMeta(m); !errors.Is(err, ErrMetaTooLarge) {
			t.Fatalf("EncodeMeta with %d/%d/%d byte strings: err %v, want ErrMetaTooLarge",
				len(m.NodeHostID), len(m.RaftAddr), len(m.RPCAddr), err)
		}
	}
}

// rawMeta builds a format-1 payload from arbitrary msgpack values.
func rawMeta(t testing.TB, fields ...any) []byte {
	t.Helper()
	var buf bytes.Buffer
	buf.WriteByte(metaFormatV1)
	enc := msgpack.NewEncoder(&buf)
	if err := enc.EncodeArrayLen(len(fields)); err != nil {
		t.Fatal(err)
	}
	for _, f := range fields {
		if err := enc.Encode(f); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

func TestDecodeMetaForwardCompatible(t *testing.T) {
	b := rawMeta(t, "id", "r:1", "p:2", 3, 7, true, true, 2, "a field from the future", []int{1, 2})
	got, err := DecodeMeta(b)
	if err != nil {
		t.Fatalf("DecodeMeta with appended fields: %v", err)
	}
	if want := (Meta{NodeHostID: "id", RaftAddr: "r:1", RPCAddr: "p:2", MaxLevel: 3, MinLevel: 2, Cluster: 7, NoReplicas: true, JoinOnly: true}); got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}

// Metadata from a peer that predates the JoinOnly field has six fields.
func TestDecodeMetaSixFields(t *testing.T) {
	got, err := DecodeMeta(rawMeta(t, "id", "r:1", "p:2", 3, 7, true))
	if err != nil {
		t.Fatal(err)
	}
	if want := (Meta{NodeHostID: "id", RaftAddr: "r:1", RPCAddr: "p:2", MaxLevel: 3, MinLevel: 3, Cluster: 7, NoReplicas: true}); got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}

// Metadata from a peer that predates the NoReplicas field has five fields.
func TestDecodeMetaFiveFields(t *testing.T) {
	got, err := DecodeMeta(rawMeta(t, "id", "r:1", "p:2", 3, 7))
	if err != nil {
		t.Fatal(err)
	}
	if want := (Meta{NodeHostID: "id", RaftAddr: "r:1", RPCAddr: "p:2", MaxLevel: 3, MinLevel: 3, Cluster: 7}); got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}

func TestDecodeMetaRejectsGarbage(t *testing.T) {
	good, err := EncodeMeta(Meta{NodeHostID: "id", RaftAddr: "r:1", RPCAddr: "p:2", MaxLevel: 1, Cluster: 9})
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		in   []byte
		want error
	}{
		"nil":              {nil, ErrBadMeta},
		"version only":     {[]byte{metaFormatV1}, ErrBadMeta},
		"unknown version":  {append([]byte{2}, good[1:]...), ErrBadMeta},
		"trailing byte":    {append(bytes.Clone(good), 0), ErrBadMeta},
		"oversized":        {make([]byte, MaxMetaSize+1), ErrMetaTooLarge},
		"too few fields":   {rawMeta(t, "id", "r:1", "p:2", 1), ErrBadMeta},
		"huge array":       {[]byte{metaFormatV1, 0xdd, 0xff, 0xff, 0xff, 0xff}, ErrBadMeta},
		"int for string":   {rawMeta(t, 1, "r:1", "p:2", 1, 1), ErrBadMeta},
		"str32 claim":      {[]byte{metaFormatV1, 0x95, 0xdb, 0xff, 0xff, 0xff, 0xff}, ErrBadMeta},
		"bin for string":   {rawMeta(t, []byte("id"), "r:1", "p:2", 1, 1), ErrBadMeta},
		"negative version": {rawMeta(t, "id", "r:1", "p:2", -1, 1), ErrBadMeta},
		"version > 255":    {rawMeta(t, "id", "r:1", "p:2", 256, 1), ErrBadMeta},
		"float cluster":    {rawMeta(t, "id", "r:1", "p:2", 1, 1.5), ErrBadMeta},
		"map not array":    {[]byte{metaFormatV1, 0x80}, ErrBadMeta},
	}
	for i := 1; i < len(good); i++ {
		cases[fmt.Sprintf("truncated to %d bytes", i)] = struct {
			in   []byte
			want error
		}{good[:i], ErrBadMeta}
	}
	for name, c := range cases {
		if _, err := DecodeMeta(c.in); !errors.Is(err, c.want) {
			t.Errorf("%s: DecodeMeta(%x) err = %v, want %v", name, c.in, err, c.want)
		}
	}
}

// FuzzDecodeMeta checks that DecodeMeta never panics and that whatever it
// accepts re-encodes to something that decodes to the same Meta.
func FuzzDecodeMeta(f *testing.F) {
	for _, m := range []Meta{{}, {NodeHostID: "id", RaftAddr: "127.0.0.1:1", RPCAddr: "127.0.0.1:2", MaxLevel: 1, Cluster: 1 << 40}} {
		b, err := EncodeMeta(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add(rawMeta(f, "id", "r", "p", 1, 2, map[string]int{"x": 1}))
	f.Add([]byte{metaFormatV1, 0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeMeta(b)
		if err != nil {
			return
		}
		enc, err := EncodeMeta(m)
		if err != nil {
			t.Fatalf("decoded %+v from %x but cannot re-encode it: %v", m, b, err)
		}
		again, err := DecodeMeta(enc)
		if err != nil || again != m {
			t.Fatalf("re-encoded %+v does not round trip: %+v, %v", m, again, err)
		}
	})
}
