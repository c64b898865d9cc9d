package node

import (
	"context"
	"crypto/tls"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/transport/transporttest"
)

func TestConfigValidate(t *testing.T) {
	ca := transporttest.NewCA(t)
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
		// The rest of the rules are internal/config's, tested there; these
		// show Validate hands them every field.
		{"client-only bootstrapping", func(c *Config) { c.NoReplicas = true }, "NoReplicas needs Join"},
		{"TLS that skips verification", func(c *Config) { c.TLS = &tls.Config{InsecureSkipVerify: true} }, "TLS: InsecureSkipVerify is set"},
		{"half a RaftTLS", func(c *Config) { c.RaftTLS.KeyFile = "/nonexistent/key.pem" }, "RaftTLS.CAFile is required"},
		{"RaftTLS files", func(c *Config) {
			c.RaftTLS = RaftTLS{CAFile: "/nonexistent/ca.pem", CertFile: "/nonexistent/c.pem", KeyFile: "/nonexistent/k.pem"}
		}, "RaftTLS.CAFile: stat /nonexistent/ca.pem"},
		{"joining, too many shards", func(c *Config) { c.BootstrapExpect, c.Join, c.Shards = 0, []string{"127.0.0.1:7946"}, 5000 }, "Shards 5000"},
		{"TLS without a gossip key", func(c *Config) { c.TLS = ca.Issue(c.Name) }, "TLS is set without GossipKey: set GossipKey too"},
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

// A nil Context is refused with an error that names the call, never a
// panic; Start with a cancelled one returns its error.
func TestNilContextIsRefused(t *testing.T) {
	n, ctx := startPromiseCluster(t)
	s := newTestSession(t, ctx, n)
	l, err := n.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	var nilCtx context.Context
	for name, err := range map[string]error{
		"Node.Lock":         second(n.Lock(nilCtx, "k")),
		"Node.TryLock":      second(n.TryLock(nilCtx, "k")),
		"Session.Lock":      second(s.Lock(nilCtx, "k")),
		"Session.LockAll":   second(s.LockAll(nilCtx, "a", "b")),
		"RWMutex.RLock":     second(s.RWMutex("rw").RLock(nilCtx)),
		"Semaphore.Acquire": second(s.Semaphore("sem", 2).Acquire(nilCtx, 1)),
		"Node.NewSession":   second(n.NewSession(nilCtx)),
		"Node.Inspect":      second(n.Inspect(nilCtx, "k")),
		"Node.Watch":        second(n.Watch(nilCtx, "k")),
		"Election.Campaign": second(s.Election("e").Campaign(nilCtx, nil)),
		"Lock.Unlock":       l.Unlock(nilCtx),
		"Lock.SetValue":     l.SetValue(nilCtx, nil),
		"Session.Close":     s.Close(nilCtx),
		"Node.WaitServing":  n.WaitServing(nilCtx),
	} {
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), name) {
			t.Errorf("%s with a nil Context: %v, want ErrInvalidArgument naming it", name, err)
		}
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Start(cancelled, testConfig(t, "late", clusterOpts{expect: 1, shards: 1, rf: 1})); !errors.Is(err, context.Canceled) {
		t.Fatalf("Start with a cancelled ctx: %v, want context.Canceled", err)
	}
}
