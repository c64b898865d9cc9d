package raftnet

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"time"

	pb "github.com/lni/dragonboat/v4/raftpb"
)

// Gate decides which of the messages and snapshot chunks that arrive
// reach dragonboat, and hears of every batch sent (internal/raftauth's
// Filter is the one lockmesh uses). Its methods are called on the
// goroutine of the connection concerned, concurrently, and must not
// block for long.
type Gate interface {
	// Batch removes from b.Requests the messages the sender, named by
	// its verified certificate (nil without TLS), may not deliver, and
	// may rewrite the others; it returns why each was removed that is
	// worth a warning (a correct peer with a stale view of the cluster
	// is not).
	Batch(names []string, b *pb.MessageBatch) []error
	// Chunk reports why the sender may not deliver c, if it may not: the
	// connection is then closed.
	Chunk(names []string, c *pb.Chunk) error
	// Sent is told of each batch before it is sent.
	Sent(b *pb.MessageBatch)
}

// DefaultMaxFrame is the frame body limit used when Config.MaxFrame is
// zero: dragonboat's largest message batch plus room for its framing, and
// so also above its largest snapshot chunk.
//
// dragonboat (internal/settings/hard.go) caps a message batch at
// MaxMessageBatchSize, 64 MiB, counted with Message.SizeUpperLimit, which
// overstates every message's encoding; a batch with one message can only
// exceed that if the message alone does, and a replicate message carries
// at most 64 MiB of entries (Soft.MaxEntrySize, counted with
// Entry.SizeUpperLimit, also an overstatement) or a single entry, which
// lockfsm caps at 4 MiB. The extra 1 MiB covers the batch's own fields
// (deployment id, source address, version) and a snapshot's metadata
// (membership) riding in a message. A snapshot chunk carries at most
// SnapshotChunkSize, 2 MiB, of data plus its metadata.
const DefaultMaxFrame = 64<<20 + 1<<20

// maxFrameLimit is the largest MaxFrame Config accepts: an int on every
// platform, with room for dragonboat's biggest frame.
const maxFrameLimit = 1 << 30

// minFrame is the smallest MaxFrame Config accepts: below it dragonboat's
// own snapshot chunks (2 MiB of data) would not fit.
const minFrame = 4 << 20

// Limits used where the Config fields are zero.
const (
	// DefaultHandshakeTimeout bounds a new connection's TLS handshake and
	// the arrival of its first frame header.
	DefaultHandshakeTimeout = 5 * time.Second
	// DefaultIdleTimeout closes a connection on which no frame has begun
	// for this long. dragonboat closes its own idle message connections
	// after a minute, so this never cuts a healthy peer.
	DefaultIdleTimeout = 2 * time.Minute
	// DefaultReadTimeout is how long each piece (pieceSize, 2 MiB) of a
	// frame that has begun may take to arrive, and each piece of a frame
	// this transport sends may take to be written: dragonboat's own TCP
	// transport allows 5 s per 2 MiB.
	DefaultReadTimeout = 5 * time.Second
	// DefaultDialTimeout bounds connecting to a peer, TLS handshake
	// included: dragonboat's GetConnectedTimeoutSecond.
	DefaultDialTimeout = 5 * time.Second
	// DefaultMaxConns caps the proven inbound connections held at once.
	// Each peer keeps one message connection to each other peer, and one
	// per snapshot being sent.
	DefaultMaxConns = 1024
	// DefaultMaxUnprovenConns caps the inbound connections held that
	// have not yet proved themselves: twice DefaultMaxConnsPerIP, so that
	// one address cannot fill it alone.
	DefaultMaxUnprovenConns = 256
	// DefaultMaxConnsPerIP caps the unproven inbound connections, and
	// without TLS the proven ones, from one IP address.
	DefaultMaxConnsPerIP = 128
)

// Config configures the transports a Factory creates. The zero value is
// valid: plaintext TCP, default limits, no logging.
type Config struct {
	// TLS, when non-nil, makes every connection mutual TLS: it is used to
	// listen (Certificates and ClientCAs; ClientAuth is forced to
	// RequireAndVerifyClientCert) and to dial (Certificates and RootCAs;
	// when ServerName is empty the host part of the dialed address is
	// verified, an IP SAN for "127.0.0.1:7000"). LoadTLS builds one from
	// PEM files. Nil means plaintext.
	TLS *tls.Config

	// Authorize, with TLS, decides whether the verified certificate of a
	// peer belongs to an authorized member: it is called with the
	// certificate's CommonName followed by its DNS SANs, once per inbound
	// connection after the handshake and once per outbound connection for
	// the certificate the dialed peer presented. False closes the
	// connection before any frame is read or sent. It is called on the
	// connection's own goroutine, concurrently with other calls, and must
	// not block for long (it delays only that connection). Nil accepts
	// every certificate TLS verified.
	Authorize func(names []string) bool

	// Gate, when not nil, filters what arrives before dragonboat sees it.
	// Nil passes every well-formed message (tests of the transport alone).
	Gate Gate

	// MaxFrame caps the body of every frame read or written, in bytes. A
	// bigger inbound frame closes the connection before its body is read;
	// a bigger outbound one is refused with ErrFrameTooLarge. 0 means
	// DefaultMaxFrame.
	MaxFrame int

	// HandshakeTimeout bounds a new inbound connection's TLS handshake and
	// its first frame header: how long a stalled connection holds an
	// unproven slot, at most (MaxUnprovenConns). 0 means
	// DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration

	// IdleTimeout closes an inbound connection on which no frame has begun
	// for this long. 0 means DefaultIdleTimeout.
	IdleTimeout time.Duration

	// ReadTimeout bounds the arrival of each 2 MiB piece of an inbound
	// frame's body, and the writing of each 2 MiB of an outbound frame.
	// 0 means DefaultReadTimeout.
	ReadTimeout time.Duration

	// DialTimeout bounds connecting to a peer, TLS handshake and
	// authorization included. 0 means DefaultDialTimeout.
	DialTimeout time.Duration

	// MaxConns caps the proven inbound connections held at once: with
	// TLS, those whose handshake is done and whose certificate Authorize
	// accepted (every other is closed), which only members can prove;
	// without TLS, those that have sent a valid frame. One that proves
	// itself over it is closed. Connections still proving themselves
	// count against MaxUnprovenConns instead. 0 means DefaultMaxConns.
	MaxConns int

	// MaxUnprovenConns caps the inbound connections held that have not
	// yet proved themselves (see MaxConns). None is refused: a new one
	// makes room by closing the oldest unproven connection from its IP
	// when that IP has MaxConnsPerIP of them, else the oldest of all when
	// MaxUnprovenConns are unproven. So connections that stall before or
	// in their handshake (HandshakeTimeout closes them) cannot keep a
	// member out, and an IP at its MaxConnsPerIP pushes out only its own.
	// To push out a member's connection, a flood must open
	// MaxUnprovenConns connections (MaxConnsPerIP from the member's own
	// IP) while that one completes its handshake; dragonboat then
	// redials. 0 means DefaultMaxUnprovenConns.
	MaxUnprovenConns int

	// MaxConnsPerIP caps, per remote IP address, the unproven inbound
	// connections (one more pushes out that IP's oldest) and, without
	// TLS, the proven ones (one more is closed at its first frame). With
	// TLS a proven connection is a member's and is not counted by IP.
	// 0 means DefaultMaxConnsPerIP.
	MaxConnsPerIP int

	// MaxBuffered caps the bytes that frame bodies being read hold at
	// once over all inbound connections, beyond the first 64 KiB of each
	// (which every connection may hold: most message batches are
	// smaller). A frame that would exceed it closes its connection; the
	// sender reconnects and dragonboat sends again. 0 means twice
	// MaxFrame; it must be at least MaxFrame. Inbound frames then hold at
	// most (MaxConns+MaxUnprovenConns) x 64 KiB + MaxBuffered (210 MiB by
	// default), plus the buffers' growth (at most twice each).
	MaxBuffered int

	// Logger receives refused connections and frames (rate-limited to one
	// warning per 10 s per kind) and handler panics. Nil discards them.
	Logger *slog.Logger
}

// DefaultConfig returns a Config with every default filled in and no TLS.
func DefaultConfig() Config {
	return Config{}.withDefaults()
}

// Validate reports a Config that cannot work. A Factory's transports
// report it from Start, so dragonboat.NewNodeHost fails with it.
func (c Config) Validate() error {
	var errs []error
	if c.MaxFrame != 0 && (c.MaxFrame < minFrame || c.MaxFrame > maxFrameLimit) {
		errs = append(errs, fmt.Errorf("raftnet: MaxFrame %d outside [%d, %d]; use 0 for the default of %d", c.MaxFrame, minFrame, maxFrameLimit, DefaultMaxFrame))
	}
	for _, d := range []struct {
		field  string
		v, def time.Duration
	}{
		{"HandshakeTimeout", c.HandshakeTimeout, DefaultHandshakeTimeout},
		{"IdleTimeout", c.IdleTimeout, DefaultIdleTimeout},
		{"ReadTimeout", c.ReadTimeout, DefaultReadTimeout},
		{"DialTimeout", c.DialTimeout, DefaultDialTimeout},
	} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("raftnet: %s %v is negative; use 0 for the default of %v", d.field, d.v, d.def))
		}
	}
	for _, n := range []struct {
		field string
		v     int
	}{
		{"MaxConns", c.MaxConns},
		{"MaxUnprovenConns", c.MaxUnprovenConns},
		{"MaxConnsPerIP", c.MaxConnsPerIP},
		{"MaxBuffered", c.MaxBuffered},
	} {
		if n.v < 0 {
			errs = append(errs, fmt.Errorf("raftnet: %s %d is negative; use 0 for the default", n.field, n.v))
		}
	}
	if d := c.withDefaults(); d.MaxBuffered < d.MaxFrame && c.MaxBuffered >= 0 && c.MaxFrame >= 0 {
		errs = append(errs, fmt.Errorf("raftnet: MaxBuffered %d is below MaxFrame %d: a frame of MaxFrame could never be read; raise MaxBuffered", d.MaxBuffered, d.MaxFrame))
	}
	if c.TLS != nil {
		if c.TLS.RootCAs == nil && c.TLS.ClientCAs == nil {
			errs = append(errs, errors.New("raftnet: TLS has neither RootCAs nor ClientCAs; set the CA that signs the peers' certificates (LoadTLS does), or every publicly trusted certificate would pass"))
		}
		if len(c.TLS.Certificates) == 0 && c.TLS.GetCertificate == nil {
			errs = append(errs, errors.New("raftnet: TLS has no certificate; set Certificates (LoadTLS does)"))
		}
	}
	return errors.Join(errs...)
}

// withDefaults returns c with zero fields replaced by defaults.
func (c Config) withDefaults() Config {
	if c.MaxFrame == 0 {
		c.MaxFrame = DefaultMaxFrame
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.ReadTimeout == 0 {
		c.ReadTimeout = DefaultReadTimeout
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = DefaultDialTimeout
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
	if c.MaxBuffered == 0 {
		c.MaxBuffered = 2 * c.MaxFrame
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}
