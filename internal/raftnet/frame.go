package raftnet

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"unsafe"

	pb "github.com/lni/dragonboat/v4/raftpb"
)

// The wire format is dragonboat's own (internal/transport/tcp.go), so that
// peers of this release and of the previous one, which ran dragonboat's
// TCP transport, exchange Raft messages during a rolling upgrade. What
// changes is the reading: the size is checked against MaxFrame before
// anything is allocated, and the body is read into a buffer grown as its
// bytes arrive.
//
// A frame is
//
//	magic   2 bytes  0xAE 0x7D
//	kind    2 bytes  big-endian: 100 message batch, 200 snapshot chunk
//	size    8 bytes  big-endian length of the body
//	hcrc    4 bytes  CRC-32 (IEEE) of these 18 header bytes with hcrc zero
//	bcrc    4 bytes  CRC-32 (IEEE) of the body; 0 and unchecked under TLS,
//	                 which already protects the body
//	body    size bytes: a marshaled pb.MessageBatch or pb.Chunk
//
// A sender may end a snapshot connection with the two bytes 0x00 0x00
// (dragonboat's "poison") in place of a magic; the receiver answers them
// with the same two bytes and closes. dragonboat's sender waits for that
// answer before closing with SO_LINGER 0.
const (
	magicSize  = 2
	headerSize = 18
	frameHead  = magicSize + headerSize
)

var (
	magic  = [magicSize]byte{0xAE, 0x7D}
	poison = [magicSize]byte{0x00, 0x00}
)

// frameKind says what a frame's body is.
type frameKind uint16

const (
	kindBatch frameKind = 100 // pb.MessageBatch
	kindChunk frameKind = 200 // pb.Chunk
)

func (k frameKind) String() string {
	switch k {
	case kindBatch:
		return "message batch"
	case kindChunk:
		return "snapshot chunk"
	}
	return fmt.Sprintf("kind %d", uint16(k))
}

// A frame's body is read in pieces: the first of firstPiece bytes, each
// later one as large as what has arrived, up to pieceSize. Each piece's
// buffer is allocated only when the bytes before it have arrived, so a
// claimed size costs at most firstPiece until its bytes come, and the
// buffer stays within twice what arrived. Each piece must arrive within
// ReadTimeout: a body that has begun must keep arriving.
const (
	firstPiece = 64 << 10
	pieceSize  = 2 << 20
)

// errPoison is readHeader's answer to a sender's end-of-stream mark.
var errPoison = errors.New("end of stream")

// putHeader writes the magic and header of a frame of kind with body into
// dst[:frameHead]. Under TLS the body's CRC is left zero, as dragonboat
// leaves it.
func putHeader(dst []byte, kind frameKind, body []byte, encrypted bool) {
	copy(dst, magic[:])
	h := dst[magicSize:frameHead]
	binary.BigEndian.PutUint16(h[0:], uint16(kind))
	binary.BigEndian.PutUint64(h[2:], uint64(len(body)))
	binary.BigEndian.PutUint32(h[10:], 0)
	var bcrc uint32
	if !encrypted {
		bcrc = crc32.ChecksumIEEE(body)
	}
	binary.BigEndian.PutUint32(h[14:], bcrc)
	binary.BigEndian.PutUint32(h[10:], crc32.ChecksumIEEE(h))
}

// header is a decoded frame header.
type header struct {
	kind frameKind
	size int
	bcrc uint32
}

// frameError is a frame that breaks the format or a limit: the
// connection it came on is closed.
type frameError struct{ msg string }

func (e *frameError) Error() string { return e.msg }

func badFrame(format string, args ...any) error {
	return &frameError{msg: fmt.Sprintf(format, args...)}
}

// parseHeader checks the magic and header in b[:frameHead]: the magic, the
// header's own CRC, the kind, and the size against maxFrame, all before a
// byte of the body is read or allocated.
func parseHeader(b []byte, maxFrame int) (header, error) {
	if [magicSize]byte(b[:magicSize]) == poison {
		return header{}, errPoison
	}
	if [magicSize]byte(b[:magicSize]) != magic {
		return header{}, badFrame("bad magic %#x", b[:magicSize])
	}
	h := b[magicSize:frameHead]
	var zeroed [headerSize]byte
	copy(zeroed[:], h)
	binary.BigEndian.PutUint32(zeroed[10:], 0)
	if got, want := binary.BigEndian.Uint32(h[10:]), crc32.ChecksumIEEE(zeroed[:]); got != want {
		return header{}, badFrame("header checksum %#x, want %#x", got, want)
	}
	kind := frameKind(binary.BigEndian.Uint16(h[0:]))
	if kind != kindBatch && kind != kindChunk {
		return header{}, badFrame("unknown frame %s", kind)
	}
	size := binary.BigEndian.Uint64(h[2:])
	if size == 0 || size > uint64(maxFrame) {
		return header{}, badFrame("%s of %d bytes, outside [1, %d] (MaxFrame)", kind, size, maxFrame)
	}
	return header{kind: kind, size: int(size), bcrc: binary.BigEndian.Uint32(h[14:])}, nil
}

// readBody reads h.size bytes from r into buf, reusing its capacity, and
// checks the body's CRC unless encrypted. It reads piece by piece (see
// firstPiece), so that what a frame costs follows what its sender sent,
// not what it claimed. Before each piece it calls before(piece), which
// may refuse (a memory budget) by returning an error, and sets the
// piece's deadline.
func readBody(r io.Reader, h header, buf []byte, encrypted bool, before func(n int) error) ([]byte, error) {
	body := buf[:0]
	for len(body) < h.size {
		n := min(h.size-len(body), pieceSize, max(firstPiece, len(body)))
		if err := before(n); err != nil {
			return body, err
		}
		body = grow(body, n, h.size)
		if _, err := io.ReadFull(r, body[len(body)-n:]); err != nil {
			return body, fmt.Errorf("%s body: %d of %d bytes read: %w", h.kind, len(body)-n, h.size, err)
		}
	}
	if !encrypted {
		if got := crc32.ChecksumIEEE(body); got != h.bcrc {
			return body, badFrame("%s body checksum %#x, want %#x", h.kind, got, h.bcrc)
		}
	}
	return body, nil
}

// grow extends b by n bytes. When its capacity is short it reallocates
// to twice its length (so a big body is copied O(log) times), but never
// beyond limit, the frame's size: capacity stays within twice what has
// arrived plus one piece.
func grow(b []byte, n, limit int) []byte {
	if cap(b)-len(b) >= n {
		return b[:len(b)+n]
	}
	nb := make([]byte, len(b)+n, min(limit, max(len(b)+n, 2*len(b))))
	copy(nb, b)
	return nb
}

// unmarshal decodes body into m as a *frameError on failure, including
// a panic: dragonboat's MessageBatch.Unmarshal indexes out of range on
// some inputs (raft_optimized.go messageCount; found by fuzzing, see
// FuzzDecodeFrame).
func unmarshal(m interface{ Unmarshal([]byte) error }, kind frameKind, body []byte) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = badFrame("%s: Unmarshal panicked: %v", kind, r)
		}
	}()
	if err := m.Unmarshal(body); err != nil {
		return badFrame("%s: %v", kind, err)
	}
	return nil
}

// Sizes of what decoding a message batch allocates per message and per
// entry, beyond the bytes it copies from the body.
var (
	messageSize = int(unsafe.Sizeof(pb.Message{}))
	entrySize   = int(unsafe.Sizeof(pb.Entry{}))
	// emptySnapshot is the encoding of the empty snapshot every message
	// in a batch carries: snapshots travel as chunks, never in a batch.
	emptySnapshot = (&pb.Snapshot{}).Size()
)

// decodedExtra reads the protobuf encoding of a pb.MessageBatch in body
// without decoding it and returns what Unmarshal would allocate beyond
// the body's own bytes: its messages and entries, twice over for the
// growth of their slices. A message carrying more than an empty snapshot
// is refused: a snapshot's maps decode to many times their bytes, and
// no peer sends one in a batch.
func decodedExtra(body []byte) (int, error) {
	msgs, entries := 0, 0
	err := eachField(body, func(field int, v []byte) error {
		if field != 1 { // MessageBatch.Requests
			return nil
		}
		msgs++
		return eachField(v, func(field int, v []byte) error {
			switch field {
			case 11: // Message.Entries
				entries++
			case 12: // Message.Snapshot
				if len(v) > emptySnapshot {
					return badFrame("message batch: a message carries a snapshot of %d bytes", len(v))
				}
			}
			return nil
		})
	})
	if err != nil {
		return 0, err
	}
	return 2 * (msgs*messageSize + entries*entrySize), nil
}

// eachField calls fn with the number and the bytes of each
// length-delimited field of the protobuf message in b, skipping the
// others, and fails on an encoding Unmarshal would refuse.
func eachField(b []byte, fn func(field int, v []byte) error) error {
	for len(b) > 0 {
		key, n := binary.Uvarint(b)
		if n <= 0 {
			return badFrame("message batch: bad field key")
		}
		b = b[n:]
		switch key & 7 {
		case 0: // varint
			if _, n = binary.Uvarint(b); n <= 0 {
				return badFrame("message batch: bad varint")
			}
			b = b[n:]
		case 1: // fixed64
			if len(b) < 8 {
				return badFrame("message batch: short fixed64")
			}
			b = b[8:]
		case 5: // fixed32
			if len(b) < 4 {
				return badFrame("message batch: short fixed32")
			}
			b = b[4:]
		case 2: // length-delimited
			l, n := binary.Uvarint(b)
			if n <= 0 || l > uint64(len(b)-n) {
				return badFrame("message batch: bad length")
			}
			v := b[n : n+int(l)]
			b = b[n+int(l):]
			if err := fn(int(key>>3), v); err != nil {
				return err
			}
		default:
			return badFrame("message batch: wire type %d", key&7)
		}
	}
	return nil
}
