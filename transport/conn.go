package transport

import (
	"bufio"
	"errors"
	"io"
	"net"
)

// Buffer sizes for one connection. Small calls are batched into the write
// buffer until the queue drains; the read buffer saves a syscall per frame.
const (
	writeBufSize = 32 << 10
	readBufSize  = 32 << 10
	queueLen     = 256
)

// writeLoop is the single writer of a connection. It copies queued frames
// into a bufio.Writer and flushes only when the queue is empty, so a burst
// of calls leaves in a few large writes while a lone call is sent at once.
// It returns nil when done is closed and the write error otherwise; it never
// closes conn itself.
func writeLoop(conn net.Conn, queue <-chan *[]byte, done <-chan struct{}) error {
	bw := bufio.NewWriterSize(conn, writeBufSize)
	for {
		select {
		case b := <-queue:
			_, err := bw.Write(*b)
			putBuf(b)
		drain:
			for err == nil {
				select {
				case b := <-queue:
					_, err = bw.Write(*b)
					putBuf(b)
				default:
					break drain
				}
			}
			if err == nil {
				err = bw.Flush()
			}
			if err != nil {
				return err
			}
		case <-done:
			return nil
		}
	}
}

// isProtocolError tells a misbehaving peer (worth an error log) from a
// connection that simply ended.
func isProtocolError(err error) bool {
	return errors.Is(err, ErrFrameTooLarge) || errors.Is(err, errBadFrame) || errors.Is(err, errUnexpectedKind)
}

// isClosedConn reports the errors of a connection closed on purpose or by
// the peer.
func isClosedConn(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed)
}

var errUnexpectedKind = errors.New("unexpected frame kind")
