package transport_test

import (
	"bytes"
	"errors"
	"math"
	"runtime"
	"testing"

	"github.com/lockmesh/lockmesh/transport"
)

func TestFrameRoundTrip(t *testing.T) {
	for _, f := range []transport.Frame{
		{Kind: transport.KindRequest, Payload: []byte{}},
		{Kind: transport.KindRequest, ID: math.MaxUint64, Method: math.MaxUint8, Payload: bytes.Repeat([]byte("p"), 70_000)},
		{Kind: transport.KindResponse, ID: 300, Method: 4, Code: math.MaxUint16, Message: "not leader", Payload: []byte{}},
	} {
		b := encode(t, f)
		got, err := transport.ReadFrame(bytes.NewReader(b), 0)
		if err != nil {
			t.Fatalf("ReadFrame(EncodeFrame(%+v)): %v", f.ID, err)
		}
		if got.Kind != f.Kind || got.ID != f.ID || got.Method != f.Method || got.Code != f.Code ||
			got.Message != f.Message || !bytes.Equal(got.Payload, f.Payload) {
			t.Fatalf("round trip of frame %d changed it", f.ID)
		}
	}
}

func TestEncodeFrameTooLarge(t *testing.T) {
	f := transport.Frame{Kind: transport.KindRequest, Payload: make([]byte, 1000)}
	if _, err := transport.EncodeFrame(nil, &f, 1000); !errors.Is(err, transport.ErrFrameTooLarge) {
		t.Fatalf("EncodeFrame over the limit = %v, want ErrFrameTooLarge", err)
	}
	if _, err := transport.EncodeFrame(nil, &f, 1010); err != nil {
		t.Fatalf("EncodeFrame within the limit: %v", err)
	}
}

// hostileBodies claim far more than they hold.
var hostileBodies = [][]byte{
	{1, 0xdd, 0x80, 0, 0, 0},                                     // array of 2^31 elements
	{1, 0xdd, 0xff, 0xff, 0xff, 0xff},                            // array of 2^32-1 elements
	{1, 0x96, 1, 1, 0, 0, 0xdb, 0xff, 0xff, 0xff, 0xff},          // str of 4 GB
	{1, 0x96, 1, 1, 0, 0, 0xa0, 0xc6, 0xff, 0xff, 0xff, 0xff, 0}, // bin of 4 GB
	{1, 0x96, 1, 1, 0, 0, 0xa0, 0xc5, 0xff, 0xff, 1},             // bin of 64 KB
	{1, 0x96, 1, 0xcf, 0xff},                                     // truncated uint64
	{1, 0x96, 0xff, 1, 0, 0, 0xa0, 0xc4, 0},                      // negative kind
	{1, 0x96, 1, 1, 0xcd, 1, 0, 0, 0xa0, 0xc4, 0},                // method 256
	{1, 0x96, 1, 1, 0, 0, 0xc4, 0, 0xc4, 0},                      // message as bin
	{1, 0x96, 1, 1, 0, 0, 0xa0, 0xa0},                            // payload as str
	{1, 0x96, 1, 1, 0, 0, 0xa0, 0xc0},                            // payload nil
	{1, 0x96, 1, 1, 0, 0xca, 0, 0, 0, 0, 0xa0, 0xc4, 0},          // float code
	{1},
	{},
}

func TestDecodeFrameRejectsHostileBodies(t *testing.T) {
	for _, b := range hostileBodies {
		if _, err := transport.DecodeFrame(b); err == nil {
			t.Errorf("DecodeFrame(% x) succeeded", b)
		}
	}
	// Bounded allocation: decoding every hostile body 100 times must not
	// come near the sizes they claim.
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range 100 {
		for _, b := range hostileBodies {
			transport.DecodeFrame(b)
		}
	}
	runtime.ReadMemStats(&after)
	if n := after.TotalAlloc - before.TotalAlloc; n > 4<<20 {
		t.Fatalf("decoding hostile bodies allocated %d bytes", n)
	}
}

func TestReadFrameBoundsAllocation(t *testing.T) {
	// A prefix announcing 1 GB followed by 10 bytes must fail without
	// allocating anything near 1 GB even when the limit allows it.
	data := append([]byte{0x40, 0, 0, 0}, make([]byte, 10)...)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := transport.ReadFrame(bytes.NewReader(data), 1<<30)
	runtime.ReadMemStats(&after)
	if err == nil {
		t.Fatal("ReadFrame of a truncated frame succeeded")
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 {
		t.Fatalf("ReadFrame allocated %d bytes for a 10-byte body", n)
	}
	if _, err := transport.ReadFrame(bytes.NewReader(data), 1024); !errors.Is(err, transport.ErrFrameTooLarge) {
		t.Fatalf("ReadFrame over the limit = %v, want ErrFrameTooLarge", err)
	}
}

func FuzzDecodeFrame(f *testing.F) {
	for _, b := range hostileBodies {
		f.Add(b)
	}
	for _, fr := range []transport.Frame{
		{Kind: transport.KindRequest, ID: 1, Method: 2, Payload: []byte("body")},
		{Kind: transport.KindResponse, ID: 1 << 40, Code: 100, Message: "locked", Payload: []byte{}},
	} {
		b := encode(f, fr)
		f.Add(b[4:])
		f.Add(b) // with its prefix: exercises ReadFrame
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		// ReadFrame with a small cap must never panic either.
		transport.ReadFrame(bytes.NewReader(data), 256)

		fr, err := transport.DecodeFrame(data)
		if err != nil {
			return
		}
		// Whatever decodes must re-encode to something that decodes the same.
		b, err := transport.EncodeFrame(nil, &fr, len(data)+32)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		fr2, err := transport.DecodeFrame(b[4:])
		if err != nil {
			t.Fatalf("decode re-encoded frame: %v", err)
		}
		if fr.Kind != fr2.Kind || fr.ID != fr2.ID || fr.Method != fr2.Method || fr.Code != fr2.Code ||
			fr.Message != fr2.Message || !bytes.Equal(fr.Payload, fr2.Payload) {
			t.Fatalf("re-encoding changed the frame: %+v vs %+v", fr, fr2)
		}
		if len(b)-4 > len(data) {
			t.Fatalf("re-encoded frame is %d bytes, longer than the %d decoded (not shortest form)", len(b)-4, len(data))
		}
	})
}
