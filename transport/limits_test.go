package transport_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/transport"
	"github.com/lockmesh/lockmesh/transport/transporttest"
)

// dialFrom returns a Config.Dial that connects from the loopback address
// ip, so that a test can play several remote hosts (127.0.0.0/8 is all
// loopback on Linux).
func dialFrom(ip string, dials *atomic.Int32) func(ctx context.Context, addr string) (net.Conn, error) {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		if dials != nil {
			dials.Add(1)
		}
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
		return d.DialContext(ctx, "tcp", addr)
	}
}

// rawConns opens n TCP connections to addr from ip that send nothing.
func rawConns(t testing.TB, addr, ip string, n int) []net.Conn {
	t.Helper()
	conns := make([]net.Conn, n)
	for i := range conns {
		c, err := dialFrom(ip, nil)(context.Background(), addr)
		if err != nil {
			t.Fatalf("dial %d from %s: %v", i, ip, err)
		}
		t.Cleanup(func() { c.Close() })
		conns[i] = c
	}
	return conns
}

// closedBy reports, for each conn, whether the server closed it by
// deadline. The conns are read at the same time: a read past its deadline
// fails at once even on a closed connection.
func closedBy(conns []net.Conn, deadline time.Time) []bool {
	closed := make([]bool, len(conns))
	var wg sync.WaitGroup
	for i, c := range conns {
		c.SetReadDeadline(deadline)
		wg.Go(func() {
			_, err := c.Read(make([]byte, 1))
			closed[i] = err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
		})
	}
	wg.Wait()
	return closed
}

// closedOnceClosed waits, 30s at most, until the server closes
// conns[last], then reports which of conns it has closed, reading them
// all for a moment more: the server handles them in order, so by then it
// has decided on the others. The 30s bound fails a server that never
// closes conns[last], not a slow one.
func closedOnceClosed(conns []net.Conn, last int) []bool {
	conns[last].SetReadDeadline(time.Now().Add(30 * time.Second))
	conns[last].Read(make([]byte, 1))
	return closedBy(conns, time.Now().Add(200*time.Millisecond))
}

// watchedConn tells when a connection ends on the dialing side: the
// client closed it, or a read from it failed because the server did.
type watchedConn struct {
	net.Conn
	once  sync.Once
	ended chan struct{}
}

// Close ends the connection. It is the signal tests wait for, not a
// failed Read: the client closes the socket only after it has marked the
// connection dead and dropped it from its pool, so a call made after the
// signal dials anew. (Signalling on the Read that saw the server's EOF
// raced the client's own handling of it: a call in between was queued on
// the dying connection and failed with EOF, once under -race in CI.)
func (c *watchedConn) Close() error {
	c.once.Do(func() { close(c.ended) })
	return c.Conn.Close()
}

// watchedDial is dialFrom(ip, dials) whose connections are watchedConns,
// the newest of them in *newest.
func watchedDial(ip string, dials *atomic.Int32, newest *atomic.Pointer[watchedConn]) func(ctx context.Context, addr string) (net.Conn, error) {
	dial := dialFrom(ip, dials)
	return func(ctx context.Context, addr string) (net.Conn, error) {
		c, err := dial(ctx, addr)
		if err != nil {
			return nil, err
		}
		w := &watchedConn{Conn: c, ended: make(chan struct{})}
		newest.Store(w)
		return w, nil
	}
}

// waitEnded waits, 30s at most, until the newest connection ends.
func waitEnded(t *testing.T, newest *atomic.Pointer[watchedConn], what string) {
	t.Helper()
	select {
	case <-newest.Load().ended:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: the idle connection was still open after 30s", what)
	}
}

func count(bs []bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}

// Slow clients (slowloris) that dribble a frame, or send nothing, are
// closed once HandshakeTimeout passes without a first complete frame, and
// once IdleTimeout passes after one.
func TestSlowlorisClosed(t *testing.T) {
	const handshake, idle = 300 * time.Millisecond, 600 * time.Millisecond
	s := listen(t, transport.Config{HandshakeTimeout: handshake, IdleTimeout: idle, MaxConnsPerIP: 1000}, echo)
	valid := encode(t, transport.Frame{Kind: transport.KindRequest, ID: 1, Payload: []byte("x")})

	const n = 100
	// Each close is timed from just before its own dial: the server's
	// timer starts after that, so no close can honestly come sooner, however
	// slowly (under -race) the hundred dials go.
	conns := make([]net.Conn, n)
	dialed := make([]time.Time, n)
	for i := range conns {
		dialed[i] = time.Now()
		conns[i] = rawConns(t, s.Addr(), "127.0.0.1", 1)[0]
	}
	// A third send nothing, a third half a length prefix, a third a whole
	// frame and then one byte of the next; all keep dribbling nothing more.
	for i, c := range conns {
		switch i % 3 {
		case 1:
			c.Write(valid[:2])
		case 2:
			c.Write(append(valid, 0))
		}
	}
	var wg sync.WaitGroup
	closedAfter := make([]time.Duration, n)
	for i, c := range conns {
		c.SetReadDeadline(time.Now().Add(30 * time.Second)) // fails a connection never closed, not a slow close
		wg.Go(func() {
			// The third that sent a whole frame reads its response first.
			for {
				if _, err := c.Read(make([]byte, 64)); err != nil {
					if !errors.Is(err, os.ErrDeadlineExceeded) {
						closedAfter[i] = time.Since(dialed[i])
					}
					return
				}
			}
		})
	}
	wg.Wait()
	var slowest time.Duration
	for i, d := range closedAfter {
		if d == 0 {
			t.Fatalf("connection %d (kind %d) still open after 30s", i, i%3)
		}
		slowest = max(slowest, d)
		// Nobody is closed before its timeout: the third that sent a frame
		// has IdleTimeout after it.
		timeout := handshake
		if i%3 == 2 {
			timeout = idle
		}
		if d < timeout {
			t.Errorf("connection %d (kind %d) closed after %v, before its timeout of %v", i, i%3, d, timeout)
		}
	}
	t.Logf("%d slow connections closed; the last after %v (HandshakeTimeout %v, IdleTimeout %v)", n, slowest, handshake, idle)
	c := newClient(t, transport.Config{})
	if _, err := c.Call(ctxTimeout(t, 5*time.Second), s.Addr(), 1, nil); err != nil {
		t.Fatalf("a good client after the slow ones: %v", err)
	}
}

// Connections that have proved themselves (without TLS, by a valid
// request) are capped: one over MaxConnsPerIP from an address, or over
// MaxConns, is closed at its first request, and a freed slot is used
// again. Connections that sent nothing are never refused: one over
// MaxConnsPerIP from an address closes that address's oldest instead.
func TestConnectionLimits(t *testing.T) {
	cfg := transport.Config{MaxConns: 8, MaxConnsPerIP: 5, HandshakeTimeout: time.Minute}
	s := listen(t, cfg, echo)

	silent := rawConns(t, s.Addr(), "127.0.0.2", 6)
	if closed := closedOnceClosed(silent, 0); count(closed) != 1 || !closed[0] {
		t.Fatalf("6 silent connections from one address with MaxConnsPerIP 5: closed %v, want only the 1st", closed)
	}
	var held []*transport.Client
	call := func(ip string) error {
		c := newClient(t, transport.Config{Dial: dialFrom(ip, nil)})
		held = append(held, c)
		_, err := c.Call(ctxTimeout(t, 30*time.Second), s.Addr(), 1, nil)
		return err
	}
	for i, c := range []struct {
		ip string
		ok bool
	}{
		{"127.0.0.3", true}, {"127.0.0.3", true}, {"127.0.0.3", true}, {"127.0.0.3", true}, {"127.0.0.3", true},
		{"127.0.0.3", false}, // MaxConnsPerIP
		{"127.0.0.4", true}, {"127.0.0.4", true}, {"127.0.0.4", true},
		{"127.0.0.5", false}, // MaxConns
	} {
		if err := call(c.ip); c.ok != (err == nil) || (err != nil && !errors.Is(err, transport.ErrUnavailable)) {
			t.Fatalf("call %d from %s: err %v, want kept %v (refused: ErrUnavailable)", i+1, c.ip, err, c.ok)
		}
	}
	// Free one: a new connection gets the slot.
	held[0].Close()
	deadline := time.Now().Add(30 * time.Second)
	for call("127.0.0.5") != nil {
		if time.Now().After(deadline) {
			t.Fatal("no call got the freed slot within 30s")
		}
		time.Sleep(10 * time.Millisecond) // the server notices the close asynchronously
	}
}

// Pooled client connections survive idle periods: the client closes its
// own idle connection before the server would (after IdleTimeout/2) and
// redials on the next call, so no call fails; a call whose handler runs
// longer than IdleTimeout keeps its connection open. The test waits for
// the idle connection to end instead of sleeping past the timeouts.
func TestIdleTimeoutKeepsCallsWorking(t *testing.T) {
	const idle = time.Second
	cfg := transport.Config{IdleTimeout: idle, HandshakeTimeout: time.Second}
	s := listen(t, cfg, func(ctx context.Context, method uint8, body []byte) ([]byte, error) {
		if method == 2 {
			select {
			case <-time.After(idle + idle/2):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return echo(ctx, method, body)
	})
	call := func(t *testing.T, c *transport.Client, dials *atomic.Int32, method uint8) {
		t.Helper()
		if _, err := c.Call(ctxTimeout(t, 30*time.Second), s.Addr(), method, nil); err != nil {
			t.Fatalf("call (method %d) after %d dials: %v", method, dials.Load(), err)
		}
	}

	t.Run("SameIdleTimeout", func(t *testing.T) {
		t.Parallel()
		var dials atomic.Int32
		var newest atomic.Pointer[watchedConn]
		c := newClient(t, transport.Config{IdleTimeout: idle, Dial: watchedDial("127.0.0.1", &dials, &newest)})
		// Calls closer together than IdleTimeout/2 share one connection:
		// a redial is allowed only after a call whose start was that long
		// before the next call's end (a loaded machine may stall that long).
		allowed := int32(1)
		var prev time.Time
		for i := range 10 {
			start := time.Now()
			call(t, c, &dials, 1)
			if i > 0 && time.Since(prev) >= idle/2 {
				allowed++
			}
			prev = start
			time.Sleep(idle / 20)
		}
		if n := dials.Load(); n > allowed {
			t.Fatalf("%d dials for 10 calls about %v apart, want %d: a connection in use was dropped", n, idle/20, allowed)
		}
		// A call that outlasts IdleTimeout is not cut off.
		call(t, c, &dials, 2)
		// Once the client closes its idle connection, every call still
		// succeeds, on a new connection each time.
		before := dials.Load()
		for range 2 {
			waitEnded(t, &newest, "the client's own IdleTimeout/2")
			call(t, c, &dials, 1)
		}
		if n := dials.Load() - before; n != 2 {
			t.Errorf("%d dials for 2 calls after the idle connection closed, want 2", n)
		}
	})

	// A client whose idle limit is longer than the server's (configured
	// apart) sees the server close the connection, and redials.
	t.Run("ServerClosesFirst", func(t *testing.T) {
		t.Parallel()
		var dials atomic.Int32
		var newest atomic.Pointer[watchedConn]
		c := newClient(t, transport.Config{IdleTimeout: time.Hour, Dial: watchedDial("127.0.0.1", &dials, &newest)})
		call(t, c, &dials, 1)
		waitEnded(t, &newest, "the server's IdleTimeout")
		call(t, c, &dials, 1)
		if n := dials.Load(); n != 2 {
			t.Errorf("%d dials, want 2: the call after the server's idle close redials", n)
		}
	})
}

// floodEnv names the environment of TestHelperDialFlood.
const floodEnv = "TRANSPORT_TEST_FLOOD_ADDR"

// TestHelperDialFlood is not a test: TestIdleConnectionFlood runs it in a
// child process to hold open connections to a server, so that the parent's
// file descriptors and RSS are the server's alone.
func TestHelperDialFlood(t *testing.T) {
	addr := os.Getenv(floodEnv)
	if addr == "" {
		t.Skip("helper process for TestIdleConnectionFlood")
	}
	n, _ := strconv.Atoi(os.Getenv(floodEnv + "_N"))
	var conns []net.Conn
	for range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			fmt.Printf("dial failed: %v\n", err)
			break
		}
		conns = append(conns, c)
	}
	fmt.Printf("dialed %d\n", len(conns))
	io.Copy(io.Discard, os.Stdin) // hold them until the parent says
	for _, c := range conns {
		c.Close()
	}
}

// openSockets counts this process's file descriptors that are sockets
// (pipes to the helper and its pidfd are not).
func openSockets(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("needs /proc: %v", err)
	}
	n := 0
	for _, e := range ents {
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(target, "socket:") {
			n++
		}
	}
	return n
}

// rssBytes is this process's resident set size.
func rssBytes(t testing.TB) uint64 {
	t.Helper()
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skipf("needs /proc: %v", err)
	}
	for line := range strings.Lines(string(status)) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	t.Skip("no VmRSS in /proc/self/status")
	return 0
}

// 2000 connections from one host that never send a byte cost a server with
// the default limits at most DefaultMaxConnsPerIP sockets, and none once
// DefaultHandshakeTimeout has passed, as a user's monitoring would see in
// /proc.
func TestIdleConnectionFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out DefaultHandshakeTimeout")
	}
	s := listen(t, transport.Config{}, echo)
	probe := newClient(t, transport.Config{Dial: dialFrom("127.0.0.2", nil)})
	ctx := ctxTimeout(t, 30*time.Second)
	if _, err := probe.Call(ctx, s.Addr(), 1, nil); err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	fdsBefore, rssBefore := openSockets(t), rssBytes(t)

	const flood = 2000
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperDialFlood$")
	cmd.Env = append(os.Environ(), floodEnv+"="+s.Addr(), floodEnv+"_N="+strconv.Itoa(flood))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stdin.Close()
		cmd.Wait()
	}()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != fmt.Sprintf("dialed %d\n", flood) {
		t.Fatalf("helper: %q, %v", line, err)
	}
	// The server accepts in order: once a call on a new connection from
	// another address is answered, every flood connection was accepted
	// (and closed, if over the limit).
	probe2 := newClient(t, transport.Config{Dial: dialFrom("127.0.0.3", nil)})
	if _, err := probe2.Call(ctx, s.Addr(), 1, nil); err != nil {
		t.Fatalf("call from another host during the flood: %v", err)
	}
	fds, rss := openSockets(t)-fdsBefore-2, int64(rssBytes(t))-int64(rssBefore) // -2: probe2's two ends
	t.Logf("%d idle connections from one host: server holds %d more sockets, RSS %+.1f MiB", flood, fds, float64(rss)/(1<<20))
	if fds > transport.DefaultMaxConnsPerIP {
		t.Errorf("server holds %d connections from one host, want at most DefaultMaxConnsPerIP (%d)", fds, transport.DefaultMaxConnsPerIP)
	}
	maxRSS := int64(10 << 20) // about 14 KB for each of the 128 held, and the GC's slack
	if raceEnabled {
		maxRSS *= 4
	}
	if rss > maxRSS {
		t.Errorf("RSS grew %d MiB with %d idle connections, want < %d MiB", rss>>20, flood, maxRSS>>20)
	}
	// None of them sent a frame: all are gone after DefaultHandshakeTimeout.
	deadline := time.Now().Add(3 * transport.DefaultHandshakeTimeout)
	for openSockets(t)-fdsBefore-2 > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("server still holds %d flood connections %v after they were opened", openSockets(t)-fdsBefore-2, 3*transport.DefaultHandshakeTimeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// heapInuse is the heap in use after a collection.
func heapInuse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// A peer that pipelines small requests with large answers and never reads
// them holds at most MaxResponseBytes of answers (and the one being
// written) on the server, not one answer per request: the server stops
// reading its requests instead. Once the peer reads, every request is
// answered.
func TestUnreadResponsesBounded(t *testing.T) {
	answer := make([]byte, 4<<20-64) // shared: the copies queued are what is measured
	unreadAnswers(t, "shared", transport.Config{IdleTimeout: time.Minute}, func() []byte { return answer })
}

// Handlers that each make a fresh answer hold it until it is written: with
// AnswerBound the server reserves an answer's room before it runs the
// handler, so 256 pipelined small requests whose 4 MiB answers are never
// read hold about MaxPendingBytes, not 1 GiB (the review measured ~900 MiB
// through node's reads); read later, every one is answered.
func TestAnswerBoundLimitsHandlersAnswers(t *testing.T) {
	const answerSize = 4<<20 - 64
	unreadAnswers(t, "fresh", transport.Config{
		IdleTimeout: time.Minute,
		AnswerBound: func(uint8, []byte) int { return answerSize },
	}, func() []byte { return make([]byte, answerSize) }) // as a read's answer is
}

// unreadAnswers pipelines 256 small requests to a server whose handler
// answers each with answer(), reads none of the answers while it watches
// the server's heap for a second, fails if it grew by 64 MiB or more, and
// then reads every answer. The window is not a synchronisation: the bound
// must hold all through it, and without the budget every request is
// answered into memory within a tenth of it.
func unreadAnswers(t *testing.T, kind string, cfg transport.Config, answer func() []byte) {
	const n = 256
	var handled atomic.Int32
	size := len(answer())
	s := listen(t, cfg, func(context.Context, uint8, []byte) ([]byte, error) {
		handled.Add(1)
		return answer(), nil
	})
	runtime.GC()
	before := heapInuse()

	conn := rawConns(t, s.Addr(), "127.0.0.1", 1)[0]
	var reqs []byte
	for i := range n {
		reqs = append(reqs, encode(t, transport.Frame{Kind: transport.KindRequest, ID: uint64(i + 1), Method: 1, Payload: []byte("read")})...)
	}
	if _, err := conn.Write(reqs); err != nil {
		t.Fatal(err)
	}
	var peak uint64
	for start := time.Now(); time.Since(start) < time.Second; time.Sleep(20 * time.Millisecond) {
		peak = max(peak, heapInuse())
	}
	grew := int64(peak) - int64(before)
	t.Logf("%d pipelined requests (%d bytes) with %s %.1f MiB answers, none read: %d handled, server heap %+.1f MiB",
		n, len(reqs), kind, float64(size)/(1<<20), handled.Load(), float64(grew)/(1<<20))
	if limit := int64(64 << 20); grew > limit {
		t.Errorf("server heap grew %d MiB while the peer did not read, want < %d MiB", grew>>20, limit>>20)
	}

	// The peer reads now: all n are answered on the same connection.
	conn.SetReadDeadline(time.Now().Add(60 * time.Second))
	br := bufio.NewReaderSize(conn, 64<<10)
	for i := range n {
		f, err := transport.ReadFrame(br, transport.DefaultMaxFrameSize)
		if err != nil {
			t.Fatalf("answer %d of %d: %v", i+1, n, err)
		}
		if f.Kind != transport.KindResponse || len(f.Payload) != size {
			t.Fatalf("answer %d: kind %d, %d bytes (code %d %q)", i+1, f.Kind, len(f.Payload), f.Code, f.Message)
		}
	}
}

// A peer that never reads its answers, with MaxPendingBytes of them held,
// is disconnected after IdleTimeout (and logged) rather than held with
// its requests parked for ever.
func TestUnreadResponsesCloseAfterIdleTimeout(t *testing.T) {
	const idle = 500 * time.Millisecond
	var logs lockedBuffer
	answer := make([]byte, 1<<20)
	s := listen(t, transport.Config{IdleTimeout: idle, Logger: slog.New(slog.NewTextHandler(&logs, nil))},
		func(context.Context, uint8, []byte) ([]byte, error) { return answer, nil })
	conn := rawConns(t, s.Addr(), "127.0.0.1", 1)[0]
	var reqs []byte
	for i := range 64 {
		reqs = append(reqs, encode(t, transport.Frame{Kind: transport.KindRequest, ID: uint64(i + 1), Payload: []byte("x")})...)
	}
	if _, err := conn.Write(reqs); err != nil {
		t.Fatal(err)
	}
	const want = "peer does not read its responses"
	deadline := time.Now().Add(30 * time.Second) // fails a peer never disconnected, not a slow disconnect
	for !strings.Contains(logs.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q logged 30s after the requests (IdleTimeout %v):\n%s", want, idle, logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// What was written before the close can still be read; then the
	// connection ends.
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.Copy(io.Discard, conn); errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("connection still open after the server gave up on it: %v", err)
	}
}

// With TLS, strangers' certificates hold at most MaxConns-ReservedConns,
// and MaxConnsPerIP from one IP, even from the peers' own address (what
// it would be in a loopback cluster); members' certificates are counted
// by neither and take the rest of MaxConns.
func TestReservedConnsByCertificate(t *testing.T) {
	ca := transporttest.NewCA(t)
	cfg := transport.Config{
		TLS: ca.Issue("peer-1"), MaxConns: 6, ReservedConns: 2, MaxConnsPerIP: 2,
		Known: func(_ net.Addr, st *tls.ConnectionState) bool {
			return strings.HasPrefix(st.PeerCertificates[0].Subject.CommonName, "peer-")
		},
	}
	s := listen(t, cfg, echo)
	call := func(name, ip string) error {
		cl := newClient(t, transport.Config{TLS: ca.Issue(name), Dial: dialFrom(ip, nil)})
		_, err := cl.Call(ctxTimeout(t, 10*time.Second), s.Addr(), 1, nil)
		return err
	}
	for i, c := range []struct {
		name, ip string
		ok       bool
	}{
		{"stranger", "127.0.0.1", true}, {"stranger", "127.0.0.1", true},
		{"stranger", "127.0.0.1", false}, // MaxConnsPerIP
		{"stranger", "127.0.0.2", true}, {"stranger", "127.0.0.2", true},
		{"stranger", "127.0.0.3", false}, // 4 = MaxConns less ReservedConns
		{"peer-2", "127.0.0.1", true}, {"peer-3", "127.0.0.1", true},
		{"peer-4", "127.0.0.1", false}, // MaxConns
	} {
		if err := call(c.name, c.ip); c.ok != (err == nil) {
			t.Fatalf("connection %d (%s from %s): err %v, want kept %v", i+1, c.name, c.ip, err, c.ok)
		}
	}
}
