package node

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/level"
	"github.com/lockmesh/lockmesh/internal/lockerr"
	"github.com/lockmesh/lockmesh/internal/peer"
	"github.com/lockmesh/lockmesh/internal/replica"
	"github.com/lockmesh/lockmesh/mesh"
	"github.com/lockmesh/lockmesh/transport"
	"github.com/lockmesh/lockmesh/transport/transporttest"
)

// Tests of the three protections a deployment turns on: gossip encryption
// (GossipKey), mutual TLS between Raft peers (RaftTLS) and TLS on
// lockmesh's own transport (TLS). Each checks that peers configured alike
// work and that a peer holding the wrong secret is kept out, with a
// positive control wherever the negative result could also come from a
// broken setup.

// startClusterWith is startCluster with a hook that adjusts each peer's
// config (i counts from 0) before it starts.
func startClusterWith(t testing.TB, o clusterOpts, adjust func(i int, c *Config)) []*testPeer {
	t.Helper()
	if o.expect == 0 {
		o.expect = o.peers
	}
	if o.shards == 0 {
		o.shards = 4
	}
	if o.ttl == 0 {
		o.ttl = time.Second
	}
	var peers []*testPeer
	t.Cleanup(func() {
		for _, p := range peers {
			p.stop()
		}
	})
	var seed string
	for i := 0; i < o.peers; i++ {
		cfg := testConfig(t, fmt.Sprintf("peer-%d", i+1), o)
		if seed != "" {
			cfg.Join = []string{seed}
		}
		adjust(i, &cfg)
		p := &testPeer{cfg: cfg}
		p.start(t)
		if seed == "" {
			seed = p.node.GossipAddr()
		}
		peers = append(peers, p)
	}
	for _, p := range peers {
		p.waitReady(t)
	}
	return peers
}

// joinerConfig is the config of a peer that joins peers' cluster instead
// of bootstrapping one.
func joinerConfig(t testing.TB, name string, peers []*testPeer) Config {
	cfg := testConfig(t, name, clusterOpts{ttl: time.Second})
	cfg.Join = []string{peers[0].node.GossipAddr()}
	return cfg
}

func randomKey(t testing.TB, n int) []byte {
	key := make([]byte, n)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	return key
}

// lockAndUnlock takes key on n and releases it, failing the test if either
// step fails.
func lockAndUnlock(t testing.TB, n *Node, key string) {
	t.Helper()
	ctx := ctxT(t, 10*time.Second)
	l, err := n.Lock(ctx, key)
	if err != nil {
		t.Fatalf("%s: lock %q: %v", n.Name(), key, err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatalf("%s: unlock %q: %v", n.Name(), key, err)
	}
}

func memberNames(m *mesh.Mesh) []string {
	var names []string
	for _, mem := range m.Members() {
		names = append(names, mem.Name)
	}
	return names
}

// pollUntil calls cond every 20ms until it holds, failing the test after d.
func pollUntil(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not true after %v", what, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Peers sharing a GossipKey form a cluster; a peer with no key or another
// key never gets into their membership, and so never learns the cluster
// layout and cannot lock.
func TestSecurityGossipKey(t *testing.T) {
	key := randomKey(t, 32)
	peers := startClusterWith(t, clusterOpts{peers: 3, rf: 3}, func(_ int, c *Config) { c.GossipKey = key })
	lockAndUnlock(t, peers[0].node, "gossip/a")
	insiders := []string{"peer-1", "peer-2", "peer-3"}

	// Four intruders at once: with no key and with a wrong one, each as a
	// pure joiner (BootstrapExpect 0: Start itself must reach a member, so
	// it fails) and as a peer that would bootstrap with 4 but adopts any
	// cluster it sees a member of (Start returns at once, joins in the
	// background; if one gossip message got through it would fetch the
	// layout, become ready and lock).
	wrongKey := randomKey(t, 16)
	intruders := []struct {
		name   string
		key    []byte
		expect int
	}{
		{"no-key-joiner", nil, 0},
		{"wrong-key-joiner", wrongKey, 0},
		{"no-key-bootstrapper", nil, 4},
		{"wrong-key-bootstrapper", wrongKey, 4},
	}
	const wait = 3 * time.Second
	var wg sync.WaitGroup
	problems := make(chan string, 2*len(intruders))
	for _, in := range intruders {
		cfg := joinerConfig(t, in.name, peers)
		cfg.GossipKey = in.key
		cfg.BootstrapExpect = in.expect
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			// Start returns once the peer listens (the join goes on in
			// the background), so a joiner fails where a bootstrapper
			// does: at its first lock call.
			n, err := Start(ctx, cfg)
			if err != nil {
				problems <- fmt.Sprintf("%s: Start: %v", in.name, err)
				return
			}
			defer n.Close()
			if l, err := n.Lock(ctx, "gossip/a"); err == nil {
				problems <- fmt.Sprintf("%s: locked %q (token %d) without the gossip key", in.name, l.Key(), l.Token())
			} else if !errors.Is(err, ErrUnavailable) {
				problems <- fmt.Sprintf("%s: Lock failed with %v, want ErrUnavailable", in.name, err)
			} else if want := "gossip key mismatch with " + peers[0].node.GossipAddr(); !strings.Contains(err.Error(), want) {
				problems <- fmt.Sprintf("%s: Lock failed with %v; want it to say %q", in.name, err, want)
			}
			select {
			case <-n.Ready():
				problems <- fmt.Sprintf("%s: became ready without the gossip key", in.name)
			default:
			}
		}()
	}
	// Watch the insiders' membership for the whole attempt, not only at
	// the end, so that an intruder that got in and was then dropped counts.
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	var seen []string
	for watching := true; watching; {
		select {
		case <-done:
			watching = false
		case <-time.After(20 * time.Millisecond):
		}
		for _, p := range peers {
			if got := memberNames(p.node.peer.Mesh()); !slices.Equal(got, insiders) {
				seen = append(seen, fmt.Sprintf("%s sees %v", p.cfg.Name, got))
			}
		}
	}
	close(problems)
	for p := range problems {
		t.Error(p)
	}
	if len(seen) > 0 {
		t.Errorf("membership changed while intruders tried to join, want only %v: %v", insiders, seen[:min(len(seen), 5)])
	}

	// Control: a joiner with the key gets in through the same path the
	// intruders tried, so their failure is the key's doing.
	friend := &testPeer{cfg: joinerConfig(t, "friend", peers)}
	friend.cfg.GossipKey = key
	friend.start(t)
	t.Cleanup(friend.stop)
	friend.waitReady(t)
	pollUntil(t, 5*time.Second, "peer-1 sees friend", func() bool {
		return slices.Contains(memberNames(peers[0].node.peer.Mesh()), "friend")
	})
	lockAndUnlock(t, friend.node, "gossip/a")
}

// raftFiles writes a RaftTLS certificate for name from ca into dir.
// raftFiles writes a Raft certificate of ca for the peer name into a new
// directory under dir and names its files.
func raftFiles(ca *transporttest.CA, dir, name string) RaftTLS {
	sub, err := os.MkdirTemp(dir, name)
	if err != nil {
		panic(err)
	}
	f := ca.WriteFiles(sub, name)
	return RaftTLS{CAFile: f.CAFile, CertFile: f.CertFile, KeyFile: f.KeyFile}
}

// Peers whose Raft certificates come from one CA form a cluster. A peer
// whose certificate comes from another CA is part of the layout (bootstrap
// runs over lockmesh's transport, not Raft) but no Raft message crosses
// between it and the others: the two good peers are a quorum of every
// shard and serve locks, while the odd peer's replicas stay empty.
func TestSecurityRaftTLS(t *testing.T) {
	dir := t.TempDir()
	ca1, ca2 := transporttest.NewCA(t), transporttest.NewCA(t)

	// everyLeaderKnown reports whether all of n's replicas know a leader,
	// which they learn from the leader's first Raft message.
	everyLeaderKnown := func(n *Node) bool {
		for _, shard := range n.peer.Placement().ShardIDs() {
			if _, _, ok, err := n.peer.NodeHost().GetLeaderID(shard); err != nil || !ok {
				return false
			}
		}
		return true
	}
	// sessionsOn reads n's own replica of shard without going through a
	// leader (StaleRead): what that replica has applied.
	sessionsOn := func(n *Node, shard uint64) int {
		v, err := n.peer.NodeHost().StaleRead(shard, replica.Query{Kind: replica.QuerySessions})
		if err != nil {
			t.Fatalf("%s: stale read of shard %d: %v", n.Name(), shard, err)
		}
		return len(v.(replica.Answer).Sessions)
	}

	// Validate requires a GossipKey with RaftTLS; what differs is only
	// the Raft certificates.
	key := randomKey(t, 32)
	t.Run("SameCA", func(t *testing.T) {
		peers := startClusterWith(t, clusterOpts{peers: 3, rf: 3}, func(_ int, c *Config) {
			c.GossipKey, c.RaftTLS = key, raftFiles(ca1, dir, c.Name)
		})
		lockAndUnlock(t, peers[2].node, "raft/a")
		// Control for the observable used below: with good certificates
		// every replica of peer-3 hears from a leader.
		pollUntil(t, 5*time.Second, "peer-3 knows every shard's leader", func() bool { return everyLeaderKnown(peers[2].node) })
	})

	t.Run("OtherCA", func(t *testing.T) {
		peers := startClusterWith(t, clusterOpts{peers: 3, rf: 3}, func(i int, c *Config) {
			ca := ca1
			if i == 2 {
				ca = ca2
			}
			c.GossipKey, c.RaftTLS = key, raftFiles(ca, dir, c.Name)
		})
		good, odd := peers[0].node, peers[2].node
		ctx := ctxT(t, 10*time.Second)
		l, err := good.Lock(ctx, "raft/a")
		if err != nil {
			t.Fatalf("peers 1 and 2 are a quorum of every shard, yet: %v", err)
		}
		shard := good.peer.Placement().ShardOf("raft/a")
		if !odd.peer.HostsShard(shard) {
			t.Fatalf("peer-3 hosts no replica of shard %d; with RF 3 on 3 peers it must", shard)
		}
		// The lock's session is committed, so peer-1's replica applies it
		// (soon: the proposal may have been made on peer-2's). A replica
		// that received any entry would also know a leader; peer-3's, cut
		// off by the handshake, know none and have applied nothing. By the
		// time peer-1 has applied, peer-3 has had every chance to.
		pollUntil(t, 5*time.Second, "peer-1's replica applies the session", func() bool { return sessionsOn(good, shard) > 0 })
		time.Sleep(300 * time.Millisecond)
		for _, s := range odd.peer.Placement().ShardIDs() {
			if _, _, ok, _ := odd.peer.NodeHost().GetLeaderID(s); ok {
				t.Errorf("peer-3, with a Raft certificate from another CA, knows a leader of shard %d", s)
			}
		}
		if got := sessionsOn(odd, shard); got != 0 {
			t.Errorf("peer-3's replica of shard %d applied %d sessions; it should be cut off", shard, got)
		}
		// Lock calls made on peer-3 are not asserted on: they go to the
		// leader's peer over lockmesh's transport, which RaftTLS does not
		// cover (TLS does), so they succeed here.
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// Peers with TLS on lockmesh's transport bootstrap over it (the two-phase
// layout agreement is RPC) and forward lock calls over it. A client with a
// certificate from another CA, or none, is refused at the handshake; one
// with a certificate from the right CA reaches the handler.
func TestSecurityRPCTLS(t *testing.T) {
	ca, other := transporttest.NewCA(t), transporttest.NewCA(t)
	key := randomKey(t, 32) // Validate requires it with TLS
	peers := startClusterWith(t, clusterOpts{peers: 3, rf: 3}, func(_ int, c *Config) { c.GossipKey, c.TLS = key, ca.Issue(c.Name) })
	lockAndUnlock(t, peers[0].node, "rpc/a")

	// A joiner hosts no replica, so its locks, keepalives and grant
	// notifications all cross the TLS transport.
	joiner := &testPeer{cfg: joinerConfig(t, "joiner", peers)}
	joiner.cfg.GossipKey, joiner.cfg.TLS = key, ca.Issue("joiner")
	joiner.start(t)
	t.Cleanup(joiner.stop)
	joiner.waitReady(t)
	p := joiner.node.peer.Placement()
	if shard := p.ShardOf("rpc/a"); joiner.node.peer.HostsShard(shard) {
		t.Fatalf("joiner hosts shard %d; the test needs it to forward", shard)
	}
	lockAndUnlock(t, joiner.node, "rpc/a")

	addr := peers[0].node.peer.RPCAddr()
	callMethod := func(cfg *tls.Config, method uint8, body []byte) ([]byte, error) {
		c, err := transport.NewClient(transport.Config{TLS: cfg, DialTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return c.Call(ctx, addr, method, body)
	}
	call := func(cfg *tls.Config) ([]byte, error) { return callMethod(cfg, peer.MethodGetPlacement, nil) }
	rootsOnly := ca.Issue("no-client-cert")
	rootsOnly.Certificates = nil
	for name, cfg := range map[string]*tls.Config{
		"plaintext":        nil,
		"other CA":         other.Issue("mallory"),
		"no client cert":   rootsOnly,
		"other CA as root": {Certificates: ca.Issue("x").Certificates, RootCAs: other.Pool(), MinVersion: tls.VersionTLS13},
	} {
		_, err := call(cfg)
		if err == nil {
			t.Errorf("%s: call reached the handler", name)
			continue
		}
		var remote *transport.Error
		if errors.As(err, &remote) {
			t.Errorf("%s: call reached the handler, which answered %v", name, err)
		}
	}

	// A certificate of the cluster's CA is not membership: one for a name
	// no member has is refused by the handler (finding 4 of the security
	// review: it used to read the layout and release others' locks).
	if _, err := call(ca.Issue("operator")); lockerr.Code(err) != lockerr.CodeForbidden {
		t.Fatalf("client with a certificate of the cluster's CA for a non-member: %v, want forbidden", err)
	}
	// Nor may it watch a key: a watch is a read.
	watch, err := peer.EncodeBody(peer.WatchRequest{Shard: layout.FirstLockShard, Key: "k", Level: level.Max})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := callMethod(ca.Issue("operator"), peer.MethodWatch, watch); lockerr.Code(err) != lockerr.CodeForbidden {
		t.Fatalf("a watch by a non-member: %v, want forbidden", err)
	}
	raw, err := call(ca.Issue(peers[1].cfg.Name))
	if err != nil {
		t.Fatalf("client with a member's certificate: %v", err)
	}
	got, err := layout.Decode(raw)
	if err != nil {
		t.Fatal(err)
	}
	if want := peers[0].node.peer.Placement().ClusterID; got.ClusterID != want {
		t.Fatalf("layout over TLS has cluster %x, want %x", got.ClusterID, want)
	}
}

// logRecorder is a slog.Handler that keeps every record, for tests that
// assert on what a peer logged. Its copies made by WithAttrs and WithGroup
// share the store (their attributes are dropped: the tests read the
// record's own).
type logRecorder struct {
	mu      *sync.Mutex
	records *[]slog.Record
}

func newLogRecorder() logRecorder {
	return logRecorder{mu: new(sync.Mutex), records: new([]slog.Record)}
}

func (r logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (r logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r logRecorder) WithGroup(string) slog.Handler            { return r }

func (r logRecorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	*r.records = append(*r.records, rec.Clone())
	return nil
}

// plaintextWarnings returns the "plaintext" attribute of every warning
// about running without encryption.
func (r logRecorder) plaintextWarnings() [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out [][]string
	for _, rec := range *r.records {
		if rec.Level != slog.LevelWarn || !strings.Contains(rec.Message, "running without encryption") {
			continue
		}
		var links []string
		rec.Attrs(func(a slog.Attr) bool {
			if a.Key == "plaintext" {
				links, _ = a.Value.Any().([]string)
			}
			return true
		})
		out = append(out, links)
	}
	return out
}

// A peer warns once, through Config.Logger, about exactly the links it
// leaves unprotected, and works either way.
func TestSecurityPlaintextWarning(t *testing.T) {
	ca := transporttest.NewCA(t)
	dir := t.TempDir()
	for _, tc := range []struct {
		name   string
		adjust func(c *Config)
		want   []string // nil: no warning at all
	}{
		{"Plaintext", func(*Config) {}, []string{"gossip (set GossipKey)", "raft (set RaftTLS)", "rpc (set TLS)"}},
		{"GossipKeyOnly", func(c *Config) { c.GossipKey = randomKey(t, 16) }, []string{"raft (set RaftTLS)", "rpc (set TLS)"}},
		{"AllProtected", func(c *Config) {
			c.GossipKey = randomKey(t, 32)
			c.TLS = ca.Issue(c.Name)
			c.RaftTLS = raftFiles(ca, dir, c.Name)
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := newLogRecorder()
			peers := startClusterWith(t, clusterOpts{peers: 1, rf: 1, shards: 2}, func(_ int, c *Config) {
				c.Name = "solo-" + tc.name
				c.Logger = slog.New(rec)
				tc.adjust(c)
			})
			lockAndUnlock(t, peers[0].node, "plain/a")
			got := rec.plaintextWarnings()
			switch {
			case tc.want == nil && len(got) != 0:
				t.Fatalf("fully protected peer warned about plaintext links %v", got)
			case tc.want != nil && (len(got) != 1 || !slices.Equal(got[0], tc.want)):
				t.Fatalf("plaintext warnings = %v, want one naming %v", got, tc.want)
			}
		})
	}
}

// A peer listening beyond loopback without the three protections does not
// start unless Insecure is set; with it, it starts, serves locks and warns
// once, naming the exposed address and what is unset.
func TestSecurityInsecureWarning(t *testing.T) {
	exposed := func(c *Config) {
		c.Name = "exposed"
		c.RPCAddr = "0.0.0.0:0" // every interface
	}
	cfg := testConfig(t, "exposed", clusterOpts{expect: 1, rf: 1, shards: 2, ttl: time.Second})
	exposed(&cfg)
	if n, err := Start(context.Background(), cfg); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "RPCAddr 0.0.0.0:0 is not loopback") {
		if err == nil {
			n.Close()
		}
		t.Fatalf("Start on 0.0.0.0 without protection or Insecure = %v, want ErrInvalidConfig naming RPCAddr", err)
	}

	rec := newLogRecorder()
	peers := startClusterWith(t, clusterOpts{peers: 1, rf: 1, shards: 2}, func(_ int, c *Config) {
		exposed(c)
		c.Insecure = true
		c.Logger = slog.New(rec)
	})
	lockAndUnlock(t, peers[0].node, "insecure/a")
	var warnings []slog.Record
	rec.mu.Lock()
	for _, r := range *rec.records {
		if r.Level == slog.LevelWarn && strings.Contains(r.Message, "Insecure is set") {
			warnings = append(warnings, r)
		}
	}
	rec.mu.Unlock()
	if len(warnings) != 1 {
		t.Fatalf("%d warnings about Insecure, want 1", len(warnings))
	}
	attrs := map[string]any{}
	warnings[0].Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value.Any(); return true })
	if got, want := attrs["exposed"], []string{"RPCAddr 0.0.0.0:0"}; !slices.Equal(asStrings(got), want) {
		t.Errorf("warning names exposed addresses %v, want %v", got, want)
	}
	if got, want := attrs["unset"], []string{"GossipKey", "RaftTLS", "TLS"}; !slices.Equal(asStrings(got), want) {
		t.Errorf("warning names unset protections %v, want %v", got, want)
	}
}

func asStrings(v any) []string {
	s, _ := v.([]string)
	return s
}
