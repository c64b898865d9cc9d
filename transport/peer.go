package transport

import (
	"context"
	"crypto/tls"
	"crypto/x509"
)

// Peer is who sent a request, as the connection it arrived on knows it.
// A Handler reads it with PeerFromContext.
type Peer struct {
	// Addr is the remote address of the connection.
	Addr string
	// Names are the names the caller's certificate carries (its subject
	// CommonName and DNS SANs), set only when the TLS handshake verified
	// that certificate against the server's ClientCAs. Without TLS, or
	// with a config that does not verify client certificates, it is nil:
	// the caller is anonymous.
	Names []string
}

// Verified reports whether the caller proved an identity (a verified
// client certificate).
func (p Peer) Verified() bool { return len(p.Names) > 0 }

// Is reports whether the caller's verified certificate names name.
func (p Peer) Is(name string) bool {
	for _, n := range p.Names {
		if n == name {
			return true
		}
	}
	return false
}

type peerKey struct{}

// PeerFromContext returns the caller of the request whose Handler got
// ctx. ok is false for a ctx that did not come from a Server.
func PeerFromContext(ctx context.Context) (p Peer, ok bool) {
	p, ok = ctx.Value(peerKey{}).(Peer)
	return p, ok
}

// ContextWithPeer returns ctx carrying p, for code that serves a request
// on a Server's behalf (tests, local calls).
func ContextWithPeer(ctx context.Context, p Peer) context.Context {
	return context.WithValue(ctx, peerKey{}, p)
}

// peerOf is the Peer of a connection from addr whose TLS state is st (nil
// without TLS).
func peerOf(addr string, st *tls.ConnectionState) Peer {
	p := Peer{Addr: addr}
	if st != nil && len(st.VerifiedChains) > 0 && len(st.PeerCertificates) > 0 {
		p.Names = CertNames(st.PeerCertificates[0])
	}
	return p
}

// CertNames lists the names a certificate identifies its holder by: the
// subject's CommonName, then its DNS SANs, without empty names or repeats.
// A lockmesh peer's certificate must carry its member Name among them.
func CertNames(c *x509.Certificate) []string {
	var names []string
	add := func(n string) {
		if n == "" {
			return
		}
		for _, have := range names {
			if have == n {
				return
			}
		}
		names = append(names, n)
	}
	add(c.Subject.CommonName)
	for _, n := range c.DNSNames {
		add(n)
	}
	return names
}
