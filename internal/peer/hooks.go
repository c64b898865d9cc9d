package peer

import (
	"context"
	"net"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/lni/dragonboat/v4/config"

	"github.com/lockmesh/lockmesh/internal/level"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// Hooks are what tests change about a peer: fault-injecting transports,
// an observer of every apply, and deliberately broken variants that the
// safety checkers must catch. They are not part of node.Config: node.Start
// runs with none of them (or, in a binary built with the
// lockmesh_broken_termfence tag, with the two that tag names), and nothing
// a user can set makes locking unsafe. This package is internal, so only
// lockmesh's own tests reach them.
type Hooks struct {
	// RaftTransport and RPCDial are an in-memory Raft transport and a
	// dialer for lockmesh's transport, both able to inject faults.
	RaftTransport config.TransportFactory
	RPCDial       func(ctx context.Context, addr string) (net.Conn, error)
	// GossipTransport builds the memberlist transport gossip runs on,
	// listening on bindAddr (GossipAddr), so tests can cut gossip alone.
	GossipTransport func(bindAddr string) (memberlist.NodeAwareTransport, error)
	// UnsafeExpireAfter, when set, makes a leader expire sessions after
	// this long instead of their TTL and skip the new-leader grace: a
	// deliberately broken variant that the safety checkers must catch.
	UnsafeExpireAfter time.Duration
	// UnsafeSkipExpiryTerm makes the lock state machines apply every
	// ExpireSession whatever term decided it, as before the term fence:
	// a deliberately broken variant (a paused or stalled ex-leader's
	// expiry then commits under its successor) the checkers must catch.
	UnsafeSkipExpiryTerm bool
	// OnApply, when set, sees every lock shard entry this peer applies,
	// on dragonboat's apply goroutine, with the grants it made (in commit
	// order, tokens ascending). It must not block. Tests check every
	// replica's apply stream with it.
	OnApply func(shard, index uint64, grants []lockfsm.Grant)
	// HoldLevel, when set, makes this peer play a release whose newest
	// feature level is holdLevel: it gossips that as its newest version and
	// its replicas halt on entries of newer formats (mixed-version tests).
	HoldLevel level.Level
	// HoldSnapshot, when set, makes this peer's lock replicas load
	// snapshots of formats up to HoldSnapshot only, as a release that does
	// not know newer ones: they halt on any other (mixed-version tests).
	HoldSnapshot byte
	// DropCancels, when set and returning true, makes the withdrawal of an
	// abandoned lock attempt fail without being proposed, as one that
	// cannot commit in time does.
	DropCancels func() bool
	// UnsafeNoAuthz switches off the authorization of requests from the
	// network (internal/authz): the broken variant the hostile-peer
	// suite must catch.
	UnsafeNoAuthz bool
	// UnsafeNoRaftFilter lets every well-formed Raft message through to
	// dragonboat (no internal/raftauth filter): the broken variant the
	// Raft port's hostile tests must catch.
	UnsafeNoRaftFilter bool
	// UnsafeGrantQueued makes this peer's client side take a Queued
	// answer to an acquire (the attempt waits in the key's queue) as a
	// grant, with the answer's token (0): a lock handed out that the
	// cluster never granted. A deliberately broken variant the lock
	// family's checkers must catch (nemesis_family_test.go).
	UnsafeGrantQueued bool
	// UnsafeKeepPartialLockAll makes a LockAll that fails keep what it
	// took on the shards before the one that failed instead of giving it
	// back: the partial hold the family's checkers must catch.
	UnsafeKeepPartialLockAll bool
	// JournalEvents, when not 0, is how many events each lock replica's
	// journal keeps instead of replica.JournalEvents: a test makes
	// watches fall behind it quickly.
	JournalEvents int
	// UnsafeWatchSkipHandOffs makes this peer's watch answers leave out
	// the grants that hand a key on: a watch that misses events, which
	// the watch checkers must catch.
	UnsafeWatchSkipHandOffs bool
}
