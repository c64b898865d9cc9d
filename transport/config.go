package transport

import (
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
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}
