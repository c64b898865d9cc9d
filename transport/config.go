package transport

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"
)

// DefaultMaxFrameSize is the frame body limit used when Config.MaxFrameSize
// is zero.
const DefaultMaxFrameSize = 4 << 20

// maxFrameSizeLimit is the largest MaxFrameSize Config accepts; it fits the
// 4-byte length prefix and an int on every platform.
const maxFrameSizeLimit = 1 << 30

// DefaultDialTimeout is the dial (and TLS handshake) timeout used when
// Config.DialTimeout is zero.
const DefaultDialTimeout = 2 * time.Second

// DefaultMaxConcurrentRequests is the per-connection handler limit used
// when Config.MaxConcurrentRequests is zero.
const DefaultMaxConcurrentRequests = 4096

// Server connection limits used where the Config fields are zero. A peer
// holds one pooled connection to each other peer (per Client), so the
// caps leave room for hundreds of peers while bounding what connections
// that send nothing can cost (2 goroutines and their buffers each).
const (
	// DefaultHandshakeTimeout bounds a new connection's TLS handshake and
	// first frame: Consul's RPC handshake timeout.
	DefaultHandshakeTimeout = 5 * time.Second
	// DefaultIdleTimeout closes a server connection that has received no
	// frame and answered no request for this long.
	DefaultIdleTimeout = 2 * time.Minute
	// DefaultMaxConns caps the proven connections a Server holds at
	// once.
	DefaultMaxConns = 1024
	// DefaultMaxUnprovenConns caps the connections a Server holds that
	// have not yet proved themselves: twice DefaultMaxConnsPerIP, so
	// that one address cannot fill it alone.
	DefaultMaxUnprovenConns = 256
	// DefaultMaxConnsPerIP caps the unproven connections, and the
	// strangers' proven ones, from one remote address.
	DefaultMaxConnsPerIP = 128
	// DefaultMaxPendingBytes caps the request and response bytes one
	// server connection holds: two of the largest frames.
	DefaultMaxPendingBytes = 8 << 20
)

// Config configures a Server or a Client. The zero value is valid: plaintext
// TCP with default limits and no logging.
type Config struct {
	// TLS, when non-nil, is used for both listening (server side) and
	// dialing (client side), so one config with Certificates +
	// RootCAs/ClientCAs + ClientAuth = RequireAndVerifyClientCert gives
	// mutual TLS. When ServerName is empty the client verifies the host
	// part of the address it dials (an IP SAN for "127.0.0.1:7948").
	TLS *tls.Config

	// MaxFrameSize caps the body of every frame read or written, in bytes.
	// A peer that sends a bigger frame is disconnected. 0 means
	// DefaultMaxFrameSize. Both ends should use the same value.
	MaxFrameSize int

	// DialTimeout bounds connecting to a peer, TLS handshake included, and
	// the server side of the TLS handshake. 0 means DefaultDialTimeout.
	DialTimeout time.Duration

	// MaxConcurrentRequests caps the handlers running at once for one
	// server connection; the connection stops reading until one returns.
	// 0 means DefaultMaxConcurrentRequests.
	MaxConcurrentRequests int

	// MaxPendingBytes caps the bytes a server connection holds for its
	// peer: the bodies of its requests whose handlers run, and its
	// responses from when their handler returns until they are written to
	// the socket. While they reach it the connection reads no more
	// requests, and a handler that returns waits, its response not yet
	// copied, until writes make room; a peer that reads nothing for
	// IdleTimeout is disconnected. One frame larger than the budget
	// passes alone. 0 means DefaultMaxPendingBytes.
	MaxPendingBytes int

	// AnswerBound, when set, tells the server the most bytes the Handler
	// can answer the request of method whose body is body (it must not
	// keep or change body).
	// The server reserves them in MaxPendingBytes before it runs the
	// handler, so the answers that running handlers make can never hold
	// more memory than the budget, however many small requests a peer
	// pipelines without reading; an answer over its bound waits for room
	// like any other. It must not block. Nil reserves nothing: handlers'
	// answers are counted only once they return.
	AnswerBound func(method uint8, body []byte) int

	// HandshakeTimeout bounds how long a new server connection may take to
	// complete its TLS handshake (also bounded by DialTimeout) and its
	// first frame; one that has not sent a whole frame by then is closed.
	// It is how long a stalled connection holds an unproven slot, at
	// most (MaxUnprovenConns). 0 means DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration

	// IdleTimeout closes a server connection that has neither received a
	// frame nor answered a request for this long (one with a handler still
	// running is not idle). A frame, once its first byte has arrived, must
	// arrive whole, and a batch of responses must be written, within at
	// most IdleTimeout (at least half of it: deadlines move lazily), so a
	// peer that dribbles or stops reading cannot hold a connection. A Client closes its own pooled connection once it
	// has had no call in flight for IdleTimeout/2 and redials on the next
	// call, so the server never closes a connection under a call; give
	// both ends the same value. 0 means DefaultIdleTimeout.
	IdleTimeout time.Duration

	// MaxConns caps the proven connections a Server holds open at once:
	// with TLS, those whose handshake is done; without, those that have
	// sent a valid request. A connection that proves itself over it is
	// closed (and logged) before its first request is handled. Connections
	// still proving themselves count against MaxUnprovenConns instead.
	// 0 means DefaultMaxConns.
	MaxConns int

	// MaxUnprovenConns caps the connections a Server holds that have not
	// yet proved themselves (see MaxConns). None is refused: a new one
	// makes room by closing the oldest unproven connection from its IP
	// when that IP has MaxConnsPerIP of them, else the oldest of all when
	// MaxUnprovenConns are unproven. So connections that stall before or
	// in their handshake (HandshakeTimeout closes them) cannot keep a
	// peer out, and an IP at its MaxConnsPerIP pushes out only its own.
	// To push out a peer's connection, a flood must open MaxUnprovenConns
	// connections (MaxConnsPerIP from the peer's own IP) while that one
	// completes its handshake; the peer then redials. 0 means
	// DefaultMaxUnprovenConns.
	MaxUnprovenConns int

	// MaxConnsPerIP caps, per remote IP address, the unproven connections
	// (one more pushes out that IP's oldest) and, separately, the
	// strangers' proven ones (one more is closed). Members' connections
	// (Known) are not counted. 0 means DefaultMaxConnsPerIP.
	MaxConnsPerIP int

	// Known, when non-nil and with TLS, tells a member's connection from
	// a stranger's by the verified certificate, so that strangers cannot
	// fill MaxConns: they hold at most MaxConns-ReservedConns, while a
	// member is admitted as long as fewer than MaxConns are proven. The
	// Server calls it once per connection, from the connection's
	// goroutine, right after the TLS handshake, with its state (never
	// nil; remote is the TCP peer's address); it must be safe for
	// concurrent use and must not block for long. Without TLS it is never
	// called: an address proves nothing (127.0.0.1 is every local
	// process), so every connection is a stranger's. nil makes everyone
	// a stranger with all of MaxConns to share. node supplies one that
	// knows the layout's peers by their certificates' names.
	Known func(remote net.Addr, state *tls.ConnectionState) bool

	// ReservedConns is the part of MaxConns strangers cannot take when
	// Known is set and TLS is on (it has no effect otherwise: nobody could
	// use it). 0 means MaxConns/4.
	ReservedConns int

	// Dial, when non-nil, replaces the TCP dialer: tests use it to put a
	// fault-injecting network under the Client. TLS, when set, is layered
	// on top of the returned connection.
	Dial func(ctx context.Context, addr string) (net.Conn, error)

	// Logger receives connection-level errors (bad frames, failed
	// handshakes, handler panics). nil discards them.
	Logger *slog.Logger
}

// DefaultConfig returns a Config with every default filled in.
func DefaultConfig() Config {
	return Config{
		MaxFrameSize:          DefaultMaxFrameSize,
		DialTimeout:           DefaultDialTimeout,
		MaxConcurrentRequests: DefaultMaxConcurrentRequests,
		HandshakeTimeout:      DefaultHandshakeTimeout,
		IdleTimeout:           DefaultIdleTimeout,
		MaxConns:              DefaultMaxConns,
		MaxUnprovenConns:      DefaultMaxUnprovenConns,
		MaxConnsPerIP:         DefaultMaxConnsPerIP,
		MaxPendingBytes:       DefaultMaxPendingBytes,
		ReservedConns:         DefaultMaxConns / 4,
	}
}

// Validate reports a Config that cannot work.
func (c Config) Validate() error {
	var errs []error
	if c.MaxFrameSize != 0 && (c.MaxFrameSize < minFrameSize || c.MaxFrameSize > maxFrameSizeLimit) {
		errs = append(errs, fmt.Errorf("transport: MaxFrameSize %d outside [%d, %d]; use 0 for the default of %d", c.MaxFrameSize, minFrameSize, maxFrameSizeLimit, DefaultMaxFrameSize))
	}
	if c.DialTimeout < 0 {
		errs = append(errs, fmt.Errorf("transport: DialTimeout %v is negative; use 0 for the default of %v", c.DialTimeout, DefaultDialTimeout))
	}
	if c.MaxConcurrentRequests < 0 {
		errs = append(errs, fmt.Errorf("transport: MaxConcurrentRequests %d is negative; use 0 for the default of %d", c.MaxConcurrentRequests, DefaultMaxConcurrentRequests))
	}
	for _, d := range []struct {
		field string
		v     time.Duration
		def   time.Duration
	}{
		{"HandshakeTimeout", c.HandshakeTimeout, DefaultHandshakeTimeout},
		{"IdleTimeout", c.IdleTimeout, DefaultIdleTimeout},
	} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("transport: %s %v is negative; use 0 for the default of %v", d.field, d.v, d.def))
		}
	}
	for _, n := range []struct {
		field string
		v     int
		def   int
	}{
		{"MaxConns", c.MaxConns, DefaultMaxConns},
		{"MaxUnprovenConns", c.MaxUnprovenConns, DefaultMaxUnprovenConns},
		{"MaxConnsPerIP", c.MaxConnsPerIP, DefaultMaxConnsPerIP},
		{"MaxPendingBytes", c.MaxPendingBytes, DefaultMaxPendingBytes},
		{"ReservedConns", c.ReservedConns, cmp.Or(c.MaxConns, DefaultMaxConns) / 4},
	} {
		if n.v < 0 {
			errs = append(errs, fmt.Errorf("transport: %s %d is negative; use 0 for the default of %d", n.field, n.v, n.def))
		}
	}
	if maxConns := cmp.Or(c.MaxConns, DefaultMaxConns); c.ReservedConns > maxConns {
		errs = append(errs, fmt.Errorf("transport: ReservedConns %d is more than MaxConns %d; use at most MaxConns", c.ReservedConns, maxConns))
	}
	return errors.Join(errs...)
}

// withDefaults returns c with zero fields replaced by defaults.
func (c Config) withDefaults() Config {
	if c.MaxFrameSize == 0 {
		c.MaxFrameSize = DefaultMaxFrameSize
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.MaxConcurrentRequests == 0 {
		c.MaxConcurrentRequests = DefaultMaxConcurrentRequests
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.MaxConns == 0 {
		c.MaxConns = DefaultMaxConns
	}
	if c.MaxUnprovenConns == 0 {
		c.MaxUnprovenConns = DefaultMaxUnprovenConns
	}
	if c.MaxConnsPerIP == 0 {
		c.MaxConnsPerIP = DefaultMaxConnsPerIP
	}
	if c.MaxPendingBytes == 0 {
		c.MaxPendingBytes = DefaultMaxPendingBytes
	}
	if c.ReservedConns == 0 {
		c.ReservedConns = c.MaxConns / 4
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}
