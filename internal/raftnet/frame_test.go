package raftnet

import (
	"bytes"
	"errors"
	"testing"

	pb "github.com/lni/dragonboat/v4/raftpb"
)

func TestUnmarshalPanicIsBadFrame(t *testing.T) {
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("dragonboat's MessageBatch.Unmarshal no longer panics on this input; update the comment on unmarshal")
			}
		}()
		var b pb.MessageBatch
		b.Unmarshal(unmarshalPanics)
	}()
	var b pb.MessageBatch
	var fe *frameError
	if err := unmarshal(&b, kindBatch, unmarshalPanics); !errors.As(err, &fe) {
		t.Fatalf("unmarshal of the panicking input: %v, want a frame error", err)
	}
}

func TestParseHeader(t *testing.T) {
	const maxFrame = 4 << 20
	for _, c := range []struct {
		name string
		b    []byte
		ok   bool
	}{
		{"batch of 1 byte", dragonboatHeader(1), true},
		{"batch of MaxFrame", dragonboatHeader(maxFrame), true},
		{"MaxFrame+1", dragonboatHeader(maxFrame + 1), false},
		{"2^62", dragonboatHeader(1 << 62), false},
		{"empty", dragonboatHeader(0), false},
		{"bad magic", append([]byte{0xAE, 0x7E}, dragonboatHeader(1)[2:]...), false},
		{"bad checksum", func() []byte { b := dragonboatHeader(1); b[19] ^= 1; return b }(), false},
		{"unknown kind", func() []byte { b := frameOf(kindBatch, []byte{1}); b[3] = 101; return b }(), false},
	} {
		_, err := parseHeader(c.b, maxFrame)
		if (err == nil) != c.ok {
			t.Errorf("%s: %v, want ok %v", c.name, err, c.ok)
		}
	}
	if _, err := parseHeader(append(poison[:], make([]byte, headerSize)...), maxFrame); err != errPoison {
		t.Errorf("poison: %v", err)
	}
}

// FuzzDecodeFrame feeds arbitrary bytes to what a connection does with
// them: parse the header, read the body, unmarshal it. Nothing may
// panic, and the body buffer may never exceed twice the bytes that
// arrived plus firstPiece, whatever size the header claims.
func FuzzDecodeFrame(f *testing.F) {
	f.Add(frameOf(kindBatch, mustMarshalF(testBatch("p", 2))))
	f.Add(frameOf(kindBatch, unmarshalPanics))
	ch := testChunk(100)
	cb, _ := ch.Marshal()
	f.Add(frameOf(kindChunk, cb))
	f.Add(dragonboatHeader(1 << 62))
	f.Add(append(dragonboatHeader(DefaultMaxFrame), 1, 2, 3))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < frameHead {
			return
		}
		h, err := parseHeader(data, DefaultMaxFrame)
		if err != nil {
			return
		}
		rest := data[frameHead:]
		body, err := readBody(bytes.NewReader(rest), h, nil, false, func(int) error { return nil })
		if limit := 2*len(rest) + firstPiece; cap(body) > limit {
			t.Fatalf("header claims %d bytes, %d arrived: buffer of %d, above %d", h.size, len(rest), cap(body), limit)
		}
		if err != nil {
			return
		}
		switch h.kind {
		case kindBatch:
			var b pb.MessageBatch
			unmarshal(&b, h.kind, body)
		case kindChunk:
			var c pb.Chunk
			unmarshal(&c, h.kind, body)
		}
	})
}

func mustMarshalF(b pb.MessageBatch) []byte {
	body, err := b.Marshal()
	if err != nil {
		panic(err)
	}
	return body
}
