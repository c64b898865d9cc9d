package node

import (
	"context"
	"fmt"

	"github.com/lockmesh/lockmesh/internal/client"
	"github.com/lockmesh/lockmesh/internal/level"
	"github.com/lockmesh/lockmesh/internal/peer"
)

// Node is one peer of a lock mesh. It is safe for concurrent use. Create it
// with Start and release it with Close.
type Node struct {
	cfg Config // as Start filled it in
	// peer is the running peer (internal/peer): its ports, gossip,
	// replicas, membership, leader side and the routes of its commands.
	peer *peer.Peer
	// client is the client side of its sessions (internal/client): the
	// live Sessions, the default session of each shard (Node.Lock),
	// their leases and keepalives, and the waiters grants are handed to.
	client *client.Client
	obs    *telemetry // metrics and traces
	// campaigns are its Sessions' campaigns, which Leave ends first.
	campaigns campaigns
}

// Start starts a peer: it listens on the configured addresses, joins the
// gossip mesh and then either forms a new cluster with BootstrapExpect
// peers, rejoins its cluster from DataDir, or joins an existing one. Start
// returns once the peer listens; calls such as Lock wait (bounded by their
// context) until the cluster is formed. Use Ready to wait explicitly.
func Start(ctx context.Context, cfg Config) (*Node, error) { return start(ctx, cfg, peer.Hooks{}) }

// start is Start with a test's hooks.
func start(ctx context.Context, cfg Config, hooks peer.Hooks) (*Node, error) {
	if err := nilContext(ctx, "Start"); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("start %s: %w", cfg.Name, err)
	}
	raftInMemory := hooks.RaftTransport != nil
	if err := cfg.validate(raftInMemory); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	obs, err := newTelemetry(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: metrics: %v", ErrInvalidConfig, err)
	}
	p, err := peer.Start(ctx, cfg.peerConfig(raftInMemory), hooks, obs)
	if err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, peer: p, client: p.Client(), obs: obs}
	if err := obs.register(n); err != nil {
		p.Kill()
		return nil, fmt.Errorf("%w: metrics: %v", ErrInvalidConfig, err)
	}
	return n, nil
}

// Ready returns a channel closed once this peer knows the cluster layout and
// runs its replicas: from then on lock calls are sent to the shards instead
// of waiting for the cluster to form. It does not mean the shards have
// leaders: after a restart each shard still elects one (a few election
// timeouts), and a cluster restarted as a whole first needs a quorum of
// every shard back, so the first Lock can wait seconds after Ready. Use
// WaitServing to wait until locks are granted without that wait.
func (n *Node) Ready() <-chan struct{} { return n.peer.Ready() }

// WaitServing waits, bounded by ctx, until this peer is Ready and every
// lock shard answers a linearizable read through it: each has a leader
// with a quorum, so a Lock made now waits only for the key. It returns
// the reason if ctx ends first.
func (n *Node) WaitServing(ctx context.Context) error {
	if err := nilContext(ctx, "Node.WaitServing"); err != nil {
		return err
	}
	return n.peer.WaitServing(ctx)
}

// Name returns the peer's name.
func (n *Node) Name() string { return n.cfg.Name }

// GossipAddr returns the address memberlist listens on, for others to Join.
func (n *Node) GossipAddr() string { return n.peer.GossipAddr() }

// Close stops the peer. It closes this peer's sessions first, so locks it
// holds are handed to waiters at once instead of after the session TTL,
// then leaves the gossip mesh and stops every goroutine, listener and file.
// Close is idempotent; calls made after it return ErrClosed.
func (n *Node) Close() error { return n.peer.Close() }

// Leave moves this peer out of the cluster gracefully: first its
// Sessions resign the elections they lead, electing the next candidates
// at once, and withdraw from those they campaign in, and no Campaign
// starts here any more (ErrClosed); then it asks for its replicas and
// leaderships to be moved to other peers, waits until they
// are (the cluster never drops below the replication factor, so this needs
// enough other peers), then closes its sessions, handing their locks on,
// and closes the node. If ctx ends first the peer stays draining and
// running, and Leave returns an error.
func (n *Node) Leave(ctx context.Context) error {
	if err := nilContext(ctx, "Node.Leave"); err != nil {
		return err
	}
	if n.peer.IsClosed() {
		return ErrClosed
	}
	n.campaigns.leave(ctx)
	return n.peer.Leave(ctx)
}

// FeatureLevels returns the oldest and newest feature levels this release
// speaks: a cluster at a level outside them is refused (ErrIncompatible).
// Rolling upgrades need the next release to speak this one's newest level
// (docs/UPGRADING.md).
func FeatureLevels() (oldest, newest uint8) { return uint8(level.Min), uint8(level.Max) }
