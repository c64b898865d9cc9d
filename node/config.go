package node

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"time"

	"github.com/lni/vfs"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/lockmesh/lockmesh/internal/authz"
	"github.com/lockmesh/lockmesh/internal/clock"
	"github.com/lockmesh/lockmesh/internal/config"
	"github.com/lockmesh/lockmesh/internal/peer"
)

// MaxSessionTTL is the longest session TTL a peer accepts: a session
// whose holder died keeps its locks for its TTL, so a longer one would
// hold keys for ever in all but name. Every peer refuses to open a
// longer session, whoever asks (docs/SECURITY.md).
const MaxSessionTTL = authz.MaxSessionTTL

// Defaults used where a Config field is zero.
const (
	DefaultShards            = 16
	DefaultReplicationFactor = 3
	DefaultSessionTTL        = 10 * time.Second
	// DefaultRTT is etcd's heartbeat interval: with 16 lock shards a peer
	// idles at about 1.6% of a core (2.9% at 50ms). A shard whose leader
	// crashed elects another after an election timeout of 10-20 RTT:
	// measured 0.9-1.8 s at 100ms (median 1.3 s, 95th percentile 1.8 s,
	// 254 shards in 39 crashes), up to 3.4 s in the few (6) that needed a
	// second round. Lock latency does not depend on it.
	// (go test ./node -run TestLeaderFailoverAtDefaultRTT -v -lockmesh.measure)
	DefaultRTT = 100 * time.Millisecond
	// DefaultDeadAfter is how long a peer may be unreachable before its
	// replicas are replaced.
	DefaultDeadAfter = 30 * time.Second
)

// Config configures a Node. Zero values mean the defaults listed on each
// field; DefaultConfig returns them filled in.
type Config struct {
	// Name identifies this peer in the mesh; it must be unique and stable
	// across restarts of the same data dir. Default: the RPC address.
	Name string
	// DataDir holds the Raft logs, snapshots, the cluster record and the
	// gossip addresses of the peers last seen (to rejoin through). It must
	// survive restarts for held locks and fencing tokens to survive them.
	// It is also the peer's identity (its dragonboat NodeHostID). A peer
	// started on a wiped or replaced DataDir under a Name the cluster still
	// lists never runs that name's old replicas, whose logs are gone: it
	// logs an error once, lock calls fail with ErrUnavailable saying why,
	// and it waits until the cluster has replaced the old identity (DeadAfter
	// after it went away) and admits it as a new peer with new replicas.
	// Started under a new Name it is admitted at once.
	DataDir string
	// GossipAddr is the host:port memberlist listens on (port 0 picks one).
	GossipAddr string
	// RaftAddr is the host:port of the Raft transport. It needs a fixed port.
	RaftAddr string
	// RPCAddr is the host:port of lockmesh's own transport (port 0 picks one).
	RPCAddr string
	// Join lists gossip addresses of existing peers; one live one is enough.
	// Start does not wait for them: the join goes on in the background. A
	// restarted peer also joins through the peers it last saw alive (kept
	// in DataDir), so it finds its cluster when every address here is gone.
	Join []string
	// BootstrapExpect is the number of peers that form a new cluster
	// together. 0 means this peer only joins a cluster that already exists.
	// Every peer of the initial set should use the same value.
	BootstrapExpect int
	// Shards is the number of lock shards, fixed when the cluster is created
	// (default 16). Peers joining later adopt the cluster's value.
	Shards int
	// ReplicationFactor is the number of replicas per shard (default 3).
	ReplicationFactor int
	// SessionTTL is how long the cluster keeps a session's locks after its
	// keepalives stop (default 10s). Lock.Done closes earlier than that on
	// the holder's side: see LeaseMargin.
	//
	// A crashed holder's keys pass to the next waiter within a TTL of its
	// last acknowledged keepalive when it only followed the key's shard
	// (8.1-10.5 s after the crash at the defaults). When it also led the
	// shard, the survivors first elect a new leader, which counts the TTL
	// from its election plus a grace of 20 RTT: the key is kept up to
	// TTL + 20 RTT + the election + TTL/20, measured 13.2-15.1 s at the
	// defaults (1.3-1.5 x TTL; the fixed part, about 3.5 s at DefaultRTT,
	// weighs more with a shorter TTL). A follower holder that crashes
	// within 20 RTT + TTL/4 of a leader change may be kept as long.
	// (go test ./node -run TestDeadHolderKeepsKey -v -lockmesh.measure)
	// Each further leadership change of the shard before the expiry (the
	// balancer moving a new leadership on, a paused leader's return)
	// counts the TTL afresh: examples/election measured one failover of
	// 11.0 s at a TTL of 4 s that way. It costs time, never safety.
	SessionTTL time.Duration
	// LeaseMargin is subtracted from the TTL on the client side to absorb
	// clock-rate differences between peers (default TTL/10, at least 2 RTT).
	LeaseMargin time.Duration
	// RTT is the expected round trip between peers; Raft heartbeats happen
	// every RTT and elections after 10 RTT (default 100ms).
	RTT time.Duration
	// NoReplicas makes this a client-only peer: it never hosts replicas and
	// forwards its requests to peers that do (like a Consul client agent).
	// Use it for short-lived or numerous processes that should not carry
	// lock state. It needs Join and no BootstrapExpect.
	NoReplicas bool
	// DeadAfter is how long a peer may be unreachable (by gossip) before
	// the cluster replaces its replicas on other peers (default 30s). A
	// peer that comes back later joins again as a new peer.
	DeadAfter time.Duration
	// GossipKey enables memberlist encryption (16, 24 or 32 bytes, the
	// same on every peer). Validate requires it whenever TLS or RaftTLS is
	// set, on loopback too: gossip decides who is a member, so without a
	// key anyone with a certificate of the CA joins gossip and is admitted
	// (given replicas), and the certificates would protect nothing.
	GossipKey []byte
	// Insecure lets a peer listen on an address other than loopback
	// without GossipKey, RaftTLS and TLS all set. Validate refuses such a
	// config otherwise: anyone who can reach an unprotected port can join
	// the mesh, propose Raft entries or lock and unlock through lockmesh's
	// transport, and unencrypted gossip is where a single crafted message
	// costs the most memory (see docs/SECURITY.md). Set it only on a
	// network where every host is trusted; Start logs a warning naming
	// the exposed addresses. An address with an empty or unspecified host
	// (":7946", "0.0.0.0:7946") is not loopback.
	Insecure bool
	// Logger receives the node's logs (default: discard): lockmesh's own
	// lines and memberlist's (at memberlist's levels), tagged peer=Name.
	//
	// dragonboat's lines go through a Logger too, with routine Raft events
	// (elections, votes, peers restarting, leaders stepping down) at Info
	// or Debug and only what needs an operator at Warn or Error. But
	// dragonboat's logger is process-wide: the first Start in a process
	// (past Validate) fixes it to that Config's Logger, the discarding
	// default if it had none, for the life of the process, also after that
	// node is closed. A second node started in the same process gets its
	// own and memberlist's lines through its Logger, while its dragonboat
	// lines go to the first node's Logger, mixed with the first node's and
	// without a peer attribute (most of dragonboat's lines name the shard
	// and replica, as [shard:replica]). Several peers in one process should share one
	// Logger, or start first the one whose Logger should see Raft's lines.
	// pebble, dragonboat's log store, writes its few lines (background
	// errors) to the standard log package instead.
	Logger *slog.Logger

	// TLS secures lockmesh's own peer-to-peer transport. The same config
	// serves and dials, so give it Certificates, RootCAs, ClientCAs and
	// ClientAuth: tls.RequireAndVerifyClientCert for mutual TLS, and set
	// GossipKey with it (Validate refuses TLS without one). Nil means
	// plaintext, which is logged as a warning.
	TLS *tls.Config
	// RaftTLS enables mutual TLS on the Raft transport (internal/raftnet
	// reads the PEM files at Start). A connection is accepted only from a
	// certificate of the CA that names a peer of the layout. Zero means
	// plaintext, which is logged as a warning.
	// Set TLS too: lock commands also travel over lockmesh's own transport,
	// so a peer that can reach the RPC port unauthenticated can lock. Like
	// TLS, it needs GossipKey.
	RaftTLS RaftTLS

	// MeterProvider receives lockmesh's metrics (docs/OBSERVABILITY.md
	// lists them); nil records none. lockmesh never sets a global
	// provider: pass the application's. No metric has a key as an
	// attribute.
	MeterProvider metric.MeterProvider
	// TracerProvider traces Lock, TryLock, Unlock, Release, the lock
	// family and the proposals they make; a forwarded proposal continues
	// its caller's trace on the peer that serves it (from feature level
	// 3). Nil traces nothing. Spans carry the key as an attribute.
	TracerProvider trace.TracerProvider
	// RaftMetrics switches on dragonboat's own Raft metrics, which it
	// keeps for the whole process; WriteRaftMetrics writes them.
	RaftMetrics bool

	// UnsafeSkipEntries recovers a shard whose log holds an entry that no
	// release reads (one forced in by a forger that spoke for its leader,
	// or written by a bug): every replica halts at it (ErrReplicaHalted,
	// logged with the shard and index) and the shard stops. Restart every
	// peer that hosts the shard, all of one release, with the entry
	// listed here: each replica then passes over the listed entries it
	// cannot read, instead of halting, and the shard serves again (a
	// replica that halts at a later entry names it: list it too).
	// Commands in the entry are lost; an entry a replica reads is applied
	// as usual, so a listed entry that a newer release reads must not be
	// skipped by older peers while newer ones apply it: upgrade instead.
	// Remove it once the shard has taken a snapshot past it. See
	// docs/UPGRADING.md.
	UnsafeSkipEntries []LogEntry

	// clock is the time source of the lease logic (holder deadlines and
	// leader expiry): clock.System, or in tests a skewed or jumping one,
	// which both sides then read. fs is the file system under DataDir: the
	// operating system's, or in tests an in-memory one. Neither is
	// public: a slow clock breaks the holder's margin and an in-memory FS
	// loses tokens on restart, and nothing a user can set may make
	// locking unsafe.
	clock clock.Clock
	fs    vfs.FS
}

// LogEntry names one entry of a shard's Raft log, as a halted replica's
// HaltError does.
type LogEntry struct {
	Shard, Index uint64
}

// RaftTLS names the PEM files for mutual TLS between Raft peers: every
// peer presents CertFile and accepts only peers whose certificates chain to
// CAFile.
type RaftTLS struct {
	CAFile, CertFile, KeyFile string
}

func (r RaftTLS) enabled() bool { return r.CAFile != "" || r.CertFile != "" || r.KeyFile != "" }

// DefaultConfig returns a Config with the defaults of the tuning fields
// filled in: Shards, ReplicationFactor, SessionTTL, RTT, DeadAfter and
// LeaseMargin (max(SessionTTL/10, 2 RTT) of those defaults: 1s), a Logger
// that discards. It sets no
// address, DataDir, Join or BootstrapExpect, and Name stays empty (it
// defaults to RPCAddr), so it does not Validate until those are filled in:
// a peer needs a DataDir, three host:port addresses (RaftAddr with a fixed
// port) and a way into a cluster.
//
// LeaseMargin is computed once, here: after changing SessionTTL or RTT on
// the result, set LeaseMargin again (0 recomputes it at Start).
func DefaultConfig() Config {
	c := Config{}
	c.setDefaults()
	return c
}

func (c *Config) setDefaults() {
	if c.Shards == 0 {
		c.Shards = DefaultShards
	}
	if c.ReplicationFactor == 0 {
		c.ReplicationFactor = DefaultReplicationFactor
	}
	if c.SessionTTL == 0 {
		c.SessionTTL = DefaultSessionTTL
	}
	if c.RTT == 0 {
		c.RTT = DefaultRTT
	}
	if c.DeadAfter == 0 {
		c.DeadAfter = DefaultDeadAfter
	}
	if c.LeaseMargin == 0 {
		c.LeaseMargin = max(c.SessionTTL/10, 2*c.RTT)
	}
	if c.Name == "" {
		c.Name = c.RPCAddr
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.fs == nil {
		c.fs = vfs.Default
	}
	if c.clock == nil {
		c.clock = clock.System{}
	}
}

// Validate reports the first problem with the configuration, wrapped in
// ErrInvalidConfig. It applies defaults to a copy, so zero fields are fine.
func (c Config) Validate() error { return c.validate(false) }

// validate is Validate; raftInMemory says RaftAddr is only a name for a
// test's in-memory Raft transport, so nothing listens on it. The rules
// are internal/config's.
func (c Config) validate(raftInMemory bool) error {
	c.setDefaults()
	for _, e := range c.UnsafeSkipEntries {
		if e.Shard == 0 || e.Index == 0 {
			return fmt.Errorf("%w: UnsafeSkipEntries: shard %d index %d: both must be above 0 (copy them from the halted replica's log line)", ErrInvalidConfig, e.Shard, e.Index)
		}
	}
	if err := config.Check(c.peer(raftInMemory), config.Defaults{
		SessionTTL: DefaultSessionTTL, RTT: DefaultRTT, DeadAfter: DefaultDeadAfter,
	}); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	return nil
}

// peer is what internal/config's rules read of c.
func (c Config) peer(raftInMemory bool) config.Peer {
	return config.Peer{
		Name: c.Name, DataDir: c.DataDir,
		GossipAddr: c.GossipAddr, RaftAddr: c.RaftAddr, RPCAddr: c.RPCAddr, RaftInMemory: raftInMemory,
		Join: c.Join, BootstrapExpect: c.BootstrapExpect, Shards: c.Shards, ReplicationFactor: c.ReplicationFactor,
		NoReplicas: c.NoReplicas,
		SessionTTL: c.SessionTTL, LeaseMargin: c.LeaseMargin, RTT: c.RTT, DeadAfter: c.DeadAfter,
		GossipKey: c.GossipKey, Insecure: c.Insecure, TLS: c.TLS,
		RaftCAFile: c.RaftTLS.CAFile, RaftCertFile: c.RaftTLS.CertFile, RaftKeyFile: c.RaftTLS.KeyFile,
	}
}

// peerConfig is c, with its defaults applied, as the running peer takes
// it.
func (c Config) peerConfig(raftInMemory bool) peer.Config {
	skip := make([]peer.LogEntry, len(c.UnsafeSkipEntries))
	for i, e := range c.UnsafeSkipEntries {
		skip[i] = peer.LogEntry(e)
	}
	return peer.Config{
		Name: c.Name, DataDir: c.DataDir,
		GossipAddr: c.GossipAddr, RaftAddr: c.RaftAddr, RPCAddr: c.RPCAddr, Join: c.Join,
		BootstrapExpect: c.BootstrapExpect, Shards: c.Shards, ReplicationFactor: c.ReplicationFactor,
		SessionTTL: c.SessionTTL, LeaseMargin: c.LeaseMargin, RTT: c.RTT, DeadAfter: c.DeadAfter,
		NoReplicas: c.NoReplicas, Insecure: c.Insecure, RaftMetrics: c.RaftMetrics,
		GossipKey: c.GossipKey, TLS: c.TLS, RaftTLS: peer.RaftTLS(c.RaftTLS), Logger: c.Logger,
		UnsafeSkipEntries: skip, Clock: c.clock, FS: c.fs,
		Checked: c.peer(raftInMemory),
	}
}
