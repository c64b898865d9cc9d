package mesh

import (
	"bufio"
	"bytes"
	"compress/lzw"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// memberlist's message types, from its net.go (part of its wire protocol).
const (
	tPushPull byte = 6
	tCompound byte = 7
	tUser     byte = 8
	tCompress byte = 9
	tEncrypt  byte = 10
)

// pushPullHeader mirrors memberlist's: msgpack encodes it as a map keyed by
// the field names, as memberlist's codec does.
type pushPullHeader struct {
	Nodes        int
	UserStateLen int
	Join         bool
}

// encodeMsg returns memberlist's stream form of one message: the type byte,
// then each value msgpack-encoded.
func encodeMsg(t testing.TB, typ byte, values ...any) []byte {
	t.Helper()
	out := []byte{typ}
	for _, v := range values {
		b, err := msgpack.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b...)
	}
	return out
}

// compressMsg wraps msg the way memberlist compresses a message: LZW (LSB,
// 8-bit literals) inside a msgpack map {Algo, Buf}, after a compressMsg byte.
func compressMsg(t testing.TB, msg []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := lzw.NewWriter(&buf, lzw.LSB, 8)
	if _, err := w.Write(msg); err != nil {
		t.Fatal(err)
	}
	w.Close()
	return encodeMsg(t, tCompress, struct {
		Algo int
		Buf  []byte
	}{0, buf.Bytes()})
}

// footprint is what a user's monitoring sees of this process's memory:
// bytes allocated so far, resident set size and its peak.
type footprint struct {
	totalAlloc, rss, hwm uint64
}

func readFootprint(t testing.TB) footprint {
	t.Helper()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	f := footprint{totalAlloc: ms.TotalAlloc}
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return f // not Linux: allocation only
	}
	for line := range strings.Lines(string(status)) {
		field, rest, _ := strings.Cut(line, ":")
		kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		switch field {
		case "VmRSS":
			f.rss = kb << 10
		case "VmHWM":
			f.hwm = kb << 10
		}
	}
	return f
}

// resetPeakRSS restarts VmHWM from the current RSS (Linux: writing 5 to
// clear_refs), so a test can see its own peak.
func resetPeakRSS() { _ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) }

const mib = 1 << 20

// sendStream opens a gossip TCP stream to addr, writes msg, half-closes and
// waits (bounded) for the peer to close its side, so the peer has finished
// with the message when it returns.
func sendStream(t testing.TB, addr string, msg []byte) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	c.(*net.TCPConn).CloseWrite()
	c.SetReadDeadline(time.Now().Add(15 * time.Second))
	if _, err := bufio.NewReader(c).Discard(1 << 20); err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("peer kept the stream open 15s after a hostile message")
	}
}

// A peer without a gossip key, sent 50 push-pull messages of a few dozen
// bytes that each claim a million members, must not allocate for members
// that were never sent. memberlist v0.7.0 alone allocates about 112 MB per
// message (its own cap is 2^20 members of 112 bytes each).
func TestGossipPushPullAmplification(t *testing.T) {
	m := startMesh(t, "target", nil, nil)
	hostile := encodeMsg(t, tPushPull, pushPullHeader{Nodes: 1 << 20})
	compressed := compressMsg(t, hostile)
	t.Logf("hostile push-pull: %d bytes plain, %d compressed", len(hostile), len(compressed))

	const messages = 50
	runtime.GC()
	resetPeakRSS()
	before := readFootprint(t)
	for i := range messages {
		msg := hostile
		if i%2 == 1 {
			msg = compressed
		}
		sendStream(t, m.Addr(), msg)
	}
	after := readFootprint(t)
	alloc := after.totalAlloc - before.totalAlloc
	t.Logf("%d hostile push-pulls: allocated %.1f MiB, RSS %.1f -> %.1f MiB, peak RSS %.1f MiB",
		messages, float64(alloc)/mib, float64(before.rss)/mib, float64(after.rss)/mib, float64(after.hwm)/mib)
	if alloc > 50*mib {
		t.Errorf("%d hostile push-pull messages made the peer allocate %d MiB, want < 50 MiB", messages, alloc/mib)
	}
	if before.hwm != 0 && after.hwm > before.rss+100*mib {
		t.Errorf("peak RSS rose from %d to %d MiB, want < +100 MiB", before.rss/mib, after.hwm/mib)
	}

	// The peer still gossips with a real one afterwards.
	other := startMesh(t, "friend", nil, nil)
	joinCtx(t, other, m.Addr())
	waitFor(t, 20*time.Second, "target sees friend", func() bool { return len(m.Members()) == 2 })
}

// pingMsg builds a UDP ping for the peer called node, which answers with an
// ack to the sender: packets are handled in order on one goroutine, so the
// ack means every packet sent before the ping has been handled.
func pingMsg(t testing.TB, node string, seq uint32) []byte {
	return encodeMsg(t, 0, struct {
		SeqNo uint32
		Node  string
	}{seq, node})
}

// lzwBomb returns n zero bytes, LZW-compressed: about 1/1300 of n.
func lzwBomb(n int) []byte {
	var buf bytes.Buffer
	w := lzw.NewWriter(&buf, lzw.LSB, 8)
	w.Write(make([]byte, n))
	w.Close()
	return buf.Bytes()
}

// ackedPing sends a UDP ping for node over conn and waits for its ack,
// retrying: UDP may drop it. memberlist handles packets in order on one
// goroutine, so the ack means every packet sent before has been handled.
func ackedPing(t testing.TB, conn net.Conn, node string, seq uint32) {
	t.Helper()
	ping := pingMsg(t, node, seq)
	buf := make([]byte, 1024)
	for range 50 {
		if _, err := conn.Write(ping); err != nil {
			t.Fatal(err)
		}
		conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if n, err := conn.Read(buf); err == nil && n > 0 && buf[0] == 2 { // ackRespMsg
			return
		}
	}
	t.Fatalf("no ack for ping %d after 50 tries", seq)
}

// A peer without a gossip key, sent 50 UDP packets of 32 KB that inflate
// to 41 MB each, must not inflate them: memberlist v0.7.0 alone inflates a
// compressed packet up to its 40 MB limit before giving up.
func TestGossipPacketAmplification(t *testing.T) {
	m := startMesh(t, "target", nil, nil)
	bomb := encodeMsg(t, tCompress, struct {
		Algo int
		Buf  []byte
	}{0, lzwBomb(41 << 20)})
	conn, err := net.Dial("udp", m.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	acked := func(seq uint32) { t.Helper(); ackedPing(t, conn, "target", seq) }
	acked(0) // control: the peer answers pings from this socket
	t.Logf("compressed packet: %d bytes", len(bomb))

	const packets = 50
	runtime.GC()
	resetPeakRSS()
	before := readFootprint(t)
	for i := range packets {
		if _, err := conn.Write(bomb); err != nil {
			t.Fatal(err)
		}
		acked(uint32(i + 1))
	}
	after := readFootprint(t)
	alloc := after.totalAlloc - before.totalAlloc
	t.Logf("%d compressed packets: allocated %.1f MiB, RSS %.1f -> %.1f MiB, peak RSS %.1f MiB",
		packets, float64(alloc)/mib, float64(before.rss)/mib, float64(after.rss)/mib, float64(after.hwm)/mib)
	if alloc > 50*mib {
		t.Errorf("%d compressed packets made the peer allocate %d MiB, want < 50 MiB", packets, alloc/mib)
	}
}

// A push-pull compressed twice must not reach memberlist: the guard
// inflates one layer, and memberlist would inflate the second itself and
// allocate 112 bytes for each of the 2^20 members the header inside
// claims. Before the guard refused it, 20 such messages of 76 bytes made
// the peer allocate 2.2 GiB.
func TestGossipNestedCompressionAmplification(t *testing.T) {
	m := startMesh(t, "target", nil, nil)
	hostile := compressMsg(t, compressMsg(t, encodeMsg(t, tPushPull, pushPullHeader{Nodes: 1 << 20})))
	t.Logf("push-pull compressed twice: %d bytes", len(hostile))

	const messages = 20
	runtime.GC()
	resetPeakRSS()
	before := readFootprint(t)
	for range messages {
		sendStream(t, m.Addr(), hostile)
	}
	after := readFootprint(t)
	alloc := after.totalAlloc - before.totalAlloc
	t.Logf("%d push-pulls compressed twice: allocated %.1f MiB, RSS %.1f -> %.1f MiB, peak RSS %.1f MiB",
		messages, float64(alloc)/mib, float64(before.rss)/mib, float64(after.rss)/mib, float64(after.hwm)/mib)
	if alloc > 32*mib {
		t.Errorf("%d doubly compressed push-pulls made the peer allocate %d MiB, want < 32 MiB", messages, alloc/mib)
	}

	// The peer still gossips with a real one afterwards.
	other := startMesh(t, "friend", nil, nil)
	joinCtx(t, other, m.Addr())
	waitFor(t, 20*time.Second, "target sees friend", func() bool { return len(m.Members()) == 2 })
}

// UDP packets that nest compression (compressed twice, or a compressed
// message in a compound in a compressed packet) must not reach memberlist,
// whose decoder inflates every compressed layer it meets, each up to 40 MB.
func TestGossipNestedPacketAmplification(t *testing.T) {
	m := startMesh(t, "target", nil, nil)
	bomb := encodeMsg(t, tCompress, struct {
		Algo int
		Buf  []byte
	}{0, lzwBomb(40 << 20)}) // memberlist's limit, 40 MiB, exactly
	hostile := [][]byte{
		compressMsg(t, bomb),
		compressMsg(t, compound(pingMsg(t, "target", 0), bomb)),
	}
	for i, p := range hostile {
		if len(p) > 65000 {
			t.Fatalf("hostile packet %d is %d bytes, too big for a datagram", i, len(p))
		}
		t.Logf("hostile packet %d: %d bytes", i, len(p))
	}
	conn, err := net.Dial("udp", m.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ackedPing(t, conn, "target", 0) // control: the peer answers pings from this socket

	const packets = 20
	runtime.GC()
	resetPeakRSS()
	before := readFootprint(t)
	for i := range packets {
		if _, err := conn.Write(hostile[i%len(hostile)]); err != nil {
			t.Fatal(err)
		}
		ackedPing(t, conn, "target", uint32(i+1))
	}
	after := readFootprint(t)
	alloc := after.totalAlloc - before.totalAlloc
	t.Logf("%d packets nesting compression: allocated %.1f MiB, RSS %.1f -> %.1f MiB, peak RSS %.1f MiB",
		packets, float64(alloc)/mib, float64(before.rss)/mib, float64(after.rss)/mib, float64(after.hwm)/mib)
	if alloc > 32*mib {
		t.Errorf("%d packets nesting compression made the peer allocate %d MiB, want < 32 MiB", packets, alloc/mib)
	}
}

// A gossip stream message is refused before memberlist sees it when it
// announces more than it carries, and handed on unchanged (or inflated,
// when compressed) otherwise.
func TestGossipGuardStream(t *testing.T) {
	lim := newGuardLimits(100)
	nodes := func(n int) []byte { return bytes.Repeat([]byte{0x97, 1, 2, 3, 4, 5, 6, 7}, n) } // 7-element arrays
	pushPull := func(n int, extra []byte) []byte {
		return append(encodeMsg(t, tPushPull, pushPullHeader{Nodes: n}), extra...)
	}
	userMsg := func(n int) []byte {
		return encodeMsg(t, tUser, struct{ UserMsgLen int }{n})
	}
	encrypted := func(n uint32) []byte { return binary.BigEndian.AppendUint32([]byte{tEncrypt}, n) }
	compressed := func(raw []byte) []byte {
		return encodeMsg(t, tCompress, struct {
			Algo int
			Buf  []byte
		}{0, raw})
	}
	cases := []struct {
		name   string
		msg    []byte
		want   []byte // nil: refused
		reason string
	}{
		{"push-pull within limits", pushPull(3, nodes(3)), pushPull(3, nodes(3)), ""},
		{"push-pull at the limit", pushPull(100, nodes(100)), pushPull(100, nodes(100)), ""},
		{"push-pull over the limit", pushPull(101, nodes(101)), nil, "101 members"},
		{"push-pull claiming 2^20", pushPull(1<<20, nil), nil, "1048576 members"},
		{"push-pull without its members", pushPull(50, nodes(49)), nil, "fewer than 400 bytes"},
		{"push-pull negative", pushPull(-1, nil), nil, "-1 members"},
		{"push-pull user state", encodeMsg(t, tPushPull, pushPullHeader{UserStateLen: 20 << 20}), nil, "user state"},
		{"push-pull unknown field", encodeMsg(t, tPushPull, struct{ Nodes, Extra int }{1, 2}), nil, `"Extra"`},
		{"push-pull header as array", []byte{tPushPull, 0x93, 0xce, 0, 0x10, 0, 0, 0, 0xc2}, nil, "not a map"},
		{"push-pull nodes as uint64", []byte{tPushPull, 0x81, 0xa5, 'N', 'o', 'd', 'e', 's', 0xcf, 0xff, 0, 0, 0, 0, 0, 0, 0}, nil, "out of range"},
		{"user message", userMsg(100), userMsg(100), ""},
		{"user message of 20 MB", userMsg(20 << 20), nil, "user message"},
		{"encrypted", encrypted(1000), encrypted(1000), ""},
		{"encrypted 4 GiB", encrypted(1<<32 - 1), nil, "encrypted message"},
		{"ping", pingMsg(t, "x", 1), pingMsg(t, "x", 1), ""},
		{"compressed push-pull", compressMsg(t, pushPull(3, nodes(3))), pushPull(3, nodes(3)), ""},
		{"compressed push-pull claiming 2^20", compressMsg(t, pushPull(1<<20, nil)), nil, "1048576 members"},
		{"compressed bomb", compressed(lzwBomb(64 << 20)), nil, "inflates to more than"},
		{"compressed 200-fold", compressed(lzwBomb(150 << 10)), nil, "128 times its size"},
		{"compressed 4 GiB buffer", []byte{tCompress, 0x82, 0xa4, 'A', 'l', 'g', 'o', 0, 0xa3, 'B', 'u', 'f', 0xc6, 0xff, 0xff, 0xff, 0xff}, nil, "4294967295 bytes"},
		{"compressed unknown algorithm", encodeMsg(t, tCompress, struct{ Algo int }{7}), nil, "algorithm 7"},
		{"compressed twice", compressMsg(t, compressMsg(t, pushPull(3, nodes(3)))), nil, "compressed message inside a compressed stream message"},
		{"compressed twice, claiming 2^20", compressMsg(t, compressMsg(t, pushPull(1<<20, nil))), nil, "compressed message inside a compressed stream message"},
		{"encrypted inside compressed", compressMsg(t, encrypted(1000)), nil, "encrypted message inside a compressed stream message"},
		{"compressed user message", compressMsg(t, userMsg(100)), userMsg(100), ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := bytes.NewReader(tc.msg)
			got, err := checkStream(r, lim)
			if tc.want == nil {
				if !errors.Is(err, errRefused) || !strings.Contains(err.Error(), tc.reason) {
					t.Fatalf("checkStream = %v, want a refusal mentioning %q", err, tc.reason)
				}
				return
			}
			if err != nil {
				t.Fatalf("checkStream refused a good message: %v", err)
			}
			// memberlist reads the bytes handed back, then the rest.
			rest, _ := io.ReadAll(r)
			if seen := append(got, rest...); !bytes.Equal(seen, tc.want) {
				t.Fatalf("memberlist would read %x, want %x", seen, tc.want)
			}
		})
	}
}

// Inbound gossip streams beyond maxInboundStreams are closed at once; the
// ones within it stay open for memberlist (until its TCP timeout, 10 s
// with the LAN timings used here).
func TestGossipInboundStreamCap(t *testing.T) {
	m, err := Create(Config{Name: "capped", BindAddr: "127.0.0.1:0", Meta: testMeta("capped")})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	const extra = 20
	conns := make([]net.Conn, maxInboundStreams+extra)
	for i := range conns {
		c, err := net.DialTimeout("tcp", m.Addr(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns[i] = c
	}
	// A read past its deadline fails at once even on a closed stream, so
	// the streams are read at the same time, each until the deadline.
	deadline := time.Now().Add(3 * time.Second)
	var closed atomic.Int32
	var wg sync.WaitGroup
	for _, c := range conns {
		c.SetReadDeadline(deadline)
		wg.Go(func() {
			if _, err := c.Read(make([]byte, 1)); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
				closed.Add(1)
			}
		})
	}
	wg.Wait()
	if closed := int(closed.Load()); closed != extra {
		t.Fatalf("%d of %d idle streams were closed within 3s, want the %d above the cap of %d", closed, len(conns), extra, maxInboundStreams)
	}
}

// A stream that ends before its first byte reads as io.EOF, unwrapped,
// which memberlist passes over without logging an error.
func TestGossipGuardEmptyStream(t *testing.T) {
	server, client := net.Pipe()
	client.Close()
	c := &guardedConn{Conn: server, limits: newGuardLimits(DefaultMaxMembers)}
	defer c.Close()
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("Read of an empty stream = %v, want io.EOF itself", err)
	}
}

// compound is memberlist's compound message of parts: the count, each
// part's length, then the parts.
func compound(parts ...[]byte) []byte {
	out := []byte{tCompound, byte(len(parts))}
	for _, p := range parts {
		out = binary.BigEndian.AppendUint16(out, uint16(len(p)))
	}
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// A plaintext packet must be layered as memberlist builds one (checksum,
// compression, compound, each at most once and in that order), and a
// compressed packet inflate to at most maxPacketBytes.
func TestGossipGuardPacket(t *testing.T) {
	ping := pingMsg(t, "x", 1)
	crc := func(msg []byte) []byte { return append([]byte{msgHasCRC, 0, 0, 0, 0}, msg...) }
	bomb := encodeMsg(t, tCompress, struct {
		Algo int
		Buf  []byte
	}{0, lzwBomb(41 << 20)})
	cases := []struct {
		name   string
		packet []byte
		reason string // "" means it passes
	}{
		{"ping", ping, ""},
		{"compound", compound(ping, ping), ""},
		{"compressed compound with a checksum", crc(compressMsg(t, compound(ping, ping))), ""},
		{"compressed bomb", bomb, "inflates to more than 65536 bytes"},
		{"compressed bomb with a checksum", crc(bomb), "inflates to more than"},
		{"compressed part of a compound", compound(ping, compressMsg(t, ping)), "compressed message inside a compound in a packet"},
		{"compressed twice", compressMsg(t, compressMsg(t, ping)), "compressed message inside a compressed packet"},
		{"compressed twice with a checksum", crc(compressMsg(t, compressMsg(t, ping))), "compressed message inside a compressed packet"},
		{"compressed in a compound, compressed", compressMsg(t, compound(ping, compressMsg(t, ping))), "compressed message inside a compound in a compressed packet"},
		{"encrypted in a compressed packet", compressMsg(t, []byte{tEncrypt, 0, 0, 0, 0}), "encrypted message inside a compressed packet"},
		{"encrypted in a compound", compound(ping, []byte{tEncrypt, 0}), "encrypted message inside a compound"},
		{"compound in a compound", compound(ping, compound(ping, ping)), "compound message inside a compound"},
		{"compound in a compressed compound", compressMsg(t, compound(compound(ping))), "compound message inside a compound in a compressed packet"},
		{"checksum inside a compressed packet", compressMsg(t, crc(ping)), "checksummed message inside a compressed packet"},
		{"checksum in a compound", compound(crc(ping)), "checksummed message inside a compound"},
		{"checksum twice", crc(crc(ping)), "checksummed message inside a checksummed packet"},
		{"checksummed compound", crc(compound(ping, ping)), ""},
		{"compressed ping", compressMsg(t, ping), ""},
		{"truncated compound", compound(ping)[:4], ""},
		{"truncated checksum", []byte{msgHasCRC, 0}, ""},
	}
	var scratch []byte
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := checkPacket(tc.packet, &scratch)
			switch {
			case tc.reason == "" && err != nil:
				t.Fatalf("checkPacket refused a good packet: %v", err)
			case tc.reason != "" && (!errors.Is(err, errRefused) || !strings.Contains(err.Error(), tc.reason)):
				t.Fatalf("checkPacket = %v, want a refusal mentioning %q", err, tc.reason)
			}
		})
	}
}
