package transport

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"sync"
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
// that never gets one (a client that sends nothing) costs none. With
// written set, it is told the length of each frame once the frame has left
// its buffer (copied into the bufio.Writer or written through it).
func writeLoop(conn net.Conn, queue <-chan *[]byte, done <-chan struct{}, timeout time.Duration, written func(n int)) error {
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
			sent(b, written)
		drain:
			for err == nil {
				select {
				case b := <-queue:
					_, err = bw.Write(*b)
					sent(b, written)
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

// sent recycles b, a frame writeLoop is done with, and tells written.
func sent(b *[]byte, written func(n int)) {
	if written != nil {
		written(len(*b))
	}
	putBuf(b)
}

// byteBudget counts the bytes a server connection holds for its peer, for
// Config.MaxPendingBytes: bodies of requests whose handlers run, and
// responses from when their handler returns until they are written.
// Responses that wait for room count as waiting, not as used: their bytes
// are still the handler's slice, not copied.
type byteBudget struct {
	limit int64

	mu      sync.Mutex
	used    int64         // bytes charged
	waiting int64         // bytes of responses waiting to be charged
	freed   chan struct{} // closed, and replaced, when bytes are released
}

func newByteBudget(limit int) *byteBudget {
	return &byteBudget{limit: int64(limit), freed: make(chan struct{})}
}

// release returns n charged bytes and wakes whoever waits for room.
func (b *byteBudget) release(n int) {
	b.mu.Lock()
	b.used -= int64(n)
	close(b.freed)
	b.freed = make(chan struct{})
	b.mu.Unlock()
}

// acquire charges n bytes once they fit (or once nothing else is charged,
// for n over the limit), counting them as waiting meanwhile. It returns
// false, charging nothing, if done is closed first.
func (b *byteBudget) acquire(n int, done <-chan struct{}) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.waiting += int64(n)
	ok := b.waitLocked(func() bool { return b.used == 0 || b.used+int64(n) <= b.limit }, done)
	b.waiting -= int64(n)
	if ok {
		b.used += int64(n)
	}
	return ok
}

// waitRoom waits until the bytes charged and waiting are under the limit,
// so that a connection reads no more requests while its peer leaves its
// responses unread. It returns false if done is closed first.
func (b *byteBudget) waitRoom(done <-chan struct{}) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.waitLocked(func() bool { return b.used+b.waiting < b.limit }, done)
}

// waitLocked waits, b.mu held, until fits reports true after a release,
// or returns false once done is closed.
func (b *byteBudget) waitLocked(fits func() bool, done <-chan struct{}) bool {
	for !fits() {
		freed := b.freed
		b.mu.Unlock()
		select {
		case <-freed:
			b.mu.Lock()
		case <-done:
			b.mu.Lock()
			return false
		}
	}
	return true
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
