// Package raftnet is lockmesh's Raft transport: a dragonboat
// raftio.ITransport over TCP, optionally mutual TLS, that a hostile peer
// cannot crash or make allocate what it has not sent.
//
// dragonboat's own TCP transport allocates a frame's claimed 64-bit size
// before reading it and does not recover: a 20-byte header claiming 2^62
// bytes ends the process with "makeslice: len out of range", TLS or not.
// It is internal to dragonboat, so it cannot be wrapped; this package
// speaks the same wire format (see frame.go), so peers running either
// exchange messages during a rolling upgrade, and reads it defensively:
//
//  1. A frame's size is checked against Config.MaxFrame before its body
//     is read; its body buffer grows as bytes arrive (64 KiB first, then
//     doubling, at most 2 MiB at once), and all connections together hold
//     at most Config.MaxBuffered beyond their first 64 KiB.
//  2. Bad magic, header checksum, kind, size or body checksum, a frame of
//     the other kind than the connection began with, or a chunk the
//     handler rejects closes that connection, with a rate-limited warning.
//  3. Unmarshal and the handlers run under a recover per connection: a
//     panic closes that connection and is logged; the process lives.
//  4. Inbound connections must handshake and begin a frame within
//     HandshakeTimeout, begin each later frame within IdleTimeout, and
//     deliver each 2 MiB of a body within ReadTimeout. One that has not
//     yet proved itself (with TLS, by a handshake and a certificate
//     Authorize accepts; without, by its first valid frame) holds one of
//     Config.MaxUnprovenConns slots, and a new connection closes the
//     oldest of them, of its IP or of all, to make room: connections
//     that stall before or in their handshake cannot keep a member out.
//     Proven ones are capped by MaxConns, and without TLS by
//     MaxConnsPerIP from one IP (internal/connslots states the rules).
//     Without TLS nobody proves who it is, so a process that can send
//     valid frames from a member's IP (on a loopback cluster, any local
//     process) shares that IP's slots with it: a plaintext cluster
//     trusts whoever can reach its Raft ports.
//  5. With Config.TLS, every connection is mutual TLS, and Config.Authorize
//     decides from the peer certificate's names whether the peer is an
//     authorized member, on both ends: a certificate of the right CA is
//     not enough.
//
// The deployment id and binary version of what arrives are checked by the
// handlers dragonboat gives Create (Transport.handleRequest and
// Chunk.Add in its internal/transport), as they are behind dragonboat's
// own transport: a mismatched batch is dropped, a mismatched chunk
// rejected (which closes the connection here).
package raftnet

import (
	"errors"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/lni/dragonboat/v4/config"
	"github.com/lni/dragonboat/v4/raftio"

	"github.com/lockmesh/lockmesh/internal/connslots"
	"github.com/lockmesh/lockmesh/internal/throttle"
)

// Name is what the transports report as their Name.
const Name = "lockmesh-raftnet"

// ErrClosed is returned for connections asked of a closed transport.
var ErrClosed = errors.New("raftnet: transport closed")

// ErrFrameTooLarge is returned by a send whose marshaled batch or chunk
// exceeds Config.MaxFrame; nothing is sent and the connection stays
// usable.
var ErrFrameTooLarge = errors.New("raftnet: frame above MaxFrame")

// warnEvery is how often each kind of warning may be logged.
const warnEvery = 10 * time.Second

// Factory returns a dragonboat transport factory (for
// config.NodeHostConfig.Expert.TransportFactory) whose transports follow
// cfg. An invalid cfg makes the transport's Start, and so
// dragonboat.NewNodeHost, fail with cfg.Validate's error.
func Factory(cfg Config) config.TransportFactory {
	return &factory{cfg: cfg}
}

type factory struct{ cfg Config }

// Create returns a transport listening on nhc's listen address (its
// RaftAddress unless ListenAddress is set) once started, handing message
// batches to onBatch and snapshot chunks to onChunk, each on the goroutine
// of the connection it arrived on.
func (f *factory) Create(nhc config.NodeHostConfig, onBatch raftio.MessageHandler, onChunk raftio.ChunkHandler) raftio.ITransport {
	cfg := f.cfg.withDefaults()
	t := &transport{
		cfg:     cfg,
		err:     f.cfg.Validate(),
		addr:    nhc.GetListenAddress(),
		onBatch: onBatch,
		onChunk: onChunk,
		conns:   map[net.Conn]struct{}{},
		// Every proven connection is a member's with TLS (Authorize
		// closes the others) and a stranger's without: nothing to
		// reserve.
		slots: connslots.New(connslots.Limits{MaxConns: cfg.MaxConns, MaxUnproven: cfg.MaxUnprovenConns, MaxPerIP: cfg.MaxConnsPerIP}),
	}
	for _, w := range []*throttle.Warner{&t.refusedConn, &t.refusedTLS, &t.refusedFrame, &t.refusedMsg, &t.panicked} {
		w.Every = warnEvery
	}
	return t
}

// Validate reports whether addr is host:port with a non-empty host and a
// port in 1-65535; IPv6 literals are written in brackets.
func (f *factory) Validate(addr string) bool {
	return validAddr(addr)
}

func validAddr(addr string) bool {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return false
	}
	p, err := strconv.Atoi(port)
	return err == nil && p > 0 && p <= 65535
}

// transport is one NodeHost's listener and the connections it dials.
type transport struct {
	cfg     Config
	err     error // cfg.Validate(), reported by Start
	addr    string
	onBatch raftio.MessageHandler
	onChunk raftio.ChunkHandler

	// warnings, one throttle per kind so that a flood of one kind does
	// not hide another.
	refusedConn, refusedTLS, refusedFrame, refusedMsg, panicked throttle.Warner

	heldMu sync.Mutex
	held   int // body bytes reserved beyond each frame's first piece

	mu     sync.Mutex
	closed bool
	ln     net.Listener
	conns  map[net.Conn]struct{} // open connections, inbound and outbound
	wg     sync.WaitGroup        // accept loop and inbound connections

	slots *connslots.Table // inbound connections' caps

	closeOnce sync.Once
}

func (t *transport) Name() string { return Name }

// Start listens on the transport's address and serves inbound
// connections until Close.
func (t *transport) Start() error {
	if t.err != nil {
		return t.err
	}
	ln, err := net.Listen("tcp", t.addr)
	if err != nil {
		return err
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		ln.Close()
		return ErrClosed
	}
	t.ln = ln
	t.wg.Add(1)
	t.mu.Unlock()
	go t.accept(ln)
	return nil
}

// Close stops listening, closes every connection, inbound and outbound,
// and waits for the goroutines serving inbound ones to return. It is
// idempotent and always returns nil.
func (t *transport) Close() error {
	t.closeOnce.Do(func() {
		t.mu.Lock()
		t.closed = true
		ln := t.ln
		conns := make([]net.Conn, 0, len(t.conns))
		for c := range t.conns {
			conns = append(conns, c)
		}
		t.mu.Unlock()
		if ln != nil {
			ln.Close()
		}
		for _, c := range conns {
			c.Close()
		}
		t.wg.Wait()
	})
	return nil
}

// track registers c so that Close closes it; false (and c closed) once
// the transport is closed.
func (t *transport) track(c net.Conn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		c.Close()
		return false
	}
	t.conns[c] = struct{}{}
	return true
}

// untrack closes c and forgets it.
func (t *transport) untrack(c net.Conn) {
	c.Close()
	t.mu.Lock()
	delete(t.conns, c)
	t.mu.Unlock()
}

func (t *transport) log() *slog.Logger { return t.cfg.Logger }
