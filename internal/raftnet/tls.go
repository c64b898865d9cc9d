package raftnet

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
)

// LoadTLS builds Config.TLS from PEM files, as dragonboat's MutualTLS read
// them: caFile holds the CA certificate(s) that sign every peer's
// certificate (both the ones this peer accepts and the ones it dials),
// certFile and keyFile this peer's certificate and key. The result
// requires and verifies a client certificate and TLS 1.2 or later.
func LoadTLS(caFile, certFile, keyFile string) (*tls.Config, error) {
	for _, f := range []struct{ field, path string }{
		{"CAFile", caFile}, {"CertFile", certFile}, {"KeyFile", keyFile},
	} {
		if f.path == "" {
			return nil, fmt.Errorf("raftnet: %s is empty; Raft mutual TLS needs CAFile, CertFile and KeyFile", f.field)
		}
	}
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("raftnet: read CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("raftnet: CA file %s holds no PEM certificate", caFile)
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("raftnet: load certificate %s and key %s: %w", certFile, keyFile, err)
	}
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		RootCAs:      pool,
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS12,
	}, nil
}

// serverTLS is c for accepting: a client certificate is always required
// and verified against the peers' CA, whatever c says.
func serverTLS(c *tls.Config) *tls.Config {
	c = c.Clone()
	c.ClientAuth = tls.RequireAndVerifyClientCert
	if c.ClientCAs == nil {
		c.ClientCAs = c.RootCAs // never the system roots
	}
	c.MinVersion = max(c.MinVersion, tls.VersionTLS12)
	return c
}

// clientTLS is c for dialing target: unless c names the server, the host
// of target is what its certificate must name.
func clientTLS(c *tls.Config, target string) *tls.Config {
	c = c.Clone()
	if c.RootCAs == nil {
		c.RootCAs = c.ClientCAs // never the system roots
	}
	if c.ServerName == "" {
		if host, _, err := net.SplitHostPort(target); err == nil {
			c.ServerName = host
		}
	}
	c.MinVersion = max(c.MinVersion, tls.VersionTLS12)
	return c
}

// certNames is what Authorize is given for a verified certificate: its
// CommonName, then its DNS SANs.
func certNames(cert *x509.Certificate) []string {
	names := make([]string, 0, 1+len(cert.DNSNames))
	if cert.Subject.CommonName != "" {
		names = append(names, cert.Subject.CommonName)
	}
	return append(names, cert.DNSNames...)
}
