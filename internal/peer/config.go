package peer

import (
	"crypto/tls"
	"log/slog"
	"time"

	"github.com/lni/vfs"

	"github.com/lockmesh/lockmesh/internal/clock"
	"github.com/lockmesh/lockmesh/internal/config"
)

// Config is what a Peer runs with: a node.Config that node.Start
// validated and filled in with its defaults. node.Config documents each
// field; the last three are not public there.
type Config struct {
	Name, DataDir                 string
	GossipAddr, RaftAddr, RPCAddr string
	Join                          []string

	BootstrapExpect, Shards, ReplicationFactor int
	SessionTTL, LeaseMargin, RTT, DeadAfter    time.Duration
	NoReplicas, Insecure, RaftMetrics          bool

	GossipKey         []byte
	TLS               *tls.Config
	RaftTLS           RaftTLS
	Logger            *slog.Logger
	UnsafeSkipEntries []LogEntry

	// Clock is the time source of the lease logic (holder deadlines and
	// leader expiry): clock.System, or in tests a skewed or jumping one,
	// which both sides then read. FS is the file system under DataDir:
	// the operating system's, or in tests an in-memory one.
	Clock clock.Clock
	FS    vfs.FS
	// Checked is what internal/config's rules checked of the config: the
	// start warning reads which links are unprotected from it.
	Checked config.Peer
}

// RaftTLS is node.RaftTLS: the files of the Raft port's mutual TLS.
type RaftTLS struct{ CAFile, CertFile, KeyFile string }

func (r RaftTLS) enabled() bool { return r.CAFile != "" || r.CertFile != "" || r.KeyFile != "" }

// LogEntry is node.LogEntry: one entry of one shard's log.
type LogEntry struct{ Shard, Index uint64 }
