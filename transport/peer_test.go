package transport_test

import (
	"context"
	"crypto/tls"
	"strings"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/transport"
	"github.com/lockmesh/lockmesh/transport/transporttest"
)

// whoAmI answers with the names the server verified for the caller, or
// "anonymous".
func whoAmI(ctx context.Context, _ uint8, _ []byte) ([]byte, error) {
	p, ok := transport.PeerFromContext(ctx)
	if !ok {
		return []byte("no peer in ctx"), nil
	}
	if !p.Verified() {
		return []byte("anonymous"), nil
	}
	return []byte(strings.Join(p.Names, ",")), nil
}

// A handler learns who called: the verified certificate's CommonName and
// DNS SANs over mutual TLS, nobody over plaintext or when the server does
// not verify client certificates.
func TestHandlerKnowsVerifiedCaller(t *testing.T) {
	ca := transporttest.NewCA(t)
	unverified := ca.Issue("server")
	unverified.ClientAuth = tls.RequestClientCert // asks, does not verify

	for _, tc := range []struct {
		name   string
		server *tls.Config
		client *tls.Config
		want   string
	}{
		{"mutual TLS", ca.Issue("server"), ca.Issue("api-1"), "api-1,localhost"},
		{"plaintext", nil, nil, "anonymous"},
		{"client certificate not verified", unverified, ca.Issue("api-1"), "anonymous"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := listen(t, transport.Config{TLS: tc.server}, whoAmI)
			c := newClient(t, transport.Config{TLS: tc.client})
			got, err := c.Call(ctxTimeout(t, 5*time.Second), s.Addr(), 1, nil)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Fatalf("handler saw caller %q, want %q", got, tc.want)
			}
		})
	}
}

func TestPeerIs(t *testing.T) {
	p := transport.Peer{Names: []string{"api-1", "api-1.example"}}
	if !p.Is("api-1") || !p.Is("api-1.example") || p.Is("api-2") || p.Is("") {
		t.Fatalf("Is misreads %v", p.Names)
	}
	if (transport.Peer{}).Is("") {
		t.Fatal("an anonymous peer is nobody, not the empty name")
	}
}
