package raftnet

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime/debug"
	"time"

	pb "github.com/lni/dragonboat/v4/raftpb"

	"github.com/lockmesh/lockmesh/internal/connslots"
)

// accept runs until ln is closed, handing each connection to its own
// goroutine.
func (t *transport) accept(ln net.Listener) {
	defer t.wg.Done()
	var backoff time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors and the like: wait, as net/http
			// does, instead of spinning or giving up.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			t.refusedConn.Warn(t.log(), "raftnet: accept failed; retrying", "addr", t.addr, "err", err, "retry_in", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		slot, ok := t.admit(c)
		if !ok {
			c.Close()
			return // closed
		}
		go t.serve(c, slot)
	}
}

func remoteIP(c net.Conn) string {
	host, _, err := net.SplitHostPort(c.RemoteAddr().String())
	if err != nil {
		return c.RemoteAddr().String()
	}
	return host
}

// admit files c as unproven (internal/connslots), closing the oldest
// unproven connection if it must make room; t.wg counts c. It returns
// false, admitting nothing, once the transport is closed.
func (t *transport) admit(c net.Conn) (*connslots.Slot, bool) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, false
	}
	slot, pushed, why := t.slots.Admit(remoteIP(c), c)
	t.conns[c] = struct{}{}
	t.wg.Add(1)
	t.mu.Unlock()
	if pushed != nil {
		pushed.Close()
		t.refusedConn.Warn(t.log(), "raftnet: closed the oldest connection that had not proved itself, to make room for a new one: "+why, "from", pushed.(net.Conn).RemoteAddr().String(), "for", c.RemoteAddr().String())
	}
	return slot, true
}

// prove files c, which has just proved itself, as a member's connection
// (with TLS) or a stranger's; false, having logged why, when it is over
// the caps and must be closed.
func (t *transport) prove(c net.Conn, slot *connslots.Slot) bool {
	why := t.slots.Prove(slot, t.cfg.TLS != nil)
	if why != "" {
		t.refusedConn.Warn(t.log(), "raftnet: connection refused: "+why, "from", c.RemoteAddr().String())
	}
	return why == ""
}

// release undoes admit once c is done with, closing it.
func (t *transport) release(c net.Conn, slot *connslots.Slot) {
	c.Close()
	t.slots.Release(slot)
	t.mu.Lock()
	delete(t.conns, c)
	t.mu.Unlock()
	t.wg.Done()
}

// serve reads frames from c until it ends, breaks a rule, or the transport
// closes. Whatever happens here, including a panic in Unmarshal or in a
// handler, ends with c closed and the process running.
func (t *transport) serve(c net.Conn, slot *connslots.Slot) {
	defer t.release(c, slot)
	from := c.RemoteAddr().String()
	defer func() {
		if r := recover(); r != nil {
			t.panicked.Warn(t.log(), "raftnet: panic serving a Raft connection; connection closed", "from", from, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
		}
	}()
	if err := c.SetDeadline(time.Now().Add(t.cfg.HandshakeTimeout)); err != nil {
		return
	}
	var conn net.Conn = c
	if t.cfg.TLS != nil {
		tc := tls.Server(c, serverTLS(t.cfg.TLS))
		if err := tc.Handshake(); err != nil {
			if t.slots.Class(slot) != connslots.Gone { // else pushed out, and logged so
				t.refusedTLS.Warn(t.log(), "raftnet: TLS handshake failed; connection closed", "from", from, "err", err)
			}
			return
		}
		if names, ok := t.authorized(tc.ConnectionState()); !ok {
			t.refusedTLS.Warn(t.log(), "raftnet: peer certificate not authorized (Authorize refused it); connection closed", "from", from, "names", names)
			return
		}
		if !t.prove(c, slot) {
			return
		}
		conn = tc
	}
	s := &inbound{t: t, conn: conn, encrypted: t.cfg.TLS != nil, from: from}
	if tc, ok := conn.(*tls.Conn); ok {
		s.names = certNames(tc.ConnectionState().PeerCertificates[0])
	} else {
		// Without TLS, a valid first frame is all a connection can
		// prove: it speaks the protocol. It proves itself before that
		// frame is handed on, so a connection over the caps hands on
		// nothing, and one whose frame was handed on holds its slot.
		s.prove = func() bool { return t.prove(c, slot) }
	}
	for first := true; ; first = false {
		if !first {
			if err := conn.SetReadDeadline(time.Now().Add(t.cfg.IdleTimeout)); err != nil {
				return
			}
		}
		if err := s.frame(); err != nil {
			var fe *frameError
			switch {
			case errors.As(err, &fe):
				t.refusedFrame.Warn(t.log(), "raftnet: bad frame; connection closed", "from", from, "err", err)
			case errors.Is(err, os.ErrDeadlineExceeded):
				t.refusedFrame.Warn(t.log(), "raftnet: peer too slow; connection closed", "from", from, "err", err)
			}
			// io.EOF, closed connections and refused ones (logged by
			// prove) end quietly.
			return
		}
	}
}

// authorized applies Config.Authorize to the verified peer certificate of
// st, returning the names it was given.
func (t *transport) authorized(st tls.ConnectionState) ([]string, bool) {
	if len(st.PeerCertificates) == 0 || len(st.VerifiedChains) == 0 {
		return nil, false
	}
	names := certNames(st.PeerCertificates[0])
	if t.cfg.Authorize == nil {
		return names, true
	}
	return names, t.cfg.Authorize(names)
}

// inbound is the reading state of one served connection.
type inbound struct {
	t         *transport
	conn      net.Conn
	encrypted bool
	from      string   // the remote address, for warnings
	names     []string // the verified certificate's names; nil without TLS
	// prove files the connection as proven, before its first valid frame
	// is handed on (without TLS; nil once done, and with TLS, where the
	// handshake proved it). False: over the caps, and closed.
	prove func() bool
	kind  frameKind // of the first frame; every later one must match
	buf   []byte    // reused between frames up to pieceSize
	hdr   [frameHead]byte
}

// frame reads one frame and hands it to its handler. An error ends the
// connection: a *frameError for a frame that broke the format or a limit,
// errPoison (answered) for the sender's end mark, or the read's error.
func (s *inbound) frame() error {
	if _, err := io.ReadFull(s.conn, s.hdr[:magicSize]); err != nil {
		return err
	}
	if [magicSize]byte(s.hdr[:magicSize]) == poison {
		// dragonboat's sender waits for the same two bytes back.
		s.conn.SetWriteDeadline(time.Now().Add(s.t.cfg.ReadTimeout))
		s.conn.Write(poison[:])
		return errPoison
	}
	if _, err := io.ReadFull(s.conn, s.hdr[magicSize:]); err != nil {
		return err
	}
	h, err := parseHeader(s.hdr[:], s.t.cfg.MaxFrame)
	if err != nil {
		return err
	}
	if s.kind == 0 {
		s.kind = h.kind
	} else if h.kind != s.kind {
		return badFrame("%s on a connection that began with a %s", h.kind, s.kind)
	}
	got, charged := 0, 0
	defer func() { s.t.refund(charged) }()
	body, err := readBody(s.conn, h, s.buf, s.encrypted, func(n int) error {
		if over := got + n - max(got, firstPiece); over > 0 {
			if !s.t.charge(over) {
				return badFrame("%s of %d bytes: %d bytes of frames already held (MaxBuffered %d)", h.kind, h.size, s.t.heldBytes(), s.t.cfg.MaxBuffered)
			}
			charged += over
		}
		got += n
		return s.conn.SetReadDeadline(time.Now().Add(s.t.cfg.ReadTimeout))
	})
	if cap(body) <= pieceSize {
		s.buf = body[:0]
	} else {
		s.buf = nil // a big frame's buffer is not kept
	}
	if err != nil {
		return err
	}
	switch h.kind {
	case kindBatch:
		// A message decodes to far more than its bytes (an empty one is
		// 2 bytes on the wire and hundreds in memory): what decoding
		// would allocate beyond the body is bounded and charged before
		// Unmarshal allocates it.
		extra, err := decodedExtra(body)
		if err != nil {
			return err
		}
		if !s.t.charge(extra) {
			return badFrame("message batch of %d bytes decoding to %d more: %d bytes of frames already held (MaxBuffered %d)", len(body), extra, s.t.heldBytes(), s.t.cfg.MaxBuffered)
		}
		charged += extra
		var b pb.MessageBatch
		if err := unmarshal(&b, h.kind, body); err != nil {
			return err
		}
		if err := s.proved(); err != nil {
			return err
		}
		if g := s.t.cfg.Gate; g != nil {
			if errs := g.Batch(s.names, &b); len(errs) > 0 {
				s.t.refusedMsg.Warn(s.t.log(), "raftnet: Raft messages refused", "from", s.from, "names", s.names, "refused", len(errs), "first", errs[0])
			}
			if len(b.Requests) == 0 {
				return nil
			}
		}
		s.t.onBatch(b)
	case kindChunk:
		var c pb.Chunk
		if err := unmarshal(&c, h.kind, body); err != nil {
			return err
		}
		if err := s.proved(); err != nil {
			return err
		}
		if g := s.t.cfg.Gate; g != nil {
			if err := g.Chunk(s.names, &c); err != nil {
				return badFrame("%v", err)
			}
		}
		if !s.t.onChunk(c) {
			return badFrame("snapshot chunk %d of shard %d from replica %d rejected by dragonboat", c.ChunkId, c.ShardID, c.From)
		}
	}
	return nil
}

// errRefused ends a connection over the caps; prove logged why.
var errRefused = errors.New("raftnet: connection over the caps")

// proved runs s.prove once, at the first valid frame.
func (s *inbound) proved() error {
	if s.prove == nil {
		return nil
	}
	ok := s.prove()
	s.prove = nil
	if !ok {
		return errRefused
	}
	return nil
}

// charge takes n bytes from the MaxBuffered budget, or reports that they
// are not there.
func (t *transport) charge(n int) bool {
	t.heldMu.Lock()
	defer t.heldMu.Unlock()
	if t.held+n > t.cfg.MaxBuffered {
		return false
	}
	t.held += n
	return true
}

func (t *transport) refund(n int) {
	if n == 0 {
		return
	}
	t.heldMu.Lock()
	t.held -= n
	t.heldMu.Unlock()
}

func (t *transport) heldBytes() int {
	t.heldMu.Lock()
	defer t.heldMu.Unlock()
	return t.held
}
