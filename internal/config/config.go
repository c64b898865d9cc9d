// Package config holds the rules a peer's configuration must follow:
// which addresses it may listen on, which protections an exposed peer
// needs (and that TLS needs a gossip key wherever it runs), the ranges of its sizes and durations, and what its TLS config
// must verify. node.Config is the public type, with the docs users read;
// node copies its fields, defaults applied, into a Peer and wraps what
// Check returns in ErrInvalidConfig. The rules read nothing else (the
// RaftTLS files are only checked to exist), so they are tested here,
// table by table, without a peer.
package config

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lockmesh/lockmesh/internal/authz"
	"github.com/lockmesh/lockmesh/transport"
)

// Peer is what the rules read of a node.Config, after its defaults are
// applied (see node.Config for each field).
type Peer struct {
	Name, DataDir                 string
	GossipAddr, RaftAddr, RPCAddr string
	// RaftInMemory says RaftAddr is only a name for a test's in-memory
	// Raft transport: nothing listens on it.
	RaftInMemory bool

	Join                                       []string
	BootstrapExpect, Shards, ReplicationFactor int
	NoReplicas                                 bool
	SessionTTL, LeaseMargin, RTT, DeadAfter    time.Duration

	GossipKey                             []byte
	Insecure                              bool
	TLS                                   *tls.Config
	RaftCAFile, RaftCertFile, RaftKeyFile string
}

// Defaults are the values zero durations stand for, named in the errors
// that refuse negative ones.
type Defaults struct {
	SessionTTL, RTT, DeadAfter time.Duration
}

// RaftTLS reports whether any of the Raft TLS files is set: then all of
// them must be.
func (p Peer) RaftTLS() bool {
	return p.RaftCAFile != "" || p.RaftCertFile != "" || p.RaftKeyFile != ""
}

// Check returns the first rule p breaks, in a fixed order, or nil. The
// error says which field is wrong and what would be right.
func Check(p Peer, d Defaults) error {
	if p.DataDir == "" {
		return fmt.Errorf("DataDir is required")
	}
	for _, a := range p.addrs() {
		host, port, err := net.SplitHostPort(a.addr)
		if err != nil {
			return fmt.Errorf("%s %q is not host:port: %v", a.field, a.addr, err)
		}
		if !validPort(port, true) {
			return fmt.Errorf("%s %q: the port must be a number from 0 to 65535", a.field, a.addr)
		}
		if inMemory := a.field == "RaftAddr" && p.RaftInMemory; host != "" && net.ParseIP(host) == nil && !inMemory {
			return fmt.Errorf("%s %q: the host must be an IP address (127.0.0.1, not localhost): a name would be resolved by the system resolver when the peer listens, and again by every peer that dials it", a.field, a.addr)
		}
	}
	if _, port, _ := net.SplitHostPort(p.RaftAddr); port == "0" {
		return fmt.Errorf("RaftAddr %q needs a fixed port", p.RaftAddr)
	}
	if _, port, _ := net.SplitHostPort(p.RPCAddr); p.Name == p.RPCAddr && port == "0" {
		return fmt.Errorf("Name is required when RPCAddr %q picks its port at start", p.RPCAddr)
	}
	if p.Name == "" || len(p.Name) > 128 {
		return fmt.Errorf("Name %q must be 1 to 128 bytes", p.Name)
	}
	if exposed := Exposed(p); len(exposed) > 0 && !p.Insecure {
		if missing := Missing(p); len(missing) > 0 {
			return fmt.Errorf("%s is not loopback: set %s, or set Insecure to run without them", exposed[0], joinAnd(missing))
		}
	}
	if p.BootstrapExpect < 0 {
		return fmt.Errorf("BootstrapExpect %d is negative", p.BootstrapExpect)
	}
	if p.NoReplicas && (p.BootstrapExpect != 0 || len(p.Join) == 0) {
		return fmt.Errorf("NoReplicas needs Join and no BootstrapExpect: a client-only peer joins an existing cluster")
	}
	for _, j := range p.Join {
		host, port, err := net.SplitHostPort(j)
		if err != nil || host == "" || !validPort(port, false) {
			return fmt.Errorf("Join address %q must be host:port, the gossip address of a peer, with a port from 1 to 65535 (the host may be a name, as a Kubernetes headless Service's)", j)
		}
	}
	if p.BootstrapExpect == 0 && len(p.Join) == 0 {
		return fmt.Errorf("set BootstrapExpect to create a cluster or Join to join one")
	}
	if p.Shards < 1 || p.Shards > 4096 {
		return fmt.Errorf("Shards %d must be between 1 and 4096", p.Shards)
	}
	if p.ReplicationFactor < 1 || p.ReplicationFactor > 9 {
		return fmt.Errorf("ReplicationFactor %d must be between 1 and 9", p.ReplicationFactor)
	}
	// Zero means the default; a negative duration is a mistake, not a
	// request for the default.
	for _, f := range []struct {
		field string
		v     time.Duration
		def   any
	}{
		{"SessionTTL", p.SessionTTL, d.SessionTTL},
		{"LeaseMargin", p.LeaseMargin, "max(TTL/10, 2 RTT)"},
		{"RTT", p.RTT, d.RTT},
		{"DeadAfter", p.DeadAfter, d.DeadAfter},
	} {
		if f.v < 0 {
			return fmt.Errorf("%s %v is negative; use 0 for the default (%v)", f.field, f.v, f.def)
		}
	}
	if p.RTT < time.Millisecond {
		return fmt.Errorf("RTT %v must be at least 1ms", p.RTT)
	}
	// The session must outlive a leader election, or every failover expires
	// every session.
	if p.SessionTTL < 40*p.RTT {
		return fmt.Errorf("SessionTTL %v must be at least 40 RTT (%v)", p.SessionTTL, 40*p.RTT)
	}
	if p.SessionTTL > authz.MaxSessionTTL {
		return fmt.Errorf("SessionTTL %v is above MaxSessionTTL (%v): peers refuse longer sessions", p.SessionTTL, authz.MaxSessionTTL)
	}
	if p.LeaseMargin <= 0 || p.LeaseMargin >= p.SessionTTL/2 {
		return fmt.Errorf("LeaseMargin %v must be positive and below half the SessionTTL", p.LeaseMargin)
	}
	if n := len(p.GossipKey); n != 0 && n != 16 && n != 24 && n != 32 {
		return fmt.Errorf("GossipKey is %d bytes; it must be 16, 24 or 32", n)
	}
	if len(p.GossipKey) > 0 && allZero(p.GossipKey) {
		return fmt.Errorf("GossipKey is all zero bytes: use 16, 24 or 32 random bytes")
	}
	if p.TLS != nil {
		if err := checkTLS(p.TLS, p.Name); err != nil {
			return fmt.Errorf("TLS: %v", err)
		}
	}
	if p.RaftTLS() {
		for _, f := range []struct{ field, path string }{
			{"CAFile", p.RaftCAFile}, {"CertFile", p.RaftCertFile}, {"KeyFile", p.RaftKeyFile},
		} {
			if f.path == "" {
				return fmt.Errorf("RaftTLS.%s is required when RaftTLS is set", f.field)
			}
			if _, err := os.Stat(f.path); err != nil {
				return fmt.Errorf("RaftTLS.%s: %v", f.field, err)
			}
		}
	}
	// Identity rests on gossip: a gossip member is a known peer, and the
	// controller admits one that proves its name with a certificate of
	// the CA. Without a key, any holder of such a certificate joins
	// gossip and is given replicas, the meta shard's among them, so TLS
	// alone would promise what it does not keep, on loopback too.
	if len(p.GossipKey) == 0 {
		var set []string
		if p.TLS != nil {
			set = append(set, "TLS")
		}
		if p.RaftTLS() {
			set = append(set, "RaftTLS")
		}
		if len(set) > 0 {
			verb := "is"
			if len(set) > 1 {
				verb = "are"
			}
			return fmt.Errorf("%s %s set without GossipKey: set GossipKey too (16, 24 or 32 random bytes, the same on every peer); without it, anyone with a certificate of the CA joins gossip and is admitted as a member", joinAnd(set), verb)
		}
	}
	return nil
}

// addrs lists the three listening addresses with their field names, in a
// fixed order, so errors name the first bad one every time.
func (p Peer) addrs() []struct{ field, addr string } {
	return []struct{ field, addr string }{
		{"GossipAddr", p.GossipAddr}, {"RaftAddr", p.RaftAddr}, {"RPCAddr", p.RPCAddr},
	}
}

// Exposed returns the listening addresses (as "Field host:port") that are
// not loopback, in a fixed order. With a test's in-memory Raft transport
// (RaftInMemory), RaftAddr is only a name: nothing listens on it.
func Exposed(p Peer) []string {
	var out []string
	for _, a := range p.addrs() {
		if a.field == "RaftAddr" && p.RaftInMemory {
			continue
		}
		if !IsLoopback(a.addr) {
			out = append(out, a.field+" "+a.addr)
		}
	}
	return out
}

// Missing names the protections of the three links that are not
// configured, as the fields that would set them: GossipKey, RaftTLS, TLS.
func Missing(p Peer) []string {
	var out []string
	if len(p.GossipKey) == 0 {
		out = append(out, "GossipKey")
	}
	if !p.RaftTLS() {
		out = append(out, "RaftTLS")
	}
	if p.TLS == nil {
		out = append(out, "TLS")
	}
	return out
}

// IsLoopback reports whether addr (host:port) is on a loopback IP. An
// empty or unspecified host listens on every interface: not loopback.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// joinAnd joins names as "a", "a and b" or "a, b and c".
func joinAnd(names []string) string {
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}

func allZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

// checkTLS refuses a TLS config that would serve or trust a peer without
// verifying its certificate, or whose own certificate does not name this
// peer: a caller's identity is its verified certificate's names, and a
// peer's Name must be among its own (docs/SECURITY.md).
func checkTLS(t *tls.Config, name string) error {
	switch {
	case t.InsecureSkipVerify:
		return errors.New("InsecureSkipVerify is set: peers' certificates would not be verified")
	case t.ClientAuth != tls.RequireAndVerifyClientCert:
		return fmt.Errorf("ClientAuth is %v; it must be tls.RequireAndVerifyClientCert, or callers without a verified certificate are served", t.ClientAuth)
	case t.ClientCAs == nil:
		return errors.New("ClientCAs is not set: it must hold the CA that issues the peers' certificates")
	case t.RootCAs == nil:
		return errors.New("RootCAs is not set: it must hold the CA that issues the peers' certificates (not the system's roots)")
	case len(t.Certificates) == 0:
		return errors.New("Certificates is empty: the peer needs its own certificate, naming it")
	}
	leaf := t.Certificates[0].Leaf
	if leaf == nil {
		if len(t.Certificates[0].Certificate) == 0 {
			return errors.New("Certificates[0] holds no certificate")
		}
		var err error
		if leaf, err = x509.ParseCertificate(t.Certificates[0].Certificate[0]); err != nil {
			return fmt.Errorf("Certificates[0]: %v", err)
		}
	}
	names := transport.CertNames(leaf)
	if !slices.Contains(names, name) {
		return fmt.Errorf("the certificate names %q, not this peer's Name %q: peers are known by the Name their certificate carries (as its CommonName or a DNS SAN)", names, name)
	}
	return nil
}

// validPort reports whether port is a decimal port number, 0 (pick one
// at start) only when zero is allowed.
func validPort(port string, zero bool) bool {
	n, err := strconv.ParseUint(port, 10, 16)
	return err == nil && (n > 0 || zero) && len(port) <= 5
}
