package transport_test

import (
	"bytes"
	"crypto/tls"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/transport"
	"github.com/lockmesh/lockmesh/transport/transporttest"
)

func TestMutualTLS(t *testing.T) {
	ca := transporttest.NewCA(t)
	s := listen(t, transport.Config{TLS: ca.Issue("server")}, echo)
	c := newClient(t, transport.Config{TLS: ca.Issue("client")})
	got, err := c.Call(ctxTimeout(t, 5*time.Second), s.Addr(), 3, []byte("secret"))
	if err != nil {
		t.Fatalf("Call over mTLS: %v", err)
	}
	if !bytes.Equal(got, []byte("\x03secret")) {
		t.Fatalf("Call over mTLS = %q", got)
	}
}

func TestTLSRejects(t *testing.T) {
	ca := transporttest.NewCA(t)
	other := transporttest.NewCA(t)
	var logs lockedBuffer
	s := listen(t, transport.Config{
		TLS:    ca.Issue("server"),
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	}, echo)
	plainServer := listen(t, transport.Config{}, echo)

	for _, tc := range []struct {
		name string
		cfg  transport.Config
		addr string
	}{
		{"client cert from another CA", transport.Config{TLS: other.Issue("intruder")}, s.Addr()},
		{"client without cert", transport.Config{TLS: noCert(ca.Issue("client"))}, s.Addr()},
		{"server cert from another CA", transport.Config{TLS: clientCertFrom(other.Issue("client"), ca)}, s.Addr()},
		{"plaintext client to TLS server", transport.Config{}, s.Addr()},
		{"TLS client to plaintext server", transport.Config{TLS: ca.Issue("client")}, plainServer.Addr()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newClient(t, tc.cfg)
			// A rejected handshake fails the call, not a retry until
			// the context ends: it must end before its 30s context.
			ctx := ctxTimeout(t, 30*time.Second)
			_, err := c.Call(ctx, tc.addr, 1, []byte("hi"))
			if !errors.Is(err, transport.ErrUnavailable) {
				t.Fatalf("Call = %v, want ErrUnavailable", err)
			}
			if ctx.Err() != nil {
				t.Fatalf("the rejected call ended with its context (%v), not at the rejection", ctx.Err())
			}
		})
	}
	// The server rejected those peers, it did not just lose them.
	deadline := time.Now().Add(30 * time.Second)
	for strings.Count(logs.String(), "TLS handshake failed") < 4 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := strings.Count(logs.String(), "TLS handshake failed"); n < 4 {
		t.Fatalf("server logged %d failed handshakes, want 4:\n%s", n, logs.String())
	}
}

func noCert(cfg *tls.Config) *tls.Config {
	cfg.Certificates = nil
	return cfg
}

// clientCertFrom gives cfg a client certificate from ca, which ca's
// servers accept, while cfg keeps trusting only its own CA for servers.
func clientCertFrom(cfg *tls.Config, ca *transporttest.CA) *tls.Config {
	cfg.Certificates = []tls.Certificate{ca.Certificate("client")}
	return cfg
}
