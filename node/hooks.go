package node

import (
	"context"
	"net"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/lni/dragonboat/v4/config"

	"github.com/lockmesh/lockmesh/internal/level"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// testHooks are what tests change about a peer: fault-injecting transports,
// an observer of every apply, and deliberately broken variants that the
// safety checkers must catch. They are not part of Config: Start runs
// with none of them, and nothing a user can set makes locking unsafe.
// Tests start peers through start.
type testHooks struct {
	// raftTransport and rpcDial are an in-memory Raft transport and a
	// dialer for lockmesh's transport, both able to inject faults.
	raftTransport config.TransportFactory
	rpcDial       func(ctx context.Context, addr string) (net.Conn, error)
	// gossipTransport builds the memberlist transport gossip runs on,
	// listening on bindAddr (GossipAddr), so tests can cut gossip alone.
	gossipTransport func(bindAddr string) (memberlist.NodeAwareTransport, error)
	// unsafeExpireAfter, when set, makes a leader expire sessions after
	// this long instead of their TTL and skip the new-leader grace: a
	// deliberately broken variant that the safety checkers must catch.
	unsafeExpireAfter time.Duration
	// unsafeSkipExpiryTerm makes the lock state machines apply every
	// ExpireSession whatever term decided it, as before the term fence:
	// a deliberately broken variant (a paused or stalled ex-leader's
	// expiry then commits under its successor) the checkers must catch.
	unsafeSkipExpiryTerm bool
	// onApply, when set, sees every lock shard entry this peer applies,
	// on dragonboat's apply goroutine, with the grants it made (in commit
	// order, tokens ascending). It must not block. Tests check every
	// replica's apply stream with it.
	onApply func(shard, index uint64, grants []lockfsm.Grant)
	// holdLevel, when set, makes this peer play a release whose newest
	// feature level is holdLevel: it gossips that as its newest version and
	// its replicas halt on entries of newer formats (mixed-version tests).
	holdLevel level.Level
	// holdSnapshot, when set, makes this peer's lock replicas load
	// snapshots of formats up to holdSnapshot only, as a release that does
	// not know newer ones: they halt on any other (mixed-version tests).
	holdSnapshot byte
	// dropCancels, when set and returning true, makes the withdrawal of an
	// abandoned lock attempt fail without being proposed, as one that
	// cannot commit in time does.
	dropCancels func() bool
	// unsafeNoAuthz switches off the authorization of requests from the
	// network (internal/authz): the broken variant the hostile-peer
	// suite must catch.
	unsafeNoAuthz bool
	// unsafeNoRaftFilter lets every well-formed Raft message through to
	// dragonboat (no internal/raftauth filter): the broken variant the
	// Raft port's hostile tests must catch.
	unsafeNoRaftFilter bool
	// unsafeGrantQueued makes this peer's client side take a Queued
	// answer to an acquire (the attempt waits in the key's queue) as a
	// grant, with the answer's token (0): a lock handed out that the
	// cluster never granted. A deliberately broken variant the lock
	// family's checkers must catch (nemesis_family_test.go).
	unsafeGrantQueued bool
	// unsafeKeepPartialLockAll makes a LockAll that fails keep what it
	// took on the shards before the one that failed instead of giving it
	// back: the partial hold the family's checkers must catch.
	unsafeKeepPartialLockAll bool
}
