package msgcheck

import (
	"runtime"
	"testing"
	"unsafe"

	"github.com/vmihailenco/msgpack/v5"
)

func TestShapeRefusesClaimsBeyondTheInput(t *testing.T) {
	bad := map[string][]byte{
		"array32 of 4G":    {0xdd, 0xff, 0xff, 0xff, 0xff},
		"map32 of 4G":      {0xdf, 0xff, 0xff, 0xff, 0xff},
		"bin32 of 4GB":     {0xc6, 0xff, 0xff, 0xff, 0xff, 0x00},
		"str32 of 4GB":     {0xdb, 0xff, 0xff, 0xff, 0xff, 0x00},
		"field with 4G":    {0x81, 0xa1, 'i', 0xdd, 0xff, 0xff, 0xff, 0xff},
		"truncated":        {0x92, 0x01},
		"empty":            {},
		"invalid code":     {0xc1},
		"nested too deep":  append(repeat(0x91, MaxDepth+2), 0x01),
		"short fixstr":     {0xa5, 'a'},
		"ext32 too long":   {0xc9, 0x7f, 0xff, 0xff, 0xff, 0x01},
		"fixext16 truncd":  {0xd8, 0x01, 0x00},
		"map16 odd claims": {0xde, 0x00, 0x03, 0x01, 0x01},
		// msgpack reads an extension's payload as the map it decodes:
		// here a map whose one value claims 3.7G elements.
		"fixext before a map": {0x81, 0xa1, 'x', 0xd5, 0x30, 0x81, 0xcd, 0xbd, 0xc6, 0xdd, 0xdd, 0xdd, 0x7e, 0xcc},
		"ext32 around a map":  {0xc9, 0x00, 0x00, 0x00, 0x09, 0x30, 0x81, 0xcd, 0xbd, 0xc6, 0xdd, 0xdd, 0xdd, 0x7e, 0xcc},
	}
	for name, b := range bad {
		if err := Shape(b); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	good := []any{
		map[string]any{"i": []uint64{1, 2, 3}, "s": "x", "b": []byte{1}},
		[]any{nil, true, false, -1, 1.5, uint64(1 << 40)},
		"",
	}
	for _, v := range good {
		b, err := msgpack.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := Shape(b); err != nil {
			t.Errorf("%v: %v", v, err)
		}
	}
}

// The reason for Shape: msgpack sizes a slice by the length the input
// claims. After Shape accepts, decoding allocates little.
func TestShapeBoundsWhatMsgpackAllocates(t *testing.T) {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for _, b := range [][]byte{{0x81, 0xa1, 'i', 0xdd, 0x00, 0xff, 0xff, 0xff}, {0xdd, 0x00, 0x10, 0x00, 0x00}} {
		if Shape(b) == nil {
			var v struct {
				I []uint64 `msgpack:"i"`
			}
			_ = msgpack.Unmarshal(b, &v)
		}
	}
	runtime.ReadMemStats(&after)
	if d := after.TotalAlloc - before.TotalAlloc; d > 1<<20 {
		t.Fatalf("decoding hostile input allocated %d bytes", d)
	}
}

func repeat(c byte, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = c
	}
	return b
}

// FuzzShape: Shape never panics, and what it accepts msgpack decodes
// without allocating more than a small multiple of the input.
func FuzzShape(f *testing.F) {
	f.Add([]byte{0x81, 0xa1, 'i', 0x93, 0x01, 0x02, 0x03})
	f.Add([]byte{0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		if Shape(b) != nil {
			return
		}
		var v any
		_ = msgpack.Unmarshal(b, &v)
	})
}

// record is a Go value of the size lockmesh's messages decode into.
type record struct {
	Shard, Session, Token, Expiry uint64
	Key, Owner                    string
	Data                          []byte
}

// nilArray is a msgpack array of n nils: one byte on the wire for each
// element, a whole record once decoded into []record.
func nilArray(n int) []byte {
	b := []byte{0xdd, byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}
	return append(b, repeat(0xc0, n)...)
}

// Unmarshal bounds what decoding allocates, not only the bytes read: a
// body within the size limit whose elements each decode into a record is
// refused before msgpack allocates them.
func TestUnmarshalBoundsDecodedSize(t *testing.T) {
	b := nilArray(MaxBody - 5)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var v []record
	err := Unmarshal(b, &v, MaxBody)
	runtime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("%d-byte array of %d nils into []record (%d bytes each): err %v, allocated %.1f MiB",
		len(b), MaxBody-5, unsafe.Sizeof(record{}), err, float64(alloc)/(1<<20))
	if err == nil {
		t.Errorf("accepted: decoded %d records", len(v))
	}
	if alloc > 1<<20 {
		t.Errorf("decoding allocated %d MiB, want < 1 MiB", alloc>>20)
	}
}

// The decoded estimate charges each element by what it can decode into,
// so the same wire size passes or fails by the target type and the budget.
func TestShapeWithinChargesElements(t *testing.T) {
	for _, tc := range []struct {
		name     string
		b        []byte
		elemCost int
		budget   int
		ok       bool
	}{
		{"1000 nils at 64 within 64000", nilArray(1000), 64, 64000, true},
		{"1000 nils at 64 over 63999", nilArray(1000), 64, 63999, false},
		{"nested arrays count every level", []byte{0x92, 0x92, 0xc0, 0xc0, 0x91, 0xc0}, 10, 49, false},
		{"nested arrays within", []byte{0x92, 0x92, 0xc0, 0xc0, 0x91, 0xc0}, 10, 50, true},
		{"strings count their bytes", append([]byte{0x91, 0xa5}, "hello"...), 10, 14, false},
		{"huge elemCost does not overflow", nilArray(16), 1 << 62, 1 << 20, false},
		{"default Shape: 300k nils", nilArray(300_000), ElemCost, DecodedFactor * MaxBody, false},
		{"default Shape: 200k nils", nilArray(200_000), ElemCost, DecodedFactor * MaxBody, true},
	} {
		if err := ShapeWithin(tc.b, tc.elemCost, tc.budget); (err == nil) != tc.ok {
			t.Errorf("%s: ShapeWithin = %v, want ok %v", tc.name, err, tc.ok)
		}
	}
	if err := Shape(nilArray(300_000)); err == nil {
		t.Errorf("Shape accepted 300k nils: %d MiB at ElemCost", 300_000*ElemCost>>20)
	}

	// Unmarshal charges by the target: 200k nils fit a []uint64 (16
	// bytes each) but not a []record (88 bytes each, 17 MiB in all).
	nils := nilArray(200_000)
	var u []uint64
	if err := Unmarshal(nils, &u, MaxBody); err != nil || len(u) != 200_000 {
		t.Errorf("200k nils into []uint64: %v (%d decoded)", err, len(u))
	}
	var r []record
	if err := Unmarshal(nils, &r, MaxBody); err == nil {
		t.Errorf("200k nils into []record accepted: %d MiB decoded", len(r)*int(unsafe.Sizeof(record{}))>>20)
	}
}
