// Package transporttest provides helpers for tests of transport and of the
// packages built on it: a throwaway certificate authority that issues
// mutual-TLS configs for loopback peers, and connections that stall
// before or in their TLS handshake, from any loopback address.
package transporttest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// CA is a certificate authority created for one test. Its methods fail the
// test through tb on error, so call them from the test goroutine.
type CA struct {
	tb     testing.TB
	cert   *x509.Certificate
	key    *ecdsa.PrivateKey
	pool   *x509.CertPool
	serial atomic.Int64
}

// NewCA returns a fresh ECDSA P-256 certificate authority valid for one
// day.
func NewCA(tb testing.TB) *CA {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatalf("transporttest: CA key: %v", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "lockmesh test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatalf("transporttest: CA certificate: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatalf("transporttest: parse CA certificate: %v", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	ca := &CA{tb: tb, cert: cert, key: key, pool: pool}
	ca.serial.Store(1)
	return ca
}

// Pool returns a pool holding only this CA's certificate.
func (ca *CA) Pool() *x509.CertPool { return ca.pool }

// Certificate issues a leaf certificate for name, usable as both a TLS
// server and client certificate, with SANs name, "localhost", 127.0.0.1
// and ::1.
func (ca *CA) Certificate(name string) tls.Certificate {
	ca.tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		ca.tb.Fatalf("transporttest: key for %s: %v", name, err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.serial.Add(1)),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:     []string{name, "localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		ca.tb.Fatalf("transporttest: certificate for %s: %v", name, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		ca.tb.Fatalf("transporttest: parse certificate for %s: %v", name, err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
}

// Issue returns a mutual-TLS config for the peer name: its own certificate
// from this CA, this CA as the only root for servers and clients, and
// client certificates required. The same config serves as
// transport.Config.TLS for both a Server and a Client.
func (ca *CA) Issue(name string) *tls.Config {
	ca.tb.Helper()
	return &tls.Config{
		Certificates: []tls.Certificate{ca.Certificate(name)},
		RootCAs:      ca.pool,
		ClientCAs:    ca.pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS13,
	}
}
