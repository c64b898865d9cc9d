package transport

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"time"
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
// With a timeout, a burst that is not written in time fails the loop; the
// write deadline moves only when less than half of timeout is left, so a
// burst has between half of timeout and all of it. It returns nil
// when done is closed and the write error otherwise; it never closes conn
// itself. The buffer is allocated with the first frame, so a connection
// that never gets one (a client that sends nothing) costs none.
func writeLoop(conn net.Conn, queue <-chan *[]byte, done <-chan struct{}, timeout time.Duration) error {
	var bw *bufio.Writer
	var deadline time.Time
	for {
		select {
		case b := <-queue:
			if bw == nil {
				bw = bufio.NewWriterSize(conn, writeBufSize)
			}
			// At least half of timeout for this burst; moved only when
			// less is left, so not at every burst.
			if now := time.Now(); timeout > 0 && deadline.Sub(now) < timeout/2 {
				deadline = now.Add(timeout)
				conn.SetWriteDeadline(deadline)
			}
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

// readDeadline keeps a connection's read deadline, setting it only when it
// must move: on a busy connection about once per half period rather than
// once per frame.
type readDeadline struct {
	conn net.Conn
	at   time.Time
}

func (r *readDeadline) set(t time.Time) {
	r.at = t
	r.conn.SetReadDeadline(t)
}

// atLeast moves the deadline to d from now if less than d/2 is left.
func (r *readDeadline) atLeast(d time.Duration) {
	if now := time.Now(); r.at.Sub(now) < d/2 {
		r.set(now.Add(d))
	}
}

// isTimeout reports a read or write deadline that passed.
func isTimeout(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }

// isClosedConn reports the errors of a connection closed on purpose or by
// the peer.
func isClosedConn(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed)
}

var errUnexpectedKind = errors.New("unexpected frame kind")
