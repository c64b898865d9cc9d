package msgcheck

import (
	"runtime"
	"testing"

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
