package node

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/transport/transporttest"
)

func TestConfigValidate(t *testing.T) {
	good := func() Config {
		return Config{
			Name: "p1", DataDir: "/tmp/x", GossipAddr: "127.0.0.1:0", RaftAddr: "127.0.0.1:7000",
			RPCAddr: "127.0.0.1:0", BootstrapExpect: 3,
		}
	}
	if err := good().Validate(); err != nil {
		t.Fatalf("good config: %v", err)
	}
	cases := []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{"no data dir", func(c *Config) { c.DataDir = "" }, "DataDir"},
		{"bad gossip addr", func(c *Config) { c.GossipAddr = "nope" }, "GossipAddr"},
		{"raft port 0", func(c *Config) { c.RaftAddr = "127.0.0.1:0" }, "fixed port"},
		{"no name with port 0", func(c *Config) { c.Name = "" }, "Name is required"},
		{"name too long", func(c *Config) { c.Name = strings.Repeat("n", 129) }, "Name"},
		{"negative expect", func(c *Config) { c.BootstrapExpect = -1 }, "negative"},
		{"neither bootstrap nor join", func(c *Config) { c.BootstrapExpect = 0 }, "Join"},
		{"too many shards", func(c *Config) { c.Shards = 5000 }, "Shards"},
		{"rf too large", func(c *Config) { c.ReplicationFactor = 10 }, "ReplicationFactor"},
		{"ttl too short", func(c *Config) { c.SessionTTL = 100 * time.Millisecond }, "SessionTTL"},
		{"ttl above the peers' limit", func(c *Config) { c.SessionTTL = 2 * time.Hour }, "SessionTTL 2h0m0s is above MaxSessionTTL (1h0m0s)"},
		{"margin too large", func(c *Config) { c.LeaseMargin = 6 * time.Second }, "LeaseMargin"},
		{"bad gossip key", func(c *Config) { c.GossipKey = []byte("short") }, "GossipKey"},
		{"rtt too small", func(c *Config) { c.RTT = time.Microsecond }, "RTT"},
		{"negative dead after", func(c *Config) { c.DeadAfter = -time.Second }, "DeadAfter -1s is negative"},
		{"negative ttl", func(c *Config) { c.SessionTTL = -time.Second }, "SessionTTL -1s is negative"},
		{"negative margin", func(c *Config) { c.LeaseMargin = -time.Millisecond }, "LeaseMargin -1ms is negative"},
		{"negative rtt", func(c *Config) { c.RTT = -time.Millisecond }, "RTT -1ms is negative"},
		{"exposed rpc", func(c *Config) { c.RPCAddr = "10.0.0.5:7000" }, "RPCAddr 10.0.0.5:7000 is not loopback"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := good()
			tc.mutate(&c)
			err := c.Validate()
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want ErrInvalidConfig mentioning %q", err, tc.want)
			}
			if _, err := Start(context.Background(), c); !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("Start() = %v, want ErrInvalidConfig", err)
			}
		})
	}
}

// A peer that listens beyond loopback needs all three protections, or
// Insecure said out loud; on loopback it needs none.
func TestConfigValidateExposed(t *testing.T) {
	dir := t.TempDir()
	var raftTLS RaftTLS
	for _, f := range []*string{&raftTLS.CAFile, &raftTLS.CertFile, &raftTLS.KeyFile} {
		*f = filepath.Join(dir, fmt.Sprintf("pem-%p", f))
		if err := os.WriteFile(*f, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	key := make([]byte, 32)
	key[0] = 1
	ca := transporttest.NewCA(t)
	base := func(gossip, raft, rpc string) Config {
		return Config{Name: "p1", DataDir: dir, GossipAddr: gossip, RaftAddr: raft, RPCAddr: rpc, BootstrapExpect: 3}
	}
	secure := func(c Config) Config {
		c.GossipKey, c.RaftTLS, c.TLS = key, raftTLS, ca.Issue("p1")
		return c
	}
	withTLS := func(adjust func(*tls.Config)) Config {
		c := secure(base("10.0.0.5:7946", "10.0.0.5:7947", "10.0.0.5:7948"))
		adjust(c.TLS)
		return c
	}
	cases := []struct {
		name string
		cfg  Config
		want string // "" means valid
	}{
		{"loopback", base("127.0.0.1:0", "127.0.0.1:7000", "127.0.0.1:0"), ""},
		{"loopback v6", base("[::1]:0", "127.0.0.1:7000", "[::1]:0"), ""},
		{"localhost by name", base("[::1]:0", "localhost:7000", "[::1]:0"), "RaftAddr \"localhost:7000\": the host must be an IP address"},
		{"a host name", base("peer-1.example:7946", "127.0.0.1:7000", "127.0.0.1:0"), "GossipAddr \"peer-1.example:7946\": the host must be an IP address"},
		{"all-zero gossip key", func() Config {
			c := secure(base("10.0.0.5:7946", "10.0.0.5:7947", "10.0.0.5:7948"))
			c.GossipKey = make([]byte, 16)
			return c
		}(), "GossipKey is all zero bytes"},
		{"TLS that does not ask for client certificates", withTLS(func(t *tls.Config) { t.ClientAuth = tls.NoClientCert }), "ClientAuth is NoClientCert; it must be tls.RequireAndVerifyClientCert"},
		{"TLS that does not verify client certificates", withTLS(func(t *tls.Config) { t.ClientAuth = tls.RequireAnyClientCert }), "it must be tls.RequireAndVerifyClientCert"},
		{"TLS that skips verification", withTLS(func(t *tls.Config) { t.InsecureSkipVerify = true }), "InsecureSkipVerify is set"},
		{"TLS without ClientCAs", withTLS(func(t *tls.Config) { t.ClientCAs = nil }), "ClientCAs is not set"},
		{"TLS without RootCAs", withTLS(func(t *tls.Config) { t.RootCAs = nil }), "RootCAs is not set"},
		{"empty TLS config", withTLS(func(t *tls.Config) { *t = tls.Config{} }), "it must be tls.RequireAndVerifyClientCert"},
		{"TLS without a certificate", withTLS(func(t *tls.Config) { t.Certificates = nil }), "Certificates is empty"},
		{"TLS certificate for another name", withTLS(func(t *tls.Config) { t.Certificates = ca.Issue("p2").Certificates }), `the certificate names ["p2" "localhost"], not this peer's Name "p1"`},
		{"rpc on a LAN", base("127.0.0.1:0", "127.0.0.1:7000", "10.0.0.5:7000"),
			"RPCAddr 10.0.0.5:7000 is not loopback: set GossipKey, RaftTLS and TLS, or set Insecure to run without them"},
		{"gossip on every interface", base("0.0.0.0:7946", "127.0.0.1:7000", "127.0.0.1:0"), "GossipAddr 0.0.0.0:7946 is not loopback"},
		{"raft with no host", base("127.0.0.1:0", ":7000", "127.0.0.1:0"), "RaftAddr :7000 is not loopback"},
		{"all exposed, all protected", secure(base("10.0.0.5:7946", "10.0.0.5:7947", "10.0.0.5:7948")), ""},
		{"all exposed, Insecure", func() Config {
			c := base("10.0.0.5:7946", "10.0.0.5:7947", "10.0.0.5:7948")
			c.Insecure = true
			return c
		}(), ""},
		{"gossip key missing", func() Config {
			c := secure(base("10.0.0.5:7946", "10.0.0.5:7947", "10.0.0.5:7948"))
			c.GossipKey = nil
			return c
		}(), "GossipAddr 10.0.0.5:7946 is not loopback: set GossipKey, or set Insecure"},
		{"TLS missing", func() Config {
			c := secure(base("127.0.0.1:0", "127.0.0.1:7000", "[2001:db8::1]:7000"))
			c.TLS = nil
			return c
		}(), "RPCAddr [2001:db8::1]:7000 is not loopback: set TLS, or set Insecure"},
		{"raft TLS and key missing", func() Config {
			c := secure(base("127.0.0.1:0", "192.168.1.2:7000", "127.0.0.1:0"))
			c.RaftTLS, c.GossipKey = RaftTLS{}, nil
			return c
		}(), "set GossipKey and RaftTLS, or set Insecure"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case tc.want != "" && (!errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Validate() = %v, want ErrInvalidConfig saying %q", err, tc.want)
			}
		})
	}
}

func TestFence(t *testing.T) {
	var f Fence
	if err := f.Check("k", 5); err != nil {
		t.Fatal(err)
	}
	if err := f.Check("k", 5); err != nil {
		t.Fatalf("same token twice: %v", err)
	}
	if err := f.Check("k", 4); !errors.Is(err, ErrStaleToken) {
		t.Fatalf("lower token: %v", err)
	}
	if err := f.Check("other", 1); err != nil {
		t.Fatalf("keys are independent: %v", err)
	}
	if f.Highest("k") != 5 {
		t.Fatalf("Highest = %d", f.Highest("k"))
	}
}
