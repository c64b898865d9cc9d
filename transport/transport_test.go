package transport_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lockmesh/lockmesh/transport"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// echo answers with the method number followed by the body.
func echo(_ context.Context, method uint8, body []byte) ([]byte, error) {
	return append([]byte{method}, body...), nil
}

// listen starts a server on a free loopback port, closed at test end.
func listen(t testing.TB, cfg transport.Config, h transport.Handler) *transport.Server {
	t.Helper()
	s, err := transport.Listen("127.0.0.1:0", cfg, h)
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func newClient(t testing.TB, cfg transport.Config) *transport.Client {
	t.Helper()
	c, err := transport.NewClient(cfg)
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func ctxTimeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// lockedBuffer collects log output written from several goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestRoundTrip(t *testing.T) {
	s := listen(t, transport.Config{}, echo)
	c := newClient(t, transport.Config{})
	ctx := ctxTimeout(t, 5*time.Second)
	for _, body := range [][]byte{nil, {}, []byte("hello"), bytes.Repeat([]byte{0xab}, 100_000)} {
		got, err := c.Call(ctx, s.Addr(), 7, body)
		if err != nil {
			t.Fatalf("Call(%d bytes): %v", len(body), err)
		}
		if want := append([]byte{7}, body...); !bytes.Equal(got, want) {
			t.Fatalf("Call(%d bytes) = %d bytes, want %d", len(body), len(got), len(want))
		}
	}
}

func TestConcurrentCalls(t *testing.T) {
	s := listen(t, transport.Config{}, echo)
	c := newClient(t, transport.Config{})
	ctx := ctxTimeout(t, 10*time.Second)
	const workers, calls = 64, 200
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range calls {
				body := fmt.Appendf(nil, "worker %d call %d", w, i)
				method := uint8(w*calls + i)
				got, err := c.Call(ctx, s.Addr(), method, body)
				if err != nil {
					errs <- fmt.Errorf("worker %d call %d: %w", w, i, err)
					return
				}
				if want := append([]byte{method}, body...); !bytes.Equal(got, want) {
					errs <- fmt.Errorf("worker %d call %d: got %q, want %q", w, i, got, want)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestRemoteErrors(t *testing.T) {
	s := listen(t, transport.Config{}, func(_ context.Context, method uint8, _ []byte) ([]byte, error) {
		switch method {
		case 1:
			return nil, &transport.Error{Code: 123, Message: "key is locked"}
		case 2:
			return nil, fmt.Errorf("shard 4: %w", &transport.Error{Code: 200, Message: "not leader"})
		case 3:
			return nil, errors.New("disk full")
		case 4:
			panic("handler bug")
		case 5:
			return nil, &transport.Error{Message: "no code"}
		}
		return nil, nil
	})
	c := newClient(t, transport.Config{})
	ctx := ctxTimeout(t, 5*time.Second)
	for _, tc := range []struct {
		method uint8
		code   uint16
		msg    string
	}{
		{1, 123, "key is locked"},
		{2, 200, "not leader"},
		{3, transport.CodeInternal, "disk full"},
		{4, transport.CodeInternal, "handler panicked: handler bug"},
		{5, transport.CodeInternal, "no code"},
	} {
		_, err := c.Call(ctx, s.Addr(), tc.method, nil)
		var e *transport.Error
		if !errors.As(err, &e) {
			t.Fatalf("method %d: err = %v, want *transport.Error", tc.method, err)
		}
		if e.Code != tc.code || !strings.Contains(e.Message, tc.msg) {
			t.Errorf("method %d: got code %d message %q, want code %d message containing %q", tc.method, e.Code, e.Message, tc.code, tc.msg)
		}
		if errors.Is(err, transport.ErrUnavailable) {
			t.Errorf("method %d: remote error %v must not be ErrUnavailable", tc.method, err)
		}
	}
	// The connection survives handler errors and panics.
	if _, err := c.Call(ctx, s.Addr(), 0, nil); err != nil {
		t.Fatalf("Call after errors: %v", err)
	}
}

// blocker is a handler that waits for ctx on method 1 and echoes otherwise.
type blocker struct {
	started  chan struct{}
	canceled atomic.Int32
}

func newBlocker() *blocker { return &blocker{started: make(chan struct{}, 100)} }

func (b *blocker) handle(ctx context.Context, method uint8, body []byte) ([]byte, error) {
	if method != 1 {
		return echo(ctx, method, body)
	}
	b.started <- struct{}{}
	<-ctx.Done()
	b.canceled.Add(1)
	return nil, ctx.Err()
}

func TestCallContextTimeout(t *testing.T) {
	b := newBlocker()
	s := listen(t, transport.Config{}, b.handle)
	c := newClient(t, transport.Config{})

	// The handler never answers: only the deadline ends the call
	// (BenchmarkCallDeadlineOverrun measures how soon after it).
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	timedOut := make(chan error, 1)
	go func() {
		_, err := c.Call(ctx, s.Addr(), 1, nil)
		timedOut <- err
	}()
	select {
	case err := <-timedOut:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Call = %v, want context.DeadlineExceeded", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Call did not return 30s after its 50ms deadline")
	}

	// Cancellation of a call waiting for its response.
	ctx2, cancel2 := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := c.Call(ctx2, s.Addr(), 1, nil)
		done <- err
	}()
	<-b.started
	<-b.started
	cancel2()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Call = %v, want context.Canceled", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Call did not return 30s after cancel")
	}

	// The connection is still good for other calls.
	if _, err := c.Call(ctxTimeout(t, 5*time.Second), s.Addr(), 2, nil); err != nil {
		t.Fatalf("Call after timeout: %v", err)
	}
}

func TestServerCloseMidCall(t *testing.T) {
	b := newBlocker()
	s, err := transport.Listen("127.0.0.1:0", transport.Config{}, b.handle)
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, transport.Config{})
	done := make(chan error, 1)
	go func() {
		_, err := c.Call(ctxTimeout(t, 5*time.Second), s.Addr(), 1, nil)
		done <- err
	}()
	<-b.started
	if err := s.Close(); err != nil {
		t.Fatalf("Server.Close: %v", err)
	}
	// Close waits for handlers, and handlers see ctx cancelled.
	if n := b.canceled.Load(); n != 1 {
		t.Fatalf("%d handlers saw ctx cancelled before Close returned, want 1", n)
	}
	select {
	case err := <-done:
		if !errors.Is(err, transport.ErrUnavailable) {
			t.Fatalf("Call = %v, want ErrUnavailable", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Call did not return 30s after server Close")
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Server.Close: %v", err)
	}
}

func TestRedialAfterRestart(t *testing.T) {
	s := listen(t, transport.Config{}, echo)
	addr := s.Addr()
	c := newClient(t, transport.Config{})
	ctx := ctxTimeout(t, 5*time.Second)
	if _, err := c.Call(ctx, addr, 1, nil); err != nil {
		t.Fatalf("first Call: %v", err)
	}
	s.Close()
	if _, err := c.Call(ctx, addr, 1, nil); !errors.Is(err, transport.ErrUnavailable) {
		t.Fatalf("Call with server down = %v, want ErrUnavailable", err)
	}
	s2, err := transport.Listen(addr, transport.Config{}, echo)
	if err != nil {
		t.Fatalf("Listen again on %s: %v", addr, err)
	}
	defer s2.Close()
	got, err := c.Call(ctx, addr, 9, []byte("back"))
	if err != nil {
		t.Fatalf("Call after restart: %v", err)
	}
	if string(got) != "\x09back" {
		t.Fatalf("Call after restart = %q", got)
	}
}

func TestUnreachable(t *testing.T) {
	// A port that was just free is almost surely refused.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	c := newClient(t, transport.Config{})
	_, err = c.Call(ctxTimeout(t, 5*time.Second), addr, 1, nil)
	if !errors.Is(err, transport.ErrUnavailable) || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("Call = %v, want ErrUnavailable wrapping ECONNREFUSED", err)
	}
	if !strings.Contains(err.Error(), addr) {
		t.Errorf("error %q does not name the peer %s", err, addr)
	}
}

func TestClientClose(t *testing.T) {
	b := newBlocker()
	s := listen(t, transport.Config{}, b.handle)
	c, err := transport.NewClient(transport.Config{})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := c.Call(context.Background(), s.Addr(), 1, nil)
		done <- err
	}()
	<-b.started
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := <-done; !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("in-flight Call = %v, want ErrClosed", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := c.Call(context.Background(), s.Addr(), 2, nil); !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("Call after Close = %v, want ErrClosed", err)
	}
}

func TestFrameTooLarge(t *testing.T) {
	cfg := transport.Config{MaxFrameSize: 1024}
	s := listen(t, cfg, func(_ context.Context, method uint8, body []byte) ([]byte, error) {
		return make([]byte, 2000), nil
	})
	c := newClient(t, cfg)
	ctx := ctxTimeout(t, 5*time.Second)
	if _, err := c.Call(ctx, s.Addr(), 1, make([]byte, 1025)); !errors.Is(err, transport.ErrFrameTooLarge) {
		t.Fatalf("Call with big request = %v, want ErrFrameTooLarge", err)
	}
	_, err := c.Call(ctx, s.Addr(), 1, nil)
	var e *transport.Error
	if !errors.As(err, &e) || e.Code != transport.CodeInternal {
		t.Fatalf("Call with big response = %v, want *Error with CodeInternal", err)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, cfg := range []transport.Config{
		{MaxFrameSize: -1},
		{MaxFrameSize: 10},
		{MaxFrameSize: 1<<30 + 1},
		{DialTimeout: -time.Second},
		{MaxConcurrentRequests: -1},
		{HandshakeTimeout: -time.Second},
		{IdleTimeout: -time.Second},
		{MaxConns: -1},
		{MaxConnsPerIP: -1},
		{MaxPendingBytes: -1},
		{ReservedConns: -1},
		{MaxConns: 4, ReservedConns: 5},
		{ReservedConns: transport.DefaultMaxConns + 1},
	} {
		if cfg.Validate() == nil {
			t.Errorf("Validate(%+v) = nil, want an error", cfg)
		}
		if _, err := transport.NewClient(cfg); err == nil {
			t.Errorf("NewClient(%+v) succeeded", cfg)
		}
	}
	if err := (transport.Config{}).Validate(); err != nil {
		t.Errorf("zero Config: %v", err)
	}
	if err := transport.DefaultConfig().Validate(); err != nil {
		t.Errorf("DefaultConfig: %v", err)
	}
}

// frame returns a length-prefixed frame with the given body.
func frame(body []byte) []byte {
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)
}

func encode(t testing.TB, f transport.Frame) []byte {
	t.Helper()
	b, err := transport.EncodeFrame(nil, &f, 0)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestHostileInput(t *testing.T) {
	var logs lockedBuffer
	cfg := transport.Config{
		MaxFrameSize: 1024,
		Logger:       slog.New(slog.NewTextHandler(&logs, nil)),
	}
	s := listen(t, cfg, echo)
	c := newClient(t, cfg)
	ctx := ctxTimeout(t, 5*time.Second)

	valid := encode(t, transport.Frame{Kind: transport.KindRequest, ID: 1, Payload: []byte("x")})
	array2to31 := []byte{transport.Version, 0xdd, 0x80, 0, 0, 0, 0x01, 0x01}
	cases := []struct {
		name    string
		data    []byte
		wantLog string
	}{
		{"oversized length", binary.BigEndian.AppendUint32(nil, 1<<31), "exceeds the limit of 1024"},
		{"max length", []byte{0xff, 0xff, 0xff, 0xff, 1, 2, 3}, "4294967295"},
		{"garbage", frame([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")), "unknown version 71"},
		{"2^31-element array", frame(array2to31), "array of 2147483648 elements"},
		{"huge bin length", frame([]byte{1, 0x96, 1, 1, 0, 0, 0xa0, 0xc6, 0x7f, 0xff, 0xff, 0xff}), "exceeds the"},
		{"huge str length", frame([]byte{1, 0x96, 1, 1, 0, 0, 0xdb, 0x7f, 0xff, 0xff, 0xff}), "exceeds the"},
		{"unknown version", frame(append([]byte{2}, valid[5:]...)), "unknown version 2"},
		{"response to server", encode(t, transport.Frame{Kind: transport.KindResponse, ID: 1}), "unexpected frame kind"},
		{"unknown kind", frame([]byte{1, 0x96, 3, 1, 0, 0, 0xa0, 0xc4, 0}), "unknown kind 3"},
		{"trailing bytes", frame(append(valid[4:], 0)), "trailing"},
		{"truncated frame", valid[:len(valid)-1], ""},
		{"truncated prefix", []byte{0, 0}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", s.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := conn.Write(tc.data); err != nil {
				t.Fatal(err)
			}
			conn.(*net.TCPConn).CloseWrite() // lets truncated frames end
			conn.SetReadDeadline(time.Now().Add(2 * time.Second))
			n, err := conn.Read(make([]byte, 64))
			if n != 0 || (err == nil || errors.Is(err, os.ErrDeadlineExceeded)) {
				t.Fatalf("server did not close the connection: read %d bytes, err %v", n, err)
			}
			// Other connections keep working.
			if _, err := c.Call(ctx, s.Addr(), 1, []byte("still here")); err != nil {
				t.Fatalf("Call after hostile input: %v", err)
			}
			if tc.wantLog != "" {
				deadline := time.Now().Add(time.Second)
				for !strings.Contains(logs.String(), tc.wantLog) && time.Now().Before(deadline) {
					time.Sleep(5 * time.Millisecond)
				}
				out := logs.String()
				if !strings.Contains(out, tc.wantLog) || !strings.Contains(out, conn.LocalAddr().String()) {
					t.Fatalf("log lacks %q and peer %s:\n%s", tc.wantLog, conn.LocalAddr(), out)
				}
			}
		})
	}
}

func TestNewServerAndDialHook(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s, err := transport.NewServer(ln, transport.Config{}, echo)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var dials atomic.Int32
	c := newClient(t, transport.Config{Dial: func(ctx context.Context, addr string) (net.Conn, error) {
		dials.Add(1)
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}})
	ctx := ctxTimeout(t, 5*time.Second)
	for range 10 {
		if _, err := c.Call(ctx, s.Addr(), 1, nil); err != nil {
			t.Fatal(err)
		}
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("%d dials for 10 calls to one peer, want 1 shared connection", n)
	}
}
