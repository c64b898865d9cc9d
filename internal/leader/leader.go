// Package leader is the leader side of lockmesh's sessions, for every
// shard this peer leads: it serves the keepalives of the sessions' owners,
// records a new leader's term and expires the sessions whose keepalives
// stopped, and pushes grant notices to the owners of handed-off locks.
//
// It is the Raft and RPC side of internal/lease. The table there decides,
// by the rules of docs/SAFETY.md (listed at the top of internal/lease),
// which keepalives are acknowledged, when a new leader's term must be
// recorded and which sessions have lapsed; this package confirms
// leadership (ReadIndex), reads the shards' sessions and recorded terms,
// and proposes LeaderTerm and ExpireSession as the table decides.
//
// It reaches the rest of the peer only through a Host (its replicas, its
// proposals, its RPC client) and the Config it is started with, so its
// logic runs in tests against fakes, without a cluster. Requests from the
// network are authorized by node before they reach it.
package leader

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/lni/dragonboat/v4/raftio"

	"github.com/lockmesh/lockmesh/internal/client"
	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/lease"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// Host is what the leader side needs from the peer it runs on. Its
// methods are called from many goroutines, including dragonboat's apply
// goroutine for Placement.
type Host interface {
	// Placement returns the cluster layout this peer knows, or nil before
	// it knows one.
	Placement() *layout.Placement
	// Hosts reports whether this peer runs a replica of shard.
	Hosts(shard uint64) bool
	// LocalReplica returns the id of this peer's replica of shard.
	LocalReplica(shard uint64) (uint64, bool)
	// LeaderID is what this peer's replica of shard knows of its leader:
	// the leader's replica id and the Raft term, ok when one is known.
	LeaderID(shard uint64) (leader, term uint64, ok bool, err error)
	// ReadSessions reads the sessions and the recorded leader term of
	// shard through this peer's replica, linearizably: a ReadIndex round
	// confirms leadership and the replica applies everything up to the
	// read index first (rule 1).
	ReadSessions(ctx context.Context, shard uint64) (lease.State, error)
	// StaleSessions reads the same from this peer's replica as it is,
	// without a Raft round.
	StaleSessions(shard uint64) (lease.State, error)
	// Apply proposes cmd on shard and returns its result, retrying while
	// the outcome is unknown. LeaderTerm and ExpireSession go through
	// this peer's own replica.
	Apply(ctx context.Context, shard uint64, cmd lockfsm.Command) (lockfsm.Result, error)
	// ProposalTimeout bounds one try of a proposal or read.
	ProposalTimeout() time.Duration
	// Addr resolves a peer name to its RPC address, if it is reachable.
	Addr(name string) (string, bool)
	// Call sends one request to a peer's RPC address.
	Call(ctx context.Context, addr string, method uint8, body []byte) ([]byte, error)
}

// Config is what the leader side is started with.
type Config struct {
	// Name is this peer's name in the layout.
	Name string
	// SessionTTL is the peer's default session TTL; the expiry loop wakes
	// every SessionTTL/20 (and at least every RTT).
	SessionTTL time.Duration
	// RTT is the network round trip.
	RTT time.Duration
	// ElectionTimeout is every replica's election timeout: a new leader's
	// grace is two of them (lease.Options).
	ElectionTimeout time.Duration
	// UnsafeExpireAfter is lease.Options.UnsafeExpireAfter: a deliberately
	// broken variant for the safety checkers. Tests only.
	UnsafeExpireAfter time.Duration
	// Now is the lease clock: every time the table is given is read from
	// it.
	Now func() time.Time
	// Log receives what the leader side does; nil discards.
	Log *slog.Logger
	// Waiters are this peer's waiting lock attempts, woken by the grants
	// its replicas apply and by notices from other peers.
	Waiters *client.Waiters
	// NotifyMethod is the RPC method peers serve grant notices on (Notice
	// -> nothing).
	NotifyMethod uint8
}

// Sessions is the leader side of one peer's sessions. Create it with New
// before the peer's replicas start (they report leader changes and apply
// grants to it), and run its loops with Run. Its methods are safe for
// concurrent use.
type Sessions struct {
	cfg    Config
	host   Host
	log    *slog.Logger
	leases *lease.Table
	// kick wakes the expiry loop when this peer becomes a leader, so it
	// records its term at once instead of at the next tick.
	kick        chan struct{}
	notifyQ     chan notifyJob
	notifySlots chan struct{} // a slot per grant notice being pushed
	wg          sync.WaitGroup
}

// New returns the leader side of the peer host, with an empty lease
// table.
func New(cfg Config, host Host) *Sessions {
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Sessions{
		cfg:  cfg,
		host: host,
		log:  log,
		leases: lease.New(lease.Options{
			ElectionTimeout:   cfg.ElectionTimeout,
			UnsafeExpireAfter: cfg.UnsafeExpireAfter,
		}),
		kick:        make(chan struct{}, 1),
		notifyQ:     make(chan notifyJob, notifyQueue),
		notifySlots: make(chan struct{}, maxNotifyCalls),
	}
}

// Run runs the expiry loop and the notice loop until ctx ends, then waits
// for the proposals and notices they started.
func (s *Sessions) Run(ctx context.Context) {
	s.goFunc(func() { s.notifyLoop(ctx) })
	s.expiryLoop(ctx)
	s.wg.Wait()
}

func (s *Sessions) goFunc(f func()) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		f()
	}()
}

// LeaderUpdated records a leader change reported by dragonboat. It only
// records it and never blocks.
func (s *Sessions) LeaderUpdated(info raftio.LeaderInfo) {
	if s.leases.LeaderChanged(info.ShardID, info.ReplicaID, info.LeaderID, info.Term, s.cfg.Now()) {
		s.wake()
	}
}

// Drop forgets the lease state of shard: this peer's replica of it
// stopped.
func (s *Sessions) Drop(shard uint64) { s.leases.Drop(shard) }

// Grace is how long past its election a new leader waits before it starts
// counting a session's TTL (lease.Table.Grace).
func (s *Sessions) Grace() time.Duration { return s.leases.Grace() }

// LeaderSince returns when this peer became the leader of shard, if it
// leads it.
func (s *Sessions) LeaderSince(shard uint64) (time.Time, bool) { return s.leases.LeaderSince(shard) }

func (s *Sessions) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}
