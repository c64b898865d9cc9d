package mesh

import (
	"bytes"
	"compress/lzw"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/lockmesh/lockmesh/internal/throttle"
)

// The gossip guard sits between memberlist and its transport and refuses
// input that would make memberlist allocate far more than it received.
// memberlist v0.7.0 sizes some buffers from counts in the message itself:
// a push-pull header claiming 2^20 members (its own cap) makes it allocate
// 112 MB before it reads one member, a user message header 20 MB, and a
// compressed message or packet inflates to up to 40 MB from 32 KB. None of
// these limits is configurable, so the guard reads the start of every
// stream and every packet first. With a SecretKey memberlist decrypts
// before it decodes and drops what does not authenticate, so only key
// holders can reach those paths; the guard matters for meshes without one
// (loopback, or a deliberately insecure deployment).
//
// The rules, all on plaintext:
//   - a push-pull header may claim at most Config.MaxMembers members and is
//     handed to memberlist only once the stream has delivered at least
//     minNodeStateBytes per member it claims, so memberlist's allocation
//     (112 bytes per member) stays within 14 times what was received;
//   - a push-pull's user state and a stream user message are capped at
//     maxUserStateBytes (this package's Delegate sends none);
//   - a compressed stream message is inflated by the guard, at most to the
//     largest push-pull MaxMembers allows and to maxInflation times its
//     compressed size, and memberlist is handed the inflated message,
//     checked like a plain one; it may not be compressed or encrypted
//     itself, or memberlist would inflate (or decrypt) that second layer
//     on its own, unchecked;
//   - an encrypted stream message may not announce more than twice that;
//   - a packet must be layered as memberlist builds one, outside in: an
//     optional checksum, an optional compression of all the rest (inflating
//     to at most maxPacketBytes), an optional compound, then messages none
//     of which is a checksum, compressed, compound or encrypted. memberlist
//     decodes any nesting of these recursively, inflating each compressed
//     layer up to 40 MB; lockmesh never sends one;
//   - at most maxInboundStreams inbound streams are open at once; more are
//     closed at once.
//
// Message types and layouts come from memberlist's net.go, where they are
// part of the wire protocol and only ever appended to.

// DefaultMaxMembers is Config.MaxMembers when it is zero.
const DefaultMaxMembers = 4096

// maxMaxMembers is the largest MaxMembers Config accepts: its largest
// push-pull (16 MiB) stays below memberlist's own 20 MB message limit.
const maxMaxMembers = 16384

const (
	// maxNodeStateBytes generously bounds one member's encoded state
	// (name, address, metadata of at most MaxMetaSize, versions, field
	// names), for sizing the largest push-pull a peer can legitimately send.
	maxNodeStateBytes = 1 << 10
	// minNodeStateBytes is the smallest encoding of one member that
	// memberlist's decoder accepts: an array of its 7 fields, each 1 byte.
	minNodeStateBytes = 8
	// maxUserStateBytes caps a push-pull's user state and a stream user
	// message. The Delegate here sends neither; leave notices go by packet.
	maxUserStateBytes = 64 << 10
	// maxPacketBytes is the largest UDP datagram, and the most a packet's
	// compressed parts may inflate to: legitimate packets are compressed
	// whole, after being built to fit a datagram.
	maxPacketBytes = 64 << 10
	// maxInflation caps how many times its size a compressed stream
	// message may inflate to. Member states, similar as they are, compress
	// 5-20 fold with memberlist's LZW; a run of one byte, 1300 fold.
	maxInflation = 128
	// maxInboundStreams caps the inbound gossip streams open at once.
	// memberlist serves at most 128 push-pulls at once itself; streams
	// otherwise carry joins and TCP fallback pings, each short-lived.
	maxInboundStreams = 256
	// maxHeaderFields bounds the fields of a header map (memberlist sends
	// at most 3), maxKeyLen the length of a field name.
	maxHeaderFields = 8
	maxKeyLen       = 32
)

// memberlist's message types.
const (
	msgPushPull    byte = 6
	msgCompound    byte = 7
	msgUser        byte = 8
	msgCompress    byte = 9
	msgEncrypt     byte = 10
	msgHasCRC      byte = 12
	lzwAlgo        int  = 0
	lzwLitWidth         = 8
	encryptionSlop      = 64 // version, nonce, tag and padding
)

// errRefused is wrapped by every guard refusal.
var errRefused = errors.New("mesh: gossip message refused")

func refused(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errRefused, fmt.Sprintf(format, args...))
}

// guardLimits are the limits derived from Config.MaxMembers.
type guardLimits struct {
	maxMembers int
	// maxState is the largest legitimate push-pull, plain.
	maxState int
}

func newGuardLimits(maxMembers int) guardLimits {
	return guardLimits{
		maxMembers: maxMembers,
		maxState:   maxMembers*maxNodeStateBytes + maxUserStateBytes,
	}
}

// guardTransport wraps memberlist's transport with the gossip guard. It
// owns inner: Shutdown shuts inner down.
type guardTransport struct {
	memberlist.NodeAwareTransport
	limits guardLimits
	// encrypted says packets are encrypted (SecretKey set): memberlist then
	// decrypts every packet and drops those that fail, so the guard leaves
	// packets alone.
	encrypted bool
	log       *slog.Logger
	warn      throttle.Warner
	// scratch receives inflated packets; only forwardPackets uses it.
	scratch []byte

	packets chan *memberlist.Packet
	streams chan net.Conn
	inbound atomic.Int32 // inbound streams open

	// stopping closes when Shutdown starts: the forwarders then drain inner
	// without delivering, so that inner's listeners, which block on their
	// unbuffered channels, can exit. done closes once inner is down.
	stopping     chan struct{}
	done         chan struct{}
	shutdownOnce sync.Once
	shutdownErr  error
	wg           sync.WaitGroup
}

func newGuardTransport(inner memberlist.NodeAwareTransport, limits guardLimits, encrypted bool, log *slog.Logger) *guardTransport {
	t := &guardTransport{
		NodeAwareTransport: inner,
		limits:             limits,
		encrypted:          encrypted,
		log:                log,
		warn:               throttle.Warner{Every: 10 * time.Second},
		packets:            make(chan *memberlist.Packet),
		streams:            make(chan net.Conn),
		stopping:           make(chan struct{}),
		done:               make(chan struct{}),
	}
	t.wg.Add(2)
	go t.forwardPackets()
	go t.forwardStreams()
	return t
}

func (t *guardTransport) PacketCh() <-chan *memberlist.Packet { return t.packets }

func (t *guardTransport) StreamCh() <-chan net.Conn { return t.streams }

func (t *guardTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// DialAddressTimeout guards what the remote end answers on a stream this
// peer opens (a push-pull reply is read like a push-pull request).
func (t *guardTransport) DialAddressTimeout(addr memberlist.Address, timeout time.Duration) (net.Conn, error) {
	c, err := t.NodeAwareTransport.DialAddressTimeout(addr, timeout)
	if err != nil {
		return nil, err
	}
	return &guardedConn{Conn: c, limits: t.limits}, nil
}

// Shutdown shuts inner down and stops the forwarders. It is idempotent.
func (t *guardTransport) Shutdown() error {
	t.shutdownOnce.Do(func() {
		close(t.stopping)
		t.shutdownErr = t.NodeAwareTransport.Shutdown()
		close(t.done)
		t.wg.Wait()
	})
	return t.shutdownErr
}

func (t *guardTransport) forwardPackets() {
	defer t.wg.Done()
	in := t.NodeAwareTransport.PacketCh()
	for {
		select {
		case <-t.done:
			return
		case p := <-in:
			if !t.encrypted {
				if err := checkPacket(p.Buf, &t.scratch); err != nil {
					t.warn.Warn(t.log, "mesh: dropped a gossip packet", "from", p.From, "err", err)
					continue
				}
			}
			select {
			case t.packets <- p:
			case <-t.stopping:
			}
		}
	}
}

func (t *guardTransport) forwardStreams() {
	defer t.wg.Done()
	in := t.NodeAwareTransport.StreamCh()
	for {
		select {
		case <-t.done:
			return
		case c := <-in:
			if n := t.inbound.Add(1); n > maxInboundStreams {
				t.inbound.Add(-1)
				_ = c.Close()
				t.warn.Warn(t.log, "mesh: closed a gossip stream: too many open", "from", c.RemoteAddr(), "limit", maxInboundStreams)
				continue
			}
			gc := &guardedConn{Conn: c, limits: t.limits, onClose: func() { t.inbound.Add(-1) }}
			select {
			case t.streams <- gc:
			case <-t.stopping:
				_ = gc.Close()
			}
		}
	}
}

// guardedConn checks the first message read from a gossip stream before
// memberlist sees any of it. memberlist reads one message per stream (in
// either direction), so only the first is checked. Reads after a refusal
// fail with the same error; memberlist logs it and closes the stream.
type guardedConn struct {
	net.Conn
	limits  guardLimits
	onClose func()

	// Read is only called from one goroutine (memberlist's handler or
	// dialer), so these need no lock.
	checked bool
	pending []byte // bytes read ahead (or inflated) to hand out first
	err     error

	closeOnce sync.Once
}

func (c *guardedConn) Read(p []byte) (int, error) {
	if !c.checked {
		c.checked = true
		c.pending, c.err = checkStream(c.Conn, c.limits)
		if errors.Is(c.err, errRefused) {
			c.err = fmt.Errorf("%w (from %s)", c.err, c.RemoteAddr())
		}
		// Other errors go out as they are: memberlist passes over a
		// stream that ends before its first byte (io.EOF) in silence.
	}
	if c.err != nil {
		return 0, c.err
	}
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

func (c *guardedConn) Close() error {
	err := c.Conn.Close()
	c.closeOnce.Do(func() {
		if c.onClose != nil {
			c.onClose()
		}
	})
	return err
}

// checkStream reads the start of the first message on a stream, checks it
// and returns the bytes memberlist should read before the rest of r. A
// compressed message comes back inflated. Read errors of r are returned
// as they are, so memberlist sees a timeout or EOF as usual.
func checkStream(r io.Reader, lim guardLimits) ([]byte, error) {
	mr := &msgReader{src: r, limit: 2*lim.maxState + encryptionSlop}
	typ, err := mr.byte1()
	if err != nil {
		return mr.buf, err
	}
	switch typ {
	case msgCompress:
		inner, err := inflate(mr, lim.maxState, maxInflation, nil)
		if err != nil {
			return nil, err
		}
		// memberlist is handed inner in place of the message: a compressed
		// or encrypted inner message would be inflated or decrypted by
		// memberlist itself, never by the guard.
		if typ := inner[0]; typ == msgCompress || typ == msgEncrypt {
			return nil, refused("%s message inside a compressed stream message; memberlist never nests them", msgName(typ))
		}
		if err := checkPlain(&msgReader{buf: inner}, lim); err != nil {
			return nil, err
		}
		return append(inner, mr.rest()...), nil
	case msgEncrypt:
		// Decrypted only by key holders; bound what memberlist buffers.
		b, err := mr.bytesN(4)
		if err != nil {
			return nil, err
		}
		if n := binary.BigEndian.Uint32(b); uint64(n) > uint64(2*lim.maxState+encryptionSlop) {
			return nil, refused("encrypted message of %d bytes, above the limit of %d", n, 2*lim.maxState+encryptionSlop)
		}
		return mr.buf, nil
	}
	mr.off = 0
	if err := checkPlain(mr, lim); err != nil {
		return nil, err
	}
	return mr.buf, nil
}

// checkPlain checks an uncompressed, unencrypted message starting at r's
// type byte. Types other than push-pull and user messages decode into
// small fixed structs and pass.
func checkPlain(r *msgReader, lim guardLimits) error {
	typ, err := r.byte1()
	if err != nil {
		return err
	}
	switch typ {
	case msgPushPull:
		var nodes, userState int64
		err := r.fields(func(key string) (err error) {
			switch key {
			case "Nodes":
				nodes, err = r.int()
			case "UserStateLen":
				userState, err = r.int()
			case "Join":
				err = r.boolean()
			default:
				err = refused("unknown push-pull header field %q", key)
			}
			return err
		})
		if err != nil {
			return err
		}
		if nodes < 0 || nodes > int64(lim.maxMembers) {
			return refused("push-pull claims %d members, above the limit of %d (Config.MaxMembers)", nodes, lim.maxMembers)
		}
		if userState < 0 || userState > maxUserStateBytes {
			return refused("push-pull claims %d bytes of user state, above the limit of %d", userState, maxUserStateBytes)
		}
		// Hold the header back until the members it announces have arrived,
		// at their smallest encoding.
		if err := r.fill(int(nodes) * minNodeStateBytes); err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, errRefused) {
				return refused("push-pull claims %d members but carries fewer than %d bytes for them", nodes, int(nodes)*minNodeStateBytes)
			}
			return err
		}
	case msgUser:
		var size int64
		err := r.fields(func(key string) (err error) {
			if key != "UserMsgLen" {
				return refused("unknown user message header field %q", key)
			}
			size, err = r.int()
			return err
		})
		if err != nil {
			return err
		}
		if size < 0 || size > maxUserStateBytes {
			return refused("user message of %d bytes, above the limit of %d", size, maxUserStateBytes)
		}
	}
	return nil
}

// checkPacket checks a plaintext packet. memberlist builds every packet
// in the same layers, outside in: an optional checksum, an optional
// compression of all the rest, an optional compound of messages, then
// messages that each decode into a small struct. Its decoder accepts these
// layers nested in any order and depth (a compressed message in a compound
// in a compressed packet is inflated twice, each time up to 40 MB), so the
// guard accepts them only in that order, each at most once. The compressed
// layer is inflated into *scratch, which is kept for the next packet.
func checkPacket(buf []byte, scratch *[]byte) error {
	// memberlist strips a checksum only from the start of a packet, and
	// only when it is whole.
	in := "" // the layers around buf
	if len(buf) >= 5 && buf[0] == msgHasCRC {
		buf, in = buf[5:], "checksummed packet"
	}
	if len(buf) > 0 && buf[0] == msgCompress {
		if cap(*scratch) == 0 {
			*scratch = make([]byte, 0, maxPacketBytes+bytes.MinRead+1)
		}
		inner, err := inflate(&msgReader{buf: buf, off: 1}, maxPacketBytes, 0, (*scratch)[:0])
		if err != nil {
			return err
		}
		buf, in = inner, "compressed packet"
	}
	if len(buf) == 0 || buf[0] != msgCompound {
		if in == "" {
			return nil // a plain message, or one memberlist does not handle
		}
		return checkPacketMessage(buf, in)
	}
	if len(buf) < 2 {
		return nil // memberlist drops it
	}
	if in == "" {
		in = "packet"
	}
	parts, lens := int(buf[1]), buf[2:]
	if len(lens) < 2*parts {
		return nil
	}
	body := lens[2*parts:]
	for i := range parts {
		n := int(binary.BigEndian.Uint16(lens[2*i:]))
		if n > len(body) {
			return nil // memberlist handles the parts that are whole
		}
		if err := checkPacketMessage(body[:n], "compound in a "+in); err != nil {
			return err
		}
		body = body[n:]
	}
	return nil
}

// checkPacketMessage refuses a message, found inside the packet layers
// named by in, that is itself one of those layers.
func checkPacketMessage(msg []byte, in string) error {
	if len(msg) == 0 {
		return nil
	}
	switch typ := msg[0]; typ {
	case msgHasCRC, msgCompress, msgCompound, msgEncrypt:
		return refused("%s message inside a %s; memberlist compresses and checksums whole packets only, and never nests compounds", msgName(typ), in)
	}
	return nil
}

// msgName names the message types that wrap others.
func msgName(typ byte) string {
	switch typ {
	case msgCompound:
		return "compound"
	case msgCompress:
		return "compressed"
	case msgEncrypt:
		return "encrypted"
	case msgHasCRC:
		return "checksummed"
	}
	return fmt.Sprintf("type %d", typ)
}

// inflate reads memberlist's compress struct {Algo, Buf} from r and
// returns Buf decompressed, appended to dst, refusing to produce more than
// limit bytes or, with maxRatio, more than maxRatio times Buf's size.
func inflate(r *msgReader, limit, maxRatio int, dst []byte) ([]byte, error) {
	algo := int64(-1)
	var compressed []byte
	err := r.fields(func(key string) (err error) {
		switch key {
		case "Algo":
			algo, err = r.int()
		case "Buf":
			compressed, err = r.blob()
		default:
			err = refused("unknown compress field %q", key)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	if algo != int64(lzwAlgo) {
		return nil, refused("unknown compression algorithm %d", algo)
	}
	what := fmt.Sprintf("%d bytes", limit)
	if maxRatio > 0 && maxRatio*len(compressed) < limit {
		limit = maxRatio * len(compressed)
		what = fmt.Sprintf("%d times its size of %d bytes", maxRatio, len(compressed))
	}
	zr := lzw.NewReader(bytes.NewReader(compressed), lzw.LSB, lzwLitWidth)
	defer zr.Close()
	out := bytes.NewBuffer(dst)
	if _, err := out.ReadFrom(io.LimitReader(zr, int64(limit)+1)); err != nil {
		return nil, refused("bad compressed data: %v", err)
	}
	if out.Len() > limit {
		return nil, refused("compressed message inflates to more than %s", what)
	}
	if out.Len() == 0 {
		return nil, refused("compressed message is empty")
	}
	return out.Bytes(), nil
}

// msgReader parses msgpack from buf, reading more from src (when not nil)
// as needed but never holding more than limit bytes: memory grows with
// what the peer actually sent, whatever lengths it announces.
type msgReader struct {
	src   io.Reader
	buf   []byte
	off   int
	limit int
}

// fill makes sure n bytes after off are buffered.
func (r *msgReader) fill(n int) error {
	want := r.off + n
	if want <= len(r.buf) {
		return nil
	}
	if r.src == nil {
		return io.ErrUnexpectedEOF
	}
	if want > r.limit {
		return refused("message longer than the limit of %d bytes", r.limit)
	}
	for len(r.buf) < want {
		if len(r.buf) == cap(r.buf) {
			nb := make([]byte, len(r.buf), min(max(2*cap(r.buf), 4<<10), r.limit))
			copy(nb, r.buf)
			r.buf = nb
		}
		m, err := r.src.Read(r.buf[len(r.buf):cap(r.buf)])
		r.buf = r.buf[:len(r.buf)+m]
		if err != nil && len(r.buf) < want {
			if err == io.EOF && len(r.buf) > 0 {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}

// rest returns the buffered bytes after off.
func (r *msgReader) rest() []byte { return r.buf[r.off:] }

func (r *msgReader) bytesN(n int) ([]byte, error) {
	if err := r.fill(n); err != nil {
		return nil, err
	}
	b := r.buf[r.off : r.off+n]
	r.off += n
	return b, nil
}

func (r *msgReader) byte1() (byte, error) {
	b, err := r.bytesN(1)
	if err != nil {
		return 0, err
	}
	return b[0], nil
}

func (r *msgReader) uintN(n int) (uint64, error) {
	b, err := r.bytesN(n)
	if err != nil {
		return 0, err
	}
	var v uint64
	for _, c := range b {
		v = v<<8 | uint64(c)
	}
	return v, nil
}

// fields reads a msgpack map of at most maxHeaderFields string keys,
// calling value for each key to read its value. memberlist encodes its
// structs as such maps.
func (r *msgReader) fields(value func(key string) error) error {
	c, err := r.byte1()
	if err != nil {
		return err
	}
	var n uint64
	switch {
	case c&0xf0 == 0x80:
		n = uint64(c & 0x0f)
	case c == 0xde:
		n, err = r.uintN(2)
	case c == 0xdf:
		n, err = r.uintN(4)
	default:
		return refused("header is msgpack code %#x, not a map", c)
	}
	if err != nil {
		return err
	}
	if n > maxHeaderFields {
		return refused("header map of %d fields", n)
	}
	for range n {
		key, err := r.str(maxKeyLen)
		if err != nil {
			return err
		}
		if err := value(string(key)); err != nil {
			return err
		}
	}
	return nil
}

// strLen reads a str or bin header (memberlist's codec writes []byte as
// str) and returns the length it announces.
func (r *msgReader) strLen() (uint64, error) {
	c, err := r.byte1()
	if err != nil {
		return 0, err
	}
	switch {
	case c&0xe0 == 0xa0:
		return uint64(c & 0x1f), nil
	case c == 0xd9, c == 0xc4:
		return r.uintN(1)
	case c == 0xda, c == 0xc5:
		return r.uintN(2)
	case c == 0xdb, c == 0xc6:
		return r.uintN(4)
	}
	return 0, refused("msgpack code %#x is not a string", c)
}

func (r *msgReader) str(max int) ([]byte, error) {
	n, err := r.strLen()
	if err != nil {
		return nil, err
	}
	if n > uint64(max) {
		return nil, refused("string of %d bytes where at most %d fit", n, max)
	}
	return r.bytesN(int(n))
}

// blob reads a str or bin value; fill bounds it by limit.
func (r *msgReader) blob() ([]byte, error) {
	n, err := r.strLen()
	if err != nil {
		return nil, err
	}
	if n > uint64(math.MaxInt32) {
		return nil, refused("string of %d bytes", n)
	}
	return r.bytesN(int(n))
}

// int reads any msgpack integer (nil reads as 0, as memberlist's codec
// decodes it).
func (r *msgReader) int() (int64, error) {
	c, err := r.byte1()
	if err != nil {
		return 0, err
	}
	switch {
	case c <= 0x7f:
		return int64(c), nil
	case c >= 0xe0:
		return int64(int8(c)), nil
	case c == 0xc0:
		return 0, nil
	case c >= 0xcc && c <= 0xcf: // uint 8, 16, 32, 64
		v, err := r.uintN(1 << (c - 0xcc))
		if err != nil {
			return 0, err
		}
		if v > math.MaxInt64 {
			return 0, refused("integer %d out of range", v)
		}
		return int64(v), nil
	case c >= 0xd0 && c <= 0xd3: // int 8, 16, 32, 64
		size := 1 << (c - 0xd0)
		v, err := r.uintN(size)
		if err != nil {
			return 0, err
		}
		shift := 64 - 8*size
		return int64(v<<shift) >> shift, nil
	}
	return 0, refused("msgpack code %#x is not an integer", c)
}

// boolean reads a msgpack bool or nil.
func (r *msgReader) boolean() error {
	c, err := r.byte1()
	if err != nil {
		return err
	}
	if c != 0xc0 && c != 0xc2 && c != 0xc3 {
		return refused("msgpack code %#x is not a bool", c)
	}
	return nil
}
