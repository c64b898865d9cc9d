package transport

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Client sends calls to Servers. It keeps one multiplexed connection per
// remote address, dials it on first use and redials on the next call after
// it breaks. A Client is safe for concurrent use; its goroutines are one
// reader and one writer per open connection.
type Client struct {
	cfg    Config
	ctx    context.Context // cancelled by Close to abort dials
	cancel context.CancelFunc
	nextID atomic.Uint64

	mu     sync.Mutex
	conns  map[string]*clientConn
	closed bool

	wg sync.WaitGroup // connection goroutines
}

// NewClient returns a Client that has no connections yet.
func NewClient(cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Client{
		cfg:    cfg.withDefaults(),
		ctx:    ctx,
		cancel: cancel,
		conns:  make(map[string]*clientConn),
	}, nil
}

// errNotSent marks a call that failed before its request was queued on a
// connection, so it can be retried on a new one without risk.
var errNotSent = errors.New("transport: request not sent")

// Call sends one request to the Server at addr and waits for the response
// or for ctx. It is safe to call from many goroutines; calls to one address
// share a connection and may complete in any order.
//
// Errors:
//   - *Error: the remote handler failed; Code and Message are the handler's.
//   - ErrClosed: the Client is closed (also for calls in flight during Close).
//   - an error wrapping ErrUnavailable (and the underlying net error): the
//     peer could not be reached, or the connection broke before the
//     response arrived. In the second case the handler may have run:
//     the outcome is unknown, so only retry idempotent requests.
//   - an error wrapping ErrFrameTooLarge: the request exceeds
//     MaxFrameSize; nothing was sent.
//   - ctx.Err(): ctx ended first. The request may already have been sent
//     and handled; a late response is discarded.
//
// The returned payload is owned by the caller.
func (c *Client) Call(ctx context.Context, addr string, method uint8, body []byte) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	id := c.nextID.Add(1)
	buf := getBuf()
	b, err := EncodeFrame((*buf)[:0], &Frame{Kind: KindRequest, ID: id, Method: method, Payload: body}, c.cfg.MaxFrameSize)
	*buf = b
	if err != nil {
		putBuf(buf)
		return nil, fmt.Errorf("transport: call to %s: %w", addr, err)
	}
	// A connection that died before the request was queued cannot have
	// delivered it, so one retry on a fresh connection is safe. This hides
	// the window between a peer restart and our reader noticing the EOF.
	for attempt := 0; ; attempt++ {
		cc, err := c.conn(ctx, addr)
		if err != nil {
			putBuf(buf)
			return nil, err
		}
		resp, err := cc.call(ctx, id, buf)
		if err == errNotSent {
			if attempt == 0 {
				continue
			}
			putBuf(buf)
			return nil, cc.reason()
		}
		return resp, err
	}
}

// conn returns the connection to addr, dialing it if needed, once it is
// ready or has failed.
func (c *Client) conn(ctx context.Context, addr string) (*clientConn, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	cc := c.conns[addr]
	if cc == nil {
		cc = &clientConn{
			client:  c,
			addr:    addr,
			ready:   make(chan struct{}),
			done:    make(chan struct{}),
			queue:   make(chan *[]byte, queueLen),
			pending: make(map[uint64]chan response),
		}
		c.conns[addr] = cc
		c.wg.Add(1)
		go cc.run()
	}
	c.mu.Unlock()
	select {
	case <-cc.ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case <-cc.done:
		return nil, cc.reason()
	default:
		return cc, nil
	}
}

// dial connects to addr, with TLS when configured. Dials are aborted by
// Close and bounded by DialTimeout, not by any one caller's ctx, because
// the connection is shared by every caller waiting for it.
func (c *Client) dial(addr string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(c.ctx, c.cfg.DialTimeout)
	defer cancel()
	var conn net.Conn
	var err error
	if c.cfg.Dial != nil {
		conn, err = c.cfg.Dial(ctx, addr)
	} else {
		conn, err = (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return nil, err
	}
	if c.cfg.TLS == nil {
		return conn, nil
	}
	cfg := c.cfg.TLS
	if cfg.ServerName == "" {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			conn.Close()
			return nil, err
		}
		cfg = cfg.Clone()
		cfg.ServerName = host
	}
	tc := tls.Client(conn, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		conn.Close()
		return nil, fmt.Errorf("tls handshake: %w", err)
	}
	return tc, nil
}

// Close closes every connection, fails calls in flight with ErrClosed and
// waits for the Client's goroutines to exit. It is idempotent; calls made
// after Close fail with ErrClosed.
func (c *Client) Close() error {
	c.mu.Lock()
	first := !c.closed
	c.closed = true
	conns := make([]*clientConn, 0, len(c.conns))
	for _, cc := range c.conns {
		conns = append(conns, cc)
	}
	c.mu.Unlock()
	if first {
		// Fail connections before aborting dials, so that callers waiting
		// on a dial see ErrClosed rather than a cancelled dial.
		for _, cc := range conns {
			cc.fail(ErrClosed)
		}
		c.cancel()
	}
	c.wg.Wait()
	return nil
}

// forget drops cc from the pool so that the next call redials.
func (c *Client) forget(cc *clientConn) {
	c.mu.Lock()
	c.forgetLocked(cc)
	c.mu.Unlock()
}

// forgetLocked is forget with c.mu held.
func (c *Client) forgetLocked(cc *clientConn) {
	if c.conns[cc.addr] == cc {
		delete(c.conns, cc.addr)
	}
}

type response struct {
	payload []byte
	err     error
}

// clientConn is one multiplexed connection. Its lifecycle: dialing (ready
// open), live (ready closed, done open), dead (done closed, err set).
type clientConn struct {
	client *Client
	addr   string
	ready  chan struct{} // closed when the dial finished, either way
	done   chan struct{} // closed when the connection is dead
	queue  chan *[]byte  // encoded requests for the writer

	mu      sync.Mutex
	conn    net.Conn // nil until dialed
	err     error    // why the connection died; set before done is closed
	pending map[uint64]chan response
	lastUse time.Time // when a call last started or got its response
}

// errIdle is why a Client closed a connection nobody used for
// IdleTimeout/2. No call sees it: a call that meets the closed connection
// before its request was queued retries on a new one.
var errIdle = errors.New("transport: closed idle connection")

// run dials, starts the writer and then reads responses until the
// connection dies.
func (cc *clientConn) run() {
	defer cc.client.wg.Done()
	conn, err := cc.client.dial(cc.addr)
	if err != nil {
		cc.fail(cc.unavailable(err))
		close(cc.ready)
		return
	}
	cc.mu.Lock()
	if cc.err != nil { // closed while dialing
		cc.mu.Unlock()
		conn.Close()
		close(cc.ready)
		return
	}
	cc.conn = conn
	cc.mu.Unlock()
	close(cc.ready)

	cc.client.wg.Add(1)
	go func() {
		defer cc.client.wg.Done()
		if err := writeLoop(conn, cc.queue, cc.done, 0, nil); err != nil {
			cc.fail(cc.unavailable(err))
		}
	}()

	br := bufio.NewReaderSize(conn, readBufSize)
	maxSize := cc.client.cfg.MaxFrameSize
	// Close the connection once it has been idle for half the server's
	// IdleTimeout, before the server would: a server closing it could race
	// with a new call, which would then fail with its outcome unknown.
	idle := cc.client.cfg.IdleTimeout / 2
	rd := readDeadline{conn: conn}
	rd.set(time.Now().Add(idle))
	for {
		// Wait for a response to begin. Peek consumes nothing, so when the
		// deadline passes with calls in flight or recent ones, it is just
		// moved to when the connection would be idle.
		for {
			_, err := br.Peek(1)
			if err == nil {
				break
			}
			if isTimeout(err) {
				if next, closed := cc.closeIfIdle(idle); !closed {
					rd.set(next)
					continue
				}
				return
			}
			if cc.fail(cc.unavailable(err)) && isProtocolError(err) {
				cc.client.cfg.Logger.Error("transport: closing connection after bad frame", "peer", cc.addr, "err", err)
			}
			return
		}
		// A response that has begun gets at least half of idle to arrive.
		rd.atLeast(idle)
		f, err := ReadFrame(br, maxSize)
		if err == nil && f.Kind != KindResponse {
			err = fmt.Errorf("transport: %w %d from server", errUnexpectedKind, f.Kind)
		}
		if err != nil {
			if cc.fail(cc.unavailable(err)) && isProtocolError(err) {
				cc.client.cfg.Logger.Error("transport: closing connection after bad frame", "peer", cc.addr, "err", err)
			}
			return
		}
		cc.mu.Lock()
		ch := cc.pending[f.ID]
		delete(cc.pending, f.ID)
		cc.lastUse = time.Now()
		cc.mu.Unlock()
		if ch == nil {
			continue // the caller gave up; its response is dropped
		}
		if f.Code != 0 {
			ch <- response{err: &Error{Code: f.Code, Message: f.Message}}
		} else {
			ch <- response{payload: f.Payload}
		}
	}
}

func (cc *clientConn) unavailable(err error) error { return unavailable(cc.addr, err) }

// closeIfIdle closes the connection if no call is in flight and none
// started or finished for idle; otherwise it returns when to check again.
// The check and the close happen under the pool lock and cc.mu together,
// so a call either registered first (and the connection stays) or finds
// it closed before queueing its request (and retries on a new one).
func (cc *clientConn) closeIfIdle(idle time.Duration) (next time.Time, closed bool) {
	c := cc.client
	c.mu.Lock()
	cc.mu.Lock()
	now := time.Now()
	switch {
	case cc.err != nil:
		cc.mu.Unlock()
		c.mu.Unlock()
		return time.Time{}, true
	case len(cc.pending) > 0:
		next = now.Add(idle)
	case now.Sub(cc.lastUse) < idle:
		next = cc.lastUse.Add(idle)
	default:
		c.forgetLocked(cc)
		conn := cc.dieLocked(cc.unavailable(errIdle))
		cc.mu.Unlock()
		c.mu.Unlock()
		conn.Close()
		return time.Time{}, true
	}
	cc.mu.Unlock()
	c.mu.Unlock()
	return next, false
}

// fail marks the connection dead with reason err, closes the socket and
// removes it from the pool. Only the first call has an effect; it reports
// whether this call was the first.
func (cc *clientConn) fail(err error) bool {
	// Out of the pool before done closes: a call that sees this connection
	// dead (errNotSent) retries once and must then get a fresh one.
	cc.client.forget(cc)
	cc.mu.Lock()
	if cc.err != nil {
		cc.mu.Unlock()
		return false
	}
	conn := cc.dieLocked(err)
	cc.mu.Unlock()
	if conn != nil {
		conn.Close()
	}
	return true
}

// dieLocked marks the live connection dead with reason err (cc.mu held):
// callers in flight learn it from done. It returns the socket for the
// caller to close once the locks are released (nil if never dialed).
func (cc *clientConn) dieLocked(err error) net.Conn {
	cc.err = err
	cc.pending = nil
	close(cc.done)
	return cc.conn
}

func (cc *clientConn) reason() error {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.err
}

// call queues the encoded request buf, whose call id is id, and waits for
// its response. It takes ownership of buf unless it returns errNotSent.
func (cc *clientConn) call(ctx context.Context, id uint64, buf *[]byte) ([]byte, error) {
	ch := make(chan response, 1)
	cc.mu.Lock()
	if cc.err != nil {
		cc.mu.Unlock()
		return nil, errNotSent
	}
	cc.pending[id] = ch
	cc.lastUse = time.Now()
	cc.mu.Unlock()

	select {
	case cc.queue <- buf:
	case <-cc.done:
		return nil, errNotSent
	case <-ctx.Done():
		cc.forgetCall(id)
		putBuf(buf)
		return nil, ctx.Err()
	}

	select {
	case r := <-ch:
		return r.payload, r.err
	case <-cc.done:
		select {
		case r := <-ch: // the response won the race with the failure
			return r.payload, r.err
		default:
			return nil, cc.reason()
		}
	case <-ctx.Done():
		cc.forgetCall(id)
		return nil, ctx.Err()
	}
}

func (cc *clientConn) forgetCall(id uint64) {
	cc.mu.Lock()
	delete(cc.pending, id) // no-op on the nil map of a dead connection
	cc.mu.Unlock()
}
