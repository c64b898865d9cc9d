package transport

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Version is the wire format version, the first byte of every frame body.
const Version = 1

// Frame kinds.
const (
	// KindRequest marks a frame sent by a Client to a Server.
	KindRequest uint8 = 1
	// KindResponse marks a frame sent by a Server in answer to a request.
	KindResponse uint8 = 2
)

// frameFields is the number of elements of the msgpack array in a frame body.
const frameFields = 6

// minFrameSize is the smallest MaxFrameSize Config accepts: enough for an
// empty request or a response carrying a short error message.
const minFrameSize = 256

// Frame is one decoded message. Requests and responses share the layout;
// a response with Code != 0 carries an error and its Payload is ignored.
type Frame struct {
	Kind    uint8  // KindRequest or KindResponse
	ID      uint64 // call id chosen by the client, echoed in the response
	Method  uint8  // opaque to transport; echoed in the response
	Code    uint16 // 0 on success, otherwise an error code (see Error)
	Message string // error message when Code != 0
	Payload []byte // request or response body; opaque to transport
}

// EncodeFrame appends f in wire form, 4-byte length prefix included, to dst
// and returns the extended slice. It fails with an error wrapping
// ErrFrameTooLarge when the body (everything after the prefix) would exceed
// maxSize bytes; maxSize <= 0 means DefaultMaxFrameSize.
func EncodeFrame(dst []byte, f *Frame, maxSize int) ([]byte, error) {
	if maxSize <= 0 {
		maxSize = DefaultMaxFrameSize
	}
	// Refuse before encoding anything big: the fixed part is at most 20 bytes
	// (version, array header, kind, id, method, code, two length headers).
	if n := len(f.Payload) + len(f.Message); n > maxSize {
		return dst, fmt.Errorf("transport: frame body of at least %d bytes exceeds the limit of %d: %w", n, maxSize, ErrFrameTooLarge)
	}
	start := len(dst)
	w := appendWriter{b: append(dst, 0, 0, 0, 0, Version)}
	enc := msgpack.GetEncoder()
	enc.Reset(&w)
	err := encodeFields(enc, f)
	msgpack.PutEncoder(enc)
	if err != nil {
		return dst, fmt.Errorf("transport: encode frame: %w", err)
	}
	size := len(w.b) - start - 4
	if size > maxSize {
		return dst, fmt.Errorf("transport: frame body of %d bytes exceeds the limit of %d: %w", size, maxSize, ErrFrameTooLarge)
	}
	binary.BigEndian.PutUint32(w.b[start:], uint32(size))
	return w.b, nil
}

func encodeFields(enc *msgpack.Encoder, f *Frame) error {
	if err := enc.EncodeArrayLen(frameFields); err != nil {
		return err
	}
	if err := enc.EncodeUint(uint64(f.Kind)); err != nil {
		return err
	}
	if err := enc.EncodeUint(f.ID); err != nil {
		return err
	}
	if err := enc.EncodeUint(uint64(f.Method)); err != nil {
		return err
	}
	if err := enc.EncodeUint(uint64(f.Code)); err != nil {
		return err
	}
	if err := enc.EncodeString(f.Message); err != nil {
		return err
	}
	// Always bin, never nil, so an empty payload has one canonical form.
	if err := enc.EncodeBytesLen(len(f.Payload)); err != nil {
		return err
	}
	_, err := enc.Writer().Write(f.Payload)
	return err
}

// appendWriter is the msgpack encoder's sink: an append-only byte slice.
type appendWriter struct{ b []byte }

func (w *appendWriter) Write(p []byte) (int, error) { w.b = append(w.b, p...); return len(p), nil }
func (w *appendWriter) WriteByte(c byte) error      { w.b = append(w.b, c); return nil }

// errBadFrame is wrapped by every DecodeFrame error.
var errBadFrame = errors.New("malformed frame")

// DecodeFrame decodes one frame body: the bytes after the 4-byte length
// prefix. It never allocates more than len(body) bytes: every length read
// from the body is checked against what remains before anything is copied.
// The returned Payload aliases body; Message is a copy.
func DecodeFrame(body []byte) (Frame, error) {
	var f Frame
	if len(body) == 0 {
		return f, fmt.Errorf("transport: %w: empty body", errBadFrame)
	}
	if body[0] != Version {
		return f, fmt.Errorf("transport: %w: unknown version %d", errBadFrame, body[0])
	}
	r := bytes.NewReader(body[1:])
	dec := msgpack.GetDecoder()
	// bytes.Reader is an io.ByteScanner, so the decoder reads it directly
	// without a bufio layer and r.Len() is exactly what is left.
	dec.Reset(r)
	err := decodeFields(dec, r, body[1:], &f)
	msgpack.PutDecoder(dec)
	if err != nil {
		return Frame{}, fmt.Errorf("transport: %w: %w", errBadFrame, err)
	}
	return f, nil
}

func decodeFields(dec *msgpack.Decoder, r *bytes.Reader, rest []byte, f *Frame) error {
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return err
	}
	if n != frameFields {
		return fmt.Errorf("array of %d elements, want %d", n, frameFields)
	}
	kind, err := decodeUint(dec, math.MaxUint8, "kind")
	if err != nil {
		return err
	}
	if kind != uint64(KindRequest) && kind != uint64(KindResponse) {
		return fmt.Errorf("unknown kind %d", kind)
	}
	f.Kind = uint8(kind)
	if f.ID, err = decodeUint(dec, math.MaxUint64, "call id"); err != nil {
		return err
	}
	method, err := decodeUint(dec, math.MaxUint8, "method")
	if err != nil {
		return err
	}
	f.Method = uint8(method)
	code, err := decodeUint(dec, math.MaxUint16, "code")
	if err != nil {
		return err
	}
	f.Code = uint16(code)
	msg, err := sliceBytes(dec, r, rest, true)
	if err != nil {
		return fmt.Errorf("message: %w", err)
	}
	f.Message = string(msg)
	if f.Payload, err = sliceBytes(dec, r, rest, false); err != nil {
		return fmt.Errorf("payload: %w", err)
	}
	if r.Len() != 0 {
		return fmt.Errorf("%d trailing bytes", r.Len())
	}
	return nil
}

func decodeUint(dec *msgpack.Decoder, max uint64, what string) (uint64, error) {
	c, err := dec.PeekCode()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	// Only unsigned encodings: DecodeUint64 would also accept negative ints
	// and floats and convert them silently.
	if c > msgpcode.PosFixedNumHigh {
		switch c {
		case msgpcode.Uint8, msgpcode.Uint16, msgpcode.Uint32, msgpcode.Uint64:
		default:
			return 0, fmt.Errorf("%s: code %#x is not an unsigned integer", what, c)
		}
	}
	v, err := dec.DecodeUint64()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	if v > max {
		return 0, fmt.Errorf("%s: %d out of range", what, v)
	}
	return v, nil
}

// sliceBytes reads a str (wantStr) or bin header and returns the bytes that
// follow as a sub-slice of rest, after checking the claimed length against
// what is left, so a hostile length never causes an allocation.
func sliceBytes(dec *msgpack.Decoder, r *bytes.Reader, rest []byte, wantStr bool) ([]byte, error) {
	c, err := dec.PeekCode()
	if err != nil {
		return nil, err
	}
	isStr := msgpcode.IsFixedString(c) || c == msgpcode.Str8 || c == msgpcode.Str16 || c == msgpcode.Str32
	isBin := c == msgpcode.Bin8 || c == msgpcode.Bin16 || c == msgpcode.Bin32
	if (wantStr && !isStr) || (!wantStr && !isBin) {
		return nil, fmt.Errorf("unexpected code %#x", c)
	}
	n, err := dec.DecodeBytesLen()
	if err != nil {
		return nil, err
	}
	if n < 0 || n > r.Len() {
		return nil, fmt.Errorf("length %d exceeds the %d bytes left", n, r.Len())
	}
	off := len(rest) - r.Len()
	if _, err := r.Seek(int64(n), io.SeekCurrent); err != nil {
		return nil, err
	}
	return rest[off : off+n : off+n], nil
}

// readChunk bounds the buffer allocated up front for a frame whose claimed
// length has not been seen on the wire yet.
const readChunk = 64 << 10

// ReadFrame reads one length-prefixed frame from r and decodes it. A length
// prefix above maxSize fails with an error wrapping ErrFrameTooLarge before
// the body is read; maxSize <= 0 means DefaultMaxFrameSize. Memory for the
// body grows with the bytes actually received, so a peer that announces a
// large frame and sends little cannot make ReadFrame allocate the full size.
func ReadFrame(r io.Reader, maxSize int) (Frame, error) {
	body, err := readBody(r, maxSize)
	if err != nil {
		return Frame{}, err
	}
	return DecodeFrame(body)
}

func readBody(r io.Reader, maxSize int) ([]byte, error) {
	if maxSize <= 0 {
		maxSize = DefaultMaxFrameSize
	}
	var prefix [4]byte
	if _, err := io.ReadFull(r, prefix[:]); err != nil {
		return nil, err
	}
	size := binary.BigEndian.Uint32(prefix[:])
	if uint64(size) > uint64(maxSize) {
		return nil, &frameSizeError{size: size, max: maxSize}
	}
	n := int(size)
	if n <= readChunk {
		b := make([]byte, n)
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, unexpectedEOF(err)
		}
		return b, nil
	}
	b := make([]byte, 0, readChunk)
	for len(b) < n {
		if len(b) == cap(b) {
			nb := make([]byte, len(b), min(2*cap(b), n))
			copy(nb, b)
			b = nb
		}
		m, err := r.Read(b[len(b):min(cap(b), n)])
		b = b[:len(b)+m]
		if err != nil && len(b) < n {
			return nil, unexpectedEOF(err)
		}
	}
	return b, nil
}

// unexpectedEOF reports a stream that ends inside a frame as truncated.
func unexpectedEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// frameSizeError is returned by ReadFrame for an oversized length prefix.
type frameSizeError struct {
	size uint32
	max  int
}

func (e *frameSizeError) Error() string {
	return fmt.Sprintf("transport: frame of %d bytes exceeds the limit of %d", e.size, e.max)
}

func (e *frameSizeError) Unwrap() error { return ErrFrameTooLarge }

// bufPool recycles encoded frames between the goroutine that encodes them
// and the connection writer that copies them into its bufio.Writer.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// maxPooledBuf keeps rare huge frames from pinning memory in the pool.
const maxPooledBuf = 64 << 10

func getBuf() *[]byte { return bufPool.Get().(*[]byte) }

func putBuf(b *[]byte) {
	if cap(*b) > maxPooledBuf {
		return
	}
	*b = (*b)[:0]
	bufPool.Put(b)
}
