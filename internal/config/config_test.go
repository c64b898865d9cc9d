package config

import (
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/transport/transporttest"
)

var defaults = Defaults{SessionTTL: 10 * time.Second, RTT: 100 * time.Millisecond, DeadAfter: 30 * time.Second}

// base is a valid peer on loopback, with node.Config's defaults applied.
func base(gossip, raft, rpc string) Peer {
	return Peer{
		Name: "p1", DataDir: "/tmp/x", GossipAddr: gossip, RaftAddr: raft, RPCAddr: rpc, BootstrapExpect: 3,
		Shards: 16, ReplicationFactor: 3,
		SessionTTL: 10 * time.Second, LeaseMargin: time.Second, RTT: 100 * time.Millisecond, DeadAfter: 30 * time.Second,
	}
}

func loopback() Peer { return base("127.0.0.1:0", "127.0.0.1:7000", "127.0.0.1:0") }

func check(t *testing.T, p Peer, want string) {
	t.Helper()
	err := Check(p, defaults)
	switch {
	case want == "" && err != nil:
		t.Fatalf("Check() = %v, want nil", err)
	case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
		t.Fatalf("Check() = %v, want an error saying %q", err, want)
	}
}

func TestCheckRanges(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*Peer)
		want   string // "" means valid
	}{
		{"valid", func(*Peer) {}, ""},
		{"no data dir", func(p *Peer) { p.DataDir = "" }, "DataDir is required"},
		{"bad gossip addr", func(p *Peer) { p.GossipAddr = "nope" }, `GossipAddr "nope" is not host:port`},
		{"raft port 0", func(p *Peer) { p.RaftAddr = "127.0.0.1:0" }, "needs a fixed port"},
		{"in-memory raft may be a name", func(p *Peer) { p.RaftAddr, p.RaftInMemory = "raft-1:7000", true }, ""},
		{"no name with port 0", func(p *Peer) { p.Name = p.RPCAddr }, "Name is required when RPCAddr"},
		{"name too long", func(p *Peer) { p.Name = strings.Repeat("n", 129) }, "must be 1 to 128 bytes"},
		{"negative expect", func(p *Peer) { p.BootstrapExpect = -1 }, "BootstrapExpect -1 is negative"},
		{"neither bootstrap nor join", func(p *Peer) { p.BootstrapExpect = 0 }, "set BootstrapExpect to create a cluster or Join"},
		{"join only", func(p *Peer) { p.BootstrapExpect, p.Join = 0, []string{"127.0.0.1:7946"} }, ""},
		{"join by name", func(p *Peer) { p.BootstrapExpect, p.Join = 0, []string{"lockmesh-0.lockmesh:7946"} }, ""},
		{"join garbage", func(p *Peer) { p.BootstrapExpect, p.Join = 0, []string{"garbage"} }, `Join address "garbage" must be host:port`},
		{"join port 0", func(p *Peer) { p.Join = []string{"127.0.0.1:0"} }, "port from 1 to 65535"},
		{"join port too big", func(p *Peer) { p.Join = []string{"127.0.0.1:99999"} }, "port from 1 to 65535"},
		{"rpc port too big", func(p *Peer) { p.RPCAddr = "127.0.0.1:99999" }, "the port must be a number from 0 to 65535"},
		{"gossip port not a number", func(p *Peer) { p.GossipAddr = "127.0.0.1:http" }, "the port must be a number"},
		{"client-only bootstrapping", func(p *Peer) { p.NoReplicas = true }, "NoReplicas needs Join and no BootstrapExpect"},
		{"client-only joining", func(p *Peer) { p.NoReplicas, p.BootstrapExpect, p.Join = true, 0, []string{"127.0.0.1:7946"} }, ""},
		{"no shards", func(p *Peer) { p.Shards = 0 }, "Shards 0 must be between 1 and 4096"},
		{"too many shards", func(p *Peer) { p.Shards = 4097 }, "Shards 4097"},
		{"rf too large", func(p *Peer) { p.ReplicationFactor = 10 }, "ReplicationFactor 10"},
		{"negative ttl", func(p *Peer) { p.SessionTTL = -time.Second }, "SessionTTL -1s is negative; use 0 for the default (10s)"},
		{"negative margin", func(p *Peer) { p.LeaseMargin = -time.Millisecond }, "LeaseMargin -1ms is negative; use 0 for the default (max(TTL/10, 2 RTT))"},
		{"negative rtt", func(p *Peer) { p.RTT = -time.Millisecond }, "RTT -1ms is negative; use 0 for the default (100ms)"},
		{"negative dead after", func(p *Peer) { p.DeadAfter = -time.Second }, "DeadAfter -1s is negative; use 0 for the default (30s)"},
		{"rtt too small", func(p *Peer) { p.RTT = time.Microsecond }, "RTT 1µs must be at least 1ms"},
		{"ttl below 40 RTT", func(p *Peer) { p.SessionTTL = 3999 * time.Millisecond }, "SessionTTL 3.999s must be at least 40 RTT (4s)"},
		{"ttl of 40 RTT", func(p *Peer) { p.SessionTTL = 4 * time.Second }, ""},
		{"ttl above the peers' limit", func(p *Peer) { p.SessionTTL = 2 * time.Hour }, "SessionTTL 2h0m0s is above MaxSessionTTL (1h0m0s)"},
		{"margin of half the ttl", func(p *Peer) { p.LeaseMargin = 5 * time.Second }, "LeaseMargin 5s must be positive and below half"},
		{"short gossip key", func(p *Peer) { p.GossipKey = []byte("short") }, "GossipKey is 5 bytes"},
		{"raft TLS half set", func(p *Peer) { p.RaftCertFile = "/nonexistent/c.pem" }, "RaftTLS.CAFile is required when RaftTLS is set"},
		{"raft TLS file missing", func(p *Peer) {
			p.RaftCAFile, p.RaftCertFile, p.RaftKeyFile = "/nonexistent/ca.pem", "/nonexistent/c.pem", "/nonexistent/k.pem"
		}, "RaftTLS.CAFile: stat /nonexistent/ca.pem"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := loopback()
			tc.mutate(&p)
			check(t, p, tc.want)
		})
	}
}

// A peer that listens beyond loopback needs all three protections, or
// Insecure said out loud; on loopback it needs none.
func TestCheckExposed(t *testing.T) {
	dir := t.TempDir()
	var files [3]string
	for i := range files {
		files[i] = filepath.Join(dir, fmt.Sprintf("pem-%d", i))
		if err := os.WriteFile(files[i], nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	key := make([]byte, 32)
	key[0] = 1
	ca := transporttest.NewCA(t)
	secure := func(p Peer) Peer {
		p.GossipKey, p.TLS = key, ca.Issue("p1")
		p.RaftCAFile, p.RaftCertFile, p.RaftKeyFile = files[0], files[1], files[2]
		return p
	}
	withTLS := func(adjust func(*tls.Config)) Peer {
		p := secure(base("10.0.0.5:7946", "10.0.0.5:7947", "10.0.0.5:7948"))
		adjust(p.TLS)
		return p
	}
	with := func(p Peer, adjust func(*Peer)) Peer {
		adjust(&p)
		return p
	}
	exposed := base("10.0.0.5:7946", "10.0.0.5:7947", "10.0.0.5:7948")
	for _, tc := range []struct {
		name string
		peer Peer
		want string // "" means valid
	}{
		{"loopback", loopback(), ""},
		{"loopback v6", base("[::1]:0", "127.0.0.1:7000", "[::1]:0"), ""},
		{"localhost by name", base("[::1]:0", "localhost:7000", "[::1]:0"), "RaftAddr \"localhost:7000\": the host must be an IP address"},
		{"a host name", base("peer-1.example:7946", "127.0.0.1:7000", "127.0.0.1:0"), "GossipAddr \"peer-1.example:7946\": the host must be an IP address"},
		{"all-zero gossip key", with(secure(exposed), func(p *Peer) { p.GossipKey = make([]byte, 16) }), "GossipKey is all zero bytes"},
		{"TLS that does not ask for client certificates", withTLS(func(t *tls.Config) { t.ClientAuth = tls.NoClientCert }), "ClientAuth is NoClientCert; it must be tls.RequireAndVerifyClientCert"},
		{"TLS that does not verify client certificates", withTLS(func(t *tls.Config) { t.ClientAuth = tls.RequireAnyClientCert }), "it must be tls.RequireAndVerifyClientCert"},
		{"TLS that skips verification", withTLS(func(t *tls.Config) { t.InsecureSkipVerify = true }), "InsecureSkipVerify is set"},
		{"TLS without ClientCAs", withTLS(func(t *tls.Config) { t.ClientCAs = nil }), "ClientCAs is not set"},
		{"TLS without RootCAs", withTLS(func(t *tls.Config) { t.RootCAs = nil }), "RootCAs is not set"},
		{"empty TLS config", withTLS(func(t *tls.Config) { *t = tls.Config{} }), "it must be tls.RequireAndVerifyClientCert"},
		{"TLS without a certificate", withTLS(func(t *tls.Config) { t.Certificates = nil }), "Certificates is empty"},
		{"TLS certificate holding nothing", withTLS(func(t *tls.Config) { t.Certificates = []tls.Certificate{{}} }), "Certificates[0] holds no certificate"},
		{"TLS certificate for another name", withTLS(func(t *tls.Config) { t.Certificates = ca.Issue("p2").Certificates }), `the certificate names ["p2" "localhost"], not this peer's Name "p1"`},
		{"rpc on a LAN", base("127.0.0.1:0", "127.0.0.1:7000", "10.0.0.5:7000"),
			"RPCAddr 10.0.0.5:7000 is not loopback: set GossipKey, RaftTLS and TLS, or set Insecure to run without them"},
		{"gossip on every interface", base("0.0.0.0:7946", "127.0.0.1:7000", "127.0.0.1:0"), "GossipAddr 0.0.0.0:7946 is not loopback"},
		{"raft with no host", base("127.0.0.1:0", ":7000", "127.0.0.1:0"), "RaftAddr :7000 is not loopback"},
		{"in-memory raft is not exposed", with(base("127.0.0.1:0", "10.0.0.5:7000", "127.0.0.1:0"), func(p *Peer) { p.RaftInMemory = true }), ""},
		{"all exposed, all protected", secure(exposed), ""},
		{"all exposed, Insecure", with(exposed, func(p *Peer) { p.Insecure = true }), ""},
		{"gossip key missing", with(secure(exposed), func(p *Peer) { p.GossipKey = nil }), "GossipAddr 10.0.0.5:7946 is not loopback: set GossipKey, or set Insecure"},
		{"TLS missing", with(secure(base("127.0.0.1:0", "127.0.0.1:7000", "[2001:db8::1]:7000")), func(p *Peer) { p.TLS = nil }),
			"RPCAddr [2001:db8::1]:7000 is not loopback: set TLS, or set Insecure"},
		{"raft TLS and key missing", with(secure(base("127.0.0.1:0", "192.168.1.2:7000", "127.0.0.1:0")), func(p *Peer) {
			p.RaftCAFile, p.RaftCertFile, p.RaftKeyFile, p.GossipKey = "", "", "", nil
		}), "set GossipKey and RaftTLS, or set Insecure"},
		// Finding 6 of issue 27: with TLS but no key, a certificate of the
		// CA for any name joined gossip and was given replicas, the meta
		// shard's among them, within half a second. On loopback too.
		{"all protected on loopback", secure(loopback()), ""},
		{"TLS without a gossip key on loopback", with(secure(loopback()), func(p *Peer) {
			p.GossipKey, p.RaftCAFile, p.RaftCertFile, p.RaftKeyFile = nil, "", "", ""
		}), "TLS is set without GossipKey: set GossipKey too"},
		{"RaftTLS without a gossip key on loopback", with(secure(loopback()), func(p *Peer) { p.GossipKey, p.TLS = nil, nil }),
			"RaftTLS is set without GossipKey: set GossipKey too"},
		{"TLS and RaftTLS without a gossip key on loopback", with(secure(loopback()), func(p *Peer) { p.GossipKey = nil }),
			"TLS and RaftTLS are set without GossipKey: set GossipKey too"},
		{"TLS and RaftTLS without a gossip key, Insecure", with(secure(exposed), func(p *Peer) { p.GossipKey, p.Insecure = nil, true }),
			"TLS and RaftTLS are set without GossipKey"},
		{"a gossip key alone on loopback", with(loopback(), func(p *Peer) { p.GossipKey = key }), ""},
	} {
		t.Run(tc.name, func(t *testing.T) { check(t, tc.peer, tc.want) })
	}
}

// Exposed and Missing are what node's start-up warning names.
func TestExposedAndMissing(t *testing.T) {
	p := base("0.0.0.0:7946", "127.0.0.1:7000", "10.0.0.5:7000")
	if got, want := Exposed(p), []string{"GossipAddr 0.0.0.0:7946", "RPCAddr 10.0.0.5:7000"}; !slices.Equal(got, want) {
		t.Fatalf("Exposed = %q, want %q", got, want)
	}
	p.RaftAddr, p.RaftInMemory = "10.0.0.5:7001", true
	if got := Exposed(p); len(got) != 2 {
		t.Fatalf("Exposed with in-memory Raft = %q: RaftAddr is only a name", got)
	}
	if got, want := Missing(p), []string{"GossipKey", "RaftTLS", "TLS"}; !slices.Equal(got, want) {
		t.Fatalf("Missing = %q, want %q", got, want)
	}
	p.GossipKey, p.RaftKeyFile = []byte("k"), "key.pem"
	if got, want := Missing(p), []string{"TLS"}; !slices.Equal(got, want) {
		t.Fatalf("Missing = %q, want %q", got, want)
	}
}

func TestIsLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:1": true, "127.8.9.10:1": true, "[::1]:1": true, "[::ffff:127.0.0.1]:1": true,
		":1": false, "0.0.0.0:1": false, "[::]:1": false, "10.0.0.1:1": false, "localhost:1": false, "127.0.0.1": false,
	} {
		if got := IsLoopback(addr); got != want {
			t.Errorf("IsLoopback(%q) = %v, want %v", addr, got, want)
		}
	}
}

func TestJoinAnd(t *testing.T) {
	for _, tc := range []struct {
		names []string
		want  string
	}{
		{nil, ""}, {[]string{"a"}, "a"}, {[]string{"a", "b"}, "a and b"}, {[]string{"a", "b", "c"}, "a, b and c"},
	} {
		if got := joinAnd(tc.names); got != tc.want {
			t.Errorf("joinAnd(%q) = %q, want %q", tc.names, got, tc.want)
		}
	}
}
