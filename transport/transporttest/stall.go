package transporttest

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"
)

// Stall opens n TCP connections to addr from the loopback address ip (all
// of 127.0.0.0/8 is loopback on Linux, so a test can play many hosts)
// that send hello and then nothing: with a nil hello they stall before a
// TLS handshake or first frame, with a ClientHello in the middle of the
// handshake. They are closed when the test ends, or earlier by the
// caller. Stall fails tb if a dial fails.
func Stall(tb testing.TB, addr, ip string, n int, hello []byte) []net.Conn {
	tb.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 10 * time.Second}
	conns := make([]net.Conn, 0, n)
	tb.Cleanup(func() { CloseAll(conns) })
	for i := range n {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			tb.Fatalf("transporttest: stalled connection %d of %d from %s: %v", i+1, n, ip, err)
		}
		conns = append(conns, c)
		if len(hello) > 0 {
			// The server may have closed it already: what it does then
			// is the test's to see.
			c.SetWriteDeadline(time.Now().Add(time.Second))
			c.Write(hello)
		}
	}
	return conns
}

// CloseAll closes conns.
func CloseAll(conns []net.Conn) {
	for _, c := range conns {
		c.Close()
	}
}

// ClientHello returns the first TLS record a client with cfg sends, its
// ClientHello, for Stall to send: a server that receives it answers with
// its part of the handshake and then waits for the client's.
func ClientHello(tb testing.TB, cfg *tls.Config) []byte {
	tb.Helper()
	cfg = cfg.Clone()
	if cfg.ServerName == "" {
		cfg.ServerName = "localhost"
	}
	client, server := net.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		tls.Client(client, cfg).HandshakeContext(context.Background()) // fails once the pipe closes
	}()
	defer func() {
		server.Close()
		client.Close()
		<-done
	}()
	server.SetReadDeadline(time.Now().Add(10 * time.Second))
	head := make([]byte, 5) // record type, version, length
	if _, err := io.ReadFull(server, head); err != nil {
		tb.Fatalf("transporttest: read ClientHello: %v", err)
	}
	rec := make([]byte, 5+int(binary.BigEndian.Uint16(head[3:])))
	copy(rec, head)
	if _, err := io.ReadFull(server, rec[5:]); err != nil {
		tb.Fatalf("transporttest: read ClientHello: %v", err)
	}
	return rec
}

// Open reports how many of conns their server holds open: it reads from
// all of them at once, discarding what arrives, until the server closes
// them or wait has passed.
func Open(conns []net.Conn, wait time.Duration) int {
	deadline := time.Now().Add(wait)
	var mu sync.Mutex
	var wg sync.WaitGroup
	open := 0
	for _, c := range conns {
		c.SetReadDeadline(deadline)
		wg.Go(func() {
			if _, err := io.Copy(io.Discard, c); errors.Is(err, os.ErrDeadlineExceeded) {
				mu.Lock()
				open++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return open
}
