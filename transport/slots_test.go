package transport_test

import (
	"crypto/tls"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/transport"
	"github.com/lockmesh/lockmesh/transport/transporttest"
)

// floodSize is how many stalled connections the slot tests open: more
// than DefaultMaxConns.
const floodSize = 1100

// floodFrom opens floodSize connections to addr that stall, spread over
// ips in turn; with hello, every other one stalls in the middle of its
// TLS handshake instead of before it.
func floodFrom(t *testing.T, addr string, ips []string, hello []byte) []net.Conn {
	t.Helper()
	var conns []net.Conn
	per := floodSize / len(ips)
	for i, ip := range ips {
		n := per
		if i == 0 {
			n += floodSize % len(ips)
		}
		conns = append(conns, transporttest.Stall(t, addr, ip, n/2, nil)...)
		conns = append(conns, transporttest.Stall(t, addr, ip, n-n/2, hello)...)
	}
	return conns
}

// floodSources are where a slot test's flood comes from: the address
// every peer of a loopback cluster uses (and every local process), and
// eight others.
var floodSources = []struct {
	name string
	ips  []string
}{
	{"from 127.0.0.1", []string{"127.0.0.1"}},
	{"from 127.0.0.2-9", []string{"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5", "127.0.0.6", "127.0.0.7", "127.0.0.8", "127.0.0.9"}},
}

// peersByAddress is Known as node supplied it before issue 27 (finding
// 8): before the handshake, by the peers' IP, which every local process
// shares; after it, by the certificate. The server must not ask it
// before the handshake any more.
func peersByAddress(remote net.Addr, st *tls.ConnectionState) bool {
	if st == nil {
		return remote.(*net.TCPAddr).IP.String() == "127.0.0.1"
	}
	return strings.HasPrefix(st.PeerCertificates[0].Subject.CommonName, "peer-")
}

// Issue 27, finding 8: 1,100 connections that never finish their TLS
// handshake or send a first frame, from the peers' own address or from
// eight others, used to fill the server's slots (MaxConns, counted as
// known peers' by address, or MaxConnsPerIP) so that a peer's redial was
// refused. Connections that have proved nothing now share a small pool
// whose oldest make room for newer ones: a member (by its certificate,
// or without TLS anyone who sends a valid request) still connects and is
// answered, and at most DefaultMaxUnprovenConns of the flood stay open.
// The handshake timeout is a minute, so only that rule can free slots.
func TestUnprovenFloodKeepsNoMemberOut(t *testing.T) {
	transporttest.NeedFiles(t, 4*floodSize+256)
	ca := transporttest.NewCA(t)
	for _, mode := range []struct {
		name   string
		server *tls.Config
		member *tls.Config
	}{
		{"TLS", ca.Issue("peer-1"), ca.Issue("peer-2")},
		{"plaintext", nil, nil},
	} {
		for _, src := range floodSources {
			t.Run(mode.name+" "+src.name, func(t *testing.T) {
				cfg := transport.Config{
					TLS: mode.server, Known: peersByAddress,
					HandshakeTimeout: time.Minute, DialTimeout: time.Minute,
				}
				s := listen(t, cfg, echo)
				var hello []byte
				if mode.server != nil {
					hello = transporttest.ClientHello(t, ca.Issue("stranger"))
				}
				flood := floodFrom(t, s.Addr(), src.ips, hello)
				defer transporttest.CloseAll(flood)

				member := newClient(t, transport.Config{TLS: mode.member, DialTimeout: 10 * time.Second})
				if _, err := member.Call(ctxTimeout(t, 20*time.Second), s.Addr(), 1, []byte("x")); err != nil {
					t.Fatalf("a member's new connection during a flood of %d stalled ones %s: %v", floodSize, src.name, err)
				}
				open := transporttest.Open(flood, 500*time.Millisecond)
				t.Logf("member answered; %d of %d stalled connections still open", open, len(flood))
				if open > transport.DefaultMaxUnprovenConns {
					t.Errorf("%d stalled connections held, want at most DefaultMaxUnprovenConns (%d)", open, transport.DefaultMaxUnprovenConns)
				}
				// The member's connection is proven: it stays, whatever
				// comes after it.
				floodFrom(t, s.Addr(), src.ips, hello)
				if _, err := member.Call(ctxTimeout(t, 20*time.Second), s.Addr(), 1, []byte("y")); err != nil {
					t.Fatalf("the member's connection after a second flood: %v", err)
				}
			})
		}
	}
}

// Stalled connections are closed at HandshakeTimeout, even when it is
// shorter than DialTimeout (which also bounds the server's handshake):
// one that sends a ClientHello and nothing more frees its slot as one
// that sends nothing does.
func TestStalledHandshakeClosedAtHandshakeTimeout(t *testing.T) {
	const handshake = 300 * time.Millisecond
	ca := transporttest.NewCA(t)
	s := listen(t, transport.Config{TLS: ca.Issue("peer-1"), HandshakeTimeout: handshake, DialTimeout: time.Minute}, echo)
	start := time.Now()
	conns := append(transporttest.Stall(t, s.Addr(), "127.0.0.2", 10, nil),
		transporttest.Stall(t, s.Addr(), "127.0.0.2", 10, transporttest.ClientHello(t, ca.Issue("stranger")))...)
	if open := transporttest.Open(conns, 10*time.Second); open != 0 {
		t.Fatalf("%d of %d stalled connections open 10s after they were opened (HandshakeTimeout %v)", open, len(conns), handshake)
	}
	if d := time.Since(start); d < handshake-50*time.Millisecond {
		t.Fatalf("stalled connections closed after %v, before HandshakeTimeout %v", d, handshake)
	}
}

// Without TLS nobody can prove to be a member: Known is never asked, and
// strangers (connections that sent a valid request) share all of
// MaxConns, MaxConnsPerIP from each IP; one more is closed at its first
// request.
func TestPlaintextStrangersShareMaxConns(t *testing.T) {
	cfg := transport.Config{
		MaxConns: 4, ReservedConns: 2, MaxConnsPerIP: 3,
		Known: func(net.Addr, *tls.ConnectionState) bool {
			t.Error("Known asked about a plaintext connection")
			return true
		},
	}
	s := listen(t, cfg, echo)
	for i, c := range []struct {
		ip string
		ok bool
	}{
		{"127.0.0.2", true}, {"127.0.0.2", true}, {"127.0.0.2", true},
		{"127.0.0.2", false}, // MaxConnsPerIP
		{"127.0.0.3", true},  // the reserved slots are anyone's
		{"127.0.0.4", false}, // MaxConns
	} {
		cl := newClient(t, transport.Config{Dial: dialFrom(c.ip, nil)})
		_, err := cl.Call(ctxTimeout(t, 10*time.Second), s.Addr(), 1, nil)
		if c.ok != (err == nil) {
			t.Fatalf("connection %d from %s: err %v, want kept %v", i+1, c.ip, err, c.ok)
		}
	}
}
