package raftnet

import (
	"context"
	"crypto/tls"
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
	return &batchConn{out: c}, nil
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

// batchConn sends message batches; dragonboat uses one from one goroutine.
type batchConn struct{ out *outbound }

func (c *batchConn) Close() { c.out.close() }

func (c *batchConn) SendMessageBatch(b pb.MessageBatch) error {
	return c.out.send(kindBatch, b.Size(), b.MarshalTo)
}

// chunkConn sends the chunks of one snapshot.
type chunkConn struct{ out *outbound }

func (c *chunkConn) Close() { c.out.close() }

func (c *chunkConn) SendChunk(ch pb.Chunk) error {
	return c.out.send(kindChunk, ch.Size(), ch.MarshalTo)
}
