package raftnet

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/lni/dragonboat/v4/raftio"
	pb "github.com/lni/dragonboat/v4/raftpb"
)

// keepAlive is the TCP keep-alive period of dialed connections, as
// dragonboat sets it.
const keepAlive = 10 * time.Second

// GetConnection dials target (a Raft address from dragonboat's registry)
// for message batches.
func (t *transport) GetConnection(ctx context.Context, target string) (raftio.IConnection, error) {
	c, err := t.dial(ctx, target)
	if err != nil {
		return nil, err
	}
	c.watch()
	return &batchConn{t: t, target: target, out: c}, nil
}

// GetSnapshotConnection dials target for the chunks of one snapshot.
func (t *transport) GetSnapshotConnection(ctx context.Context, target string) (raftio.ISnapshotConnection, error) {
	c, err := t.dial(ctx, target)
	if err != nil {
		return nil, err
	}
	return &chunkConn{out: c}, nil
}

// dial connects to target within DialTimeout, completing the TLS
// handshake and checking Authorize on the certificate target presented.
func (t *transport) dial(ctx context.Context, target string) (*outbound, error) {
	ctx, cancel := context.WithTimeout(ctx, t.cfg.DialTimeout)
	defer cancel()
	d := net.Dialer{KeepAlive: keepAlive}
	c, err := d.DialContext(ctx, "tcp", target)
	if err != nil {
		return nil, fmt.Errorf("raftnet: dial %s: %w", target, err)
	}
	if !t.track(c) {
		return nil, ErrClosed
	}
	out := &outbound{t: t, raw: c, conn: c}
	if t.cfg.TLS != nil {
		tc := tls.Client(c, clientTLS(t.cfg.TLS, target))
		if err := tc.HandshakeContext(ctx); err != nil {
			t.untrack(c)
			return nil, fmt.Errorf("raftnet: TLS handshake with %s: %w", target, err)
		}
		if names, ok := t.authorized(tc.ConnectionState()); !ok {
			t.untrack(c)
			return nil, fmt.Errorf("raftnet: %s presented a certificate for %v, which Authorize refused", target, names)
		}
		out.conn, out.encrypted = tc, true
	}
	return out, nil
}

// outbound is one dialed connection.
type outbound struct {
	t         *transport
	raw       net.Conn // the TCP connection, tracked for Close
	conn      net.Conn // raw or TLS over it
	encrypted bool
	buf       []byte // frame buffer, kept between sends up to pieceSize
	// gone, once watch runs, closes when the peer closed the connection
	// (or it was closed here).
	gone chan struct{}
}

// watch starts noticing when the peer closes a batch connection: the
// server writes nothing on one, so a read returns only when the peer's
// process closed it (it stopped or restarted) or the connection was
// closed here. The goroutine ends with the connection.
func (o *outbound) watch() {
	o.gone = make(chan struct{})
	go func() {
		defer close(o.gone)
		var b [1]byte
		_, _ = o.conn.Read(b[:])
	}()
}

// peerGone reports whether watch saw the connection end.
func (o *outbound) peerGone() bool {
	select {
	case <-o.gone:
		return true
	default:
		return false
	}
}

// send marshals m (of size n) as a frame of kind and writes it, within
// ReadTimeout for each 2 MiB.
func (o *outbound) send(kind frameKind, n int, marshal func([]byte) (int, error)) error {
	if n > o.t.cfg.MaxFrame {
		return fmt.Errorf("%w: %s of %d bytes, MaxFrame %d", ErrFrameTooLarge, kind, n, o.t.cfg.MaxFrame)
	}
	if cap(o.buf) < frameHead+n {
		o.buf = make([]byte, frameHead+n)
	}
	buf := o.buf[:frameHead+n]
	if cap(o.buf) > frameHead+pieceSize {
		o.buf = nil
	}
	if _, err := marshal(buf[frameHead:]); err != nil {
		return fmt.Errorf("raftnet: marshal %s: %w", kind, err)
	}
	putHeader(buf, kind, buf[frameHead:], o.encrypted)
	d := o.t.cfg.ReadTimeout * time.Duration(1+n/pieceSize)
	if err := o.conn.SetWriteDeadline(time.Now().Add(d)); err != nil {
		return err
	}
	_, err := o.conn.Write(buf)
	return err
}

func (o *outbound) close() { o.t.untrack(o.raw) }

// batchConn sends message batches to target; dragonboat uses one from
// one goroutine.
type batchConn struct {
	t      *transport
	target string
	out    *outbound
}

func (c *batchConn) Close() { c.out.close() }

// SendMessageBatch sends b. A peer that restarted is reached again without
// a failed send: a connection its old process closed is replaced before
// the send, and a send that fails on the connection (it closed before
// this end noticed) is made once more on a new one. dragonboat takes a
// failed send for the peer being down and drops every message to it for a
// while (its circuit breaker), so after one peer's restart a cluster whose
// third peer then stops would lose its quorum. Raft tolerates the batch
// arriving twice, or the one written into the closing connection being
// lost.
func (c *batchConn) SendMessageBatch(b pb.MessageBatch) error {
	if g := c.t.cfg.Gate; g != nil {
		g.Sent(&b)
	}
	if c.out.peerGone() {
		if err := c.redial(); err != nil {
			return err
		}
	}
	err := c.out.send(kindBatch, b.Size(), b.MarshalTo)
	if err == nil || errors.Is(err, ErrFrameTooLarge) {
		return err
	}
	if rerr := c.redial(); rerr != nil {
		return err
	}
	return c.out.send(kindBatch, b.Size(), b.MarshalTo)
}

// redial replaces the connection with a new one to target.
func (c *batchConn) redial() error {
	c.out.close()
	ctx, cancel := context.WithTimeout(context.Background(), c.t.cfg.DialTimeout)
	defer cancel()
	out, err := c.t.dial(ctx, c.target)
	if err != nil {
		return err
	}
	out.watch()
	c.out = out
	return nil
}

// chunkConn sends the chunks of one snapshot.
type chunkConn struct{ out *outbound }

func (c *chunkConn) Close() { c.out.close() }

func (c *chunkConn) SendChunk(ch pb.Chunk) error {
	return c.out.send(kindChunk, ch.Size(), ch.MarshalTo)
}
