package transport

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockmesh/lockmesh/internal/connslots"
	"github.com/lockmesh/lockmesh/internal/throttle"
)

// Handler serves one request. It is called on its own goroutine per request,
// may block, and must respect ctx, which is cancelled when the connection
// closes or the Server closes. body is owned by the handler.
//
// A returned *Error (also when wrapped) reaches the caller with its Code and
// Message intact (Code 0 is sent as CodeInternal); any other error arrives
// as an *Error with Code CodeInternal and the error text. A handler that
// panics is answered with CodeInternal and the panic is logged, as
// net/http does, so one bad request cannot take the process down.
type Handler func(ctx context.Context, method uint8, body []byte) ([]byte, error)

// Server accepts connections and runs a Handler for each request. Per
// connection it runs one reader, one writer and one goroutine per request
// in flight.
type Server struct {
	cfg    Config
	h      Handler
	ln     net.Listener
	ctx    context.Context // cancelled by Close: every handler's ctx derives from it
	cancel context.CancelFunc

	mu     sync.Mutex
	conns  map[*serverConn]struct{}
	closed bool

	slots *connslots.Table // MaxConns, MaxUnprovenConns, MaxConnsPerIP

	refusals throttle.Warner // warnings about connections over the limits

	wg sync.WaitGroup // accept loop, connection goroutines, handlers
}

// Listen listens on the TCP address addr ("127.0.0.1:0" picks a free port)
// and serves h on it until Close. With Config.TLS set, every connection must
// complete a TLS handshake within HandshakeTimeout (and DialTimeout).
func Listen(addr string, cfg Config, h Handler) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if h == nil {
		return nil, errors.New("transport: Listen needs a non-nil Handler")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("transport: listen on %s: %w", addr, err)
	}
	return NewServer(ln, cfg, h)
}

// NewServer is Listen on a listener the caller made, for example one from
// an in-memory test network. It returns at once, serving in the background.
// The Server owns ln from then on and closes it in Close; NewServer closes
// it when it fails.
func NewServer(ln net.Listener, cfg Config, h Handler) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		ln.Close()
		return nil, err
	}
	if h == nil {
		ln.Close()
		return nil, errors.New("transport: NewServer needs a non-nil Handler")
	}
	cfg = cfg.withDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		cfg:    cfg,
		h:      h,
		ln:     ln,
		ctx:    ctx,
		cancel: cancel,
		conns:  make(map[*serverConn]struct{}),
		slots:  connslots.New(slotLimits(cfg)),
	}
	s.refusals.Every = 10 * time.Second
	s.wg.Add(1)
	go s.acceptLoop()
	return s, nil
}

// Addr returns the address the Server listens on, with the actual port.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops accepting, closes every connection, cancels the ctx of every
// running handler and waits for all of them to return. It is idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	first := !s.closed
	s.closed = true
	conns := make([]*serverConn, 0, len(s.conns))
	for sc := range s.conns {
		conns = append(conns, sc)
	}
	s.mu.Unlock()
	var err error
	if first {
		s.cancel()
		if err = s.ln.Close(); errors.Is(err, net.ErrClosed) {
			err = nil
		}
		for _, sc := range conns {
			sc.conn.Close()
		}
	}
	s.wg.Wait()
	return err
}

func (s *Server) acceptLoop() {
	defer s.wg.Done()
	var backoff time.Duration
	for {
		conn, err := s.ln.Accept()
		if err != nil {
			if s.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors and the like: back off as net/http
			// does instead of spinning.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.cfg.Logger.Warn("transport: accept failed", "addr", s.Addr(), "err", err, "retry_in", backoff)
			select {
			case <-time.After(backoff):
			case <-s.ctx.Done():
				return
			}
			continue
		}
		backoff = 0
		remote := conn.RemoteAddr().String()
		ip := remoteIP(conn.RemoteAddr())
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			conn.Close()
			return
		}
		// Every new connection is admitted, unproven: the rules of
		// internal/connslots may close an older unproven one for it.
		slot, pushed, why := s.slots.Admit(ip, conn)
		tconn := conn
		if s.cfg.TLS != nil {
			tconn = tls.Server(conn, s.cfg.TLS)
		}
		ctx, cancel := context.WithCancel(s.ctx)
		sc := &serverConn{
			s:      s,
			conn:   tconn,
			remote: remote,
			slot:   slot,
			ctx:    ctx,
			cancel: cancel,
			queue:  make(chan *[]byte, queueLen),
			slots:  make(chan struct{}, s.cfg.MaxConcurrentRequests),
			start:  time.Now(),
			budget: newByteBudget(s.cfg.MaxPendingBytes),
		}
		s.conns[sc] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		if pushed != nil {
			pushed.Close()
			s.refusals.Warn(s.cfg.Logger, "transport: closed the oldest connection that had not proved itself, to make room for a new one", "peer", pushed.(net.Conn).RemoteAddr().String(), "for", remote, "limit", why)
		}
		go sc.run()
	}
}

// slotLimits are the connslots limits cfg (with defaults) sets. Only TLS
// and Known can prove a member, so without both nothing is reserved.
func slotLimits(cfg Config) connslots.Limits {
	l := connslots.Limits{MaxConns: cfg.MaxConns, MaxUnproven: cfg.MaxUnprovenConns, MaxPerIP: cfg.MaxConnsPerIP}
	if cfg.TLS != nil && cfg.Known != nil {
		l.Reserved = cfg.ReservedConns
	}
	return l
}

// prove files sc, which has just proved itself, as a member's connection
// (by Known, with TLS state st) or a stranger's. It returns false, having
// logged why, when sc is over its class's limits and must be closed.
func (s *Server) prove(sc *serverConn, st *tls.ConnectionState) bool {
	member := st != nil && s.cfg.Known != nil && s.cfg.Known(sc.conn.RemoteAddr(), st)
	why := s.slots.Prove(sc.slot, member)
	if why != "" {
		s.refusals.Warn(s.cfg.Logger, "transport: refused a connection over the limit", "peer", sc.remote, "member", member, "limit", why)
	}
	return why == ""
}

// remoteIP is the address MaxConnsPerIP counts by: the IP of a TCP peer,
// the whole address for other networks (in-memory test listeners).
func remoteIP(addr net.Addr) string {
	if ta, ok := addr.(*net.TCPAddr); ok {
		return ta.AddrPort().Addr().Unmap().String()
	}
	if host, _, err := net.SplitHostPort(addr.String()); err == nil {
		return host
	}
	return addr.String()
}

// frameOverhead bounds what a frame takes beyond its payload and message:
// the length prefix and the fixed fields.
const frameOverhead = 32

// serverConn is one accepted connection.
type serverConn struct {
	s      *Server
	conn   net.Conn
	remote string
	slot   *connslots.Slot // its place among the Server's connections
	budget *byteBudget     // Config.MaxPendingBytes
	ctx    context.Context // cancelled when the connection closes
	cancel context.CancelFunc
	queue  chan *[]byte  // encoded responses for the writer
	slots  chan struct{} // one token per running handler

	// start and active (nanoseconds after start, monotonic) date the last
	// frame received or response queued, for IdleTimeout.
	start  time.Time
	active atomic.Int64
}

// touch records activity now.
func (sc *serverConn) touch() { sc.active.Store(int64(time.Since(sc.start))) }

// idleUntil is when the connection becomes idle if nothing happens: a
// connection with a handler running is never idle.
func (sc *serverConn) idleUntil() time.Time {
	idle := sc.s.cfg.IdleTimeout
	if len(sc.slots) > 0 {
		return time.Now().Add(idle)
	}
	return sc.start.Add(time.Duration(sc.active.Load()) + idle)
}

// run reads requests and starts a handler goroutine for each until the
// connection ends. It enforces HandshakeTimeout on the first frame and
// IdleTimeout after it with read deadlines: it waits for the first byte of
// each frame with Peek, which consumes nothing, so a deadline met while a
// handler runs or soon after one answered (the connection is busy, not
// idle) is simply moved to when it would become idle.
func (sc *serverConn) run() {
	s := sc.s
	defer func() {
		sc.cancel()
		sc.conn.Close()
		s.slots.Release(sc.slot)
		s.mu.Lock()
		delete(s.conns, sc)
		s.mu.Unlock()
		s.wg.Done()
	}()
	log := s.cfg.Logger
	rd := readDeadline{conn: sc.conn}
	rd.set(sc.start.Add(s.cfg.HandshakeTimeout))

	if tc, ok := sc.conn.(*tls.Conn); ok {
		ctx, cancel := context.WithTimeout(sc.ctx, s.cfg.DialTimeout)
		err := tc.HandshakeContext(ctx)
		cancel()
		if err != nil {
			if s.slots.Class(sc.slot) == connslots.Gone {
				log.Debug("transport: connection closed in its TLS handshake to make room for newer ones", "peer", sc.remote)
			} else {
				log.Warn("transport: TLS handshake failed", "peer", sc.remote, "err", err)
			}
			return
		}
		st := tc.ConnectionState()
		if !s.prove(sc, &st) {
			return
		}
		sc.ctx = ContextWithPeer(sc.ctx, peerOf(sc.remote, &st))
	} else {
		sc.ctx = ContextWithPeer(sc.ctx, peerOf(sc.remote, nil))
	}

	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := writeLoop(sc.conn, sc.queue, sc.ctx.Done(), s.cfg.IdleTimeout, sc.budget.release); err != nil {
			if isTimeout(err) {
				s.refusals.Warn(log, "transport: closing connection: peer does not read its responses", "peer", sc.remote, "idle_timeout", s.cfg.IdleTimeout)
			}
			sc.cancel()
			sc.conn.Close() // unblocks the reader
		}
	}()

	// A connection costs its read buffer only once its first byte has
	// come: until then it is unproven, and a flood of them (each pushed
	// out by the next, internal/connslots) must not each allocate one.
	waiting := bufio.NewReaderSize(sc.conn, 16)
	br := waiting
	for first := true; ; first = false {
		// Read no more requests while the peer leaves MaxPendingBytes
		// of answers unread or of requests running.
		if !sc.budget.waitRoom(sc.ctx.Done()) {
			return
		}
		// Wait for the next frame to begin.
		for {
			_, err := br.Peek(1)
			if err == nil {
				break
			}
			if !first && isTimeout(err) {
				if until := sc.idleUntil(); time.Now().Before(until) {
					rd.set(until)
					continue
				}
				log.Debug("transport: closing idle connection", "peer", sc.remote, "idle_timeout", s.cfg.IdleTimeout)
				return
			}
			sc.readFailed(err, first)
			return
		}
		if first {
			br = bufio.NewReaderSize(waiting, readBufSize)
		} else {
			// A frame that has begun gets at least half an IdleTimeout to
			// arrive whole.
			rd.atLeast(s.cfg.IdleTimeout)
		}
		f, err := ReadFrame(br, s.cfg.MaxFrameSize)
		if err == nil && f.Kind != KindRequest {
			err = fmt.Errorf("transport: %w %d from client", errUnexpectedKind, f.Kind)
		}
		if err != nil {
			sc.readFailed(err, first)
			return
		}
		// Without TLS, a valid first request is all a connection can
		// prove: it speaks the protocol.
		if first && s.cfg.TLS == nil && !s.prove(sc, nil) {
			return
		}
		sc.touch()
		rd.atLeast(s.cfg.IdleTimeout)
		select {
		case sc.slots <- struct{}{}:
		case <-sc.ctx.Done():
			return
		}
		// The request's body and the answer its handler may make, before
		// the handler runs: a connection holds at most MaxPendingBytes of
		// both.
		reserve := 0
		if s.cfg.AnswerBound != nil {
			reserve = max(0, min(s.cfg.AnswerBound(f.Method, f.Payload), s.cfg.MaxFrameSize))
		}
		if !sc.budget.acquire(len(f.Payload)+reserve, sc.ctx.Done()) {
			<-sc.slots
			return
		}
		s.wg.Add(1)
		go sc.handle(f, reserve)
	}
}

// readFailed logs why reading a frame failed.
func (sc *serverConn) readFailed(err error, first bool) {
	s := sc.s
	switch {
	case isProtocolError(err):
		s.cfg.Logger.Error("transport: closing connection after bad frame", "peer", sc.remote, "err", err)
	case isTimeout(err) && first:
		s.cfg.Logger.Debug("transport: closing connection that sent no whole frame within the handshake timeout", "peer", sc.remote, "handshake_timeout", s.cfg.HandshakeTimeout)
	case isTimeout(err):
		s.cfg.Logger.Debug("transport: closing connection whose frame did not arrive within the idle timeout", "peer", sc.remote, "idle_timeout", s.cfg.IdleTimeout)
	case !isClosedConn(err) && sc.ctx.Err() == nil:
		s.cfg.Logger.Debug("transport: connection read failed", "peer", sc.remote, "err", err)
	}
}

// handle runs the Handler for request f and queues the response.
func (sc *serverConn) handle(f Frame, reserved int) {
	s := sc.s
	defer func() {
		<-sc.slots
		s.wg.Done()
	}()
	resp := Frame{Kind: KindResponse, ID: f.ID, Method: f.Method}
	payload, err := sc.invoke(f)
	sc.budget.release(len(f.Payload))
	if err != nil {
		resp.Code, resp.Message = CodeInternal, err.Error()
		if e := (*Error)(nil); errors.As(err, &e) {
			resp.Message = e.Message
			if e.Code != 0 {
				resp.Code = e.Code
			}
		}
	} else {
		resp.Payload = payload
	}
	// The response is copied into a frame only once the budget has room
	// for it; until then it is the handler's slice, held here.
	charge := min(len(resp.Payload)+len(resp.Message), s.cfg.MaxFrameSize) + frameOverhead
	if charge <= reserved {
		sc.budget.release(reserved - charge)
	} else if !sc.budget.acquire(charge-reserved, sc.ctx.Done()) {
		sc.budget.release(reserved)
		return
	}
	buf := getBuf()
	b, err := EncodeFrame((*buf)[:0], &resp, s.cfg.MaxFrameSize)
	if err != nil {
		s.cfg.Logger.Warn("transport: response does not fit in a frame", "peer", sc.remote, "method", f.Method, "err", err)
		msg := err.Error()
		resp = Frame{Kind: KindResponse, ID: f.ID, Method: f.Method, Code: CodeInternal, Message: msg[:min(len(msg), minFrameSize/2)]}
		b, _ = EncodeFrame((*buf)[:0], &resp, s.cfg.MaxFrameSize)
	}
	*buf = b
	sc.budget.release(charge - len(b)) // writeLoop releases len(b)
	select {
	case sc.queue <- buf:
		sc.touch()
	case <-sc.ctx.Done():
		putBuf(buf)
	}
}

// invoke calls the Handler, turning a panic into an error.
func (sc *serverConn) invoke(f Frame) (payload []byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			sc.s.cfg.Logger.Error("transport: handler panicked", "peer", sc.remote, "method", f.Method, "panic", p, "stack", string(debug.Stack()))
			payload, err = nil, fmt.Errorf("transport: handler panicked: %v", p)
		}
	}()
	return sc.s.h(sc.ctx, f.Method, f.Payload)
}
