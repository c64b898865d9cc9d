package peer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lni/dragonboat/v4"
	"github.com/lni/dragonboat/v4/raftio"
	pb "github.com/lni/dragonboat/v4/raftpb"
	sm "github.com/lni/dragonboat/v4/statemachine"

	"github.com/lockmesh/lockmesh/internal/client"
	"github.com/lockmesh/lockmesh/internal/config"
	"github.com/lockmesh/lockmesh/internal/controller"
	"github.com/lockmesh/lockmesh/internal/datadir"
	"github.com/lockmesh/lockmesh/internal/dblog"
	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/leader"
	"github.com/lockmesh/lockmesh/internal/lockerr"
	"github.com/lockmesh/lockmesh/internal/membership"
	"github.com/lockmesh/lockmesh/internal/replica"
	"github.com/lockmesh/lockmesh/internal/replicas"
	"github.com/lockmesh/lockmesh/internal/router"
	"github.com/lockmesh/lockmesh/mesh"
	"github.com/lockmesh/lockmesh/transport"
)

// Node is one peer of a lock mesh. It is safe for concurrent use. Create it
// with Start and release it with Close.
type Peer struct {
	cfg   Config
	hooks Hooks // all zero outside tests
	log   *slog.Logger
	dir   datadir.Dir // the cluster record and the known peers

	mesh  *mesh.Mesh
	nh    *dragonboat.NodeHost // replicas' NodeHost, for proposals and reads
	rpc   *transport.Server
	peers *transport.Client

	// replicas owns the NodeHost and the table of replicas this peer runs.
	replicas *replicas.Table

	// ctx is the peer's one shutdown signal: shutdown cancels it, every
	// loop and wait of the peer ends with it, and isClosed reads it.
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	closeMu sync.Mutex // serializes Close and kill

	ready     chan struct{} // closed once the placement is known and local replicas run
	placement atomic.Pointer[layout.Placement]

	// adopting is the layout this peer expects before placement is set:
	// the bootstrap plan it promised (membership stores it), then the
	// layout adopt is starting replicas for (raftMember reads it).
	adopting atomic.Pointer[layout.Placement]
	// refusal is why this peer does not adopt the cluster's layout: it lists
	// this peer's name under another NodeHostID. Nil when there is none.
	refusal atomic.Pointer[layout.IdentityError]
	// levelRefusal is why this peer does not adopt the cluster's layout:
	// the cluster runs at a feature level it does not speak.
	levelRefusal atomic.Pointer[error]
	joinAddrs    []string // Config.Join and the known peers, set by open

	router *router.Router // batching, forwarding, retries, the leader cache
	// journals are the events its lock replicas applied last (watch.go).
	journals journals
	counts   replica.Counts // what this peer's lock replicas applied (Stats)
	obs      Observer       // metrics and traces (node's telemetry)

	// client is the client side of sessions: the live Sessions, the
	// default session of each shard (Node.Lock), their leases, the
	// keepalive loop and the waiters grants are handed to.
	client *client.Client
	// deadlockChecks counts the cross-shard deadlock checks that read the
	// shards' wait graphs (deadlock.go).
	deadlockChecks atomic.Int64

	// leading is the leader side of sessions on the shards this peer
	// leads: keepalives served, terms recorded, lapsed sessions expired,
	// grant notices pushed.
	leading *leader.Sessions

	// membership forms or joins the cluster (bootstrap), serves and makes
	// the membership RPCs, keeps placement current (its placement loop)
	// and carries out Leave.
	membership *membership.Service
	ctrl       *controller.Controller // acts only while this peer leads the meta shard
}

// Start starts a peer with cfg, which node.Start validated and filled in
// with defaults: it listens on the configured addresses, joins the gossip
// mesh and then either forms a new cluster with BootstrapExpect peers,
// rejoins its cluster from DataDir, or joins an existing one. It returns
// once the peer listens; calls such as Lock wait (bounded by their
// context) until the cluster is formed. obs is told what the peer does;
// hooks are a test's (zero in a release).
func Start(ctx context.Context, cfg Config, hooks Hooks, obs Observer) (*Peer, error) {
	if brokenTermFence {
		cfg.Logger.Error("BROKEN BUILD: this binary was built with lockmesh_broken_termfence; expiries are not term-fenced, the Raft port is not filtered, and locks can be granted twice. Test use only.")
		hooks.UnsafeSkipExpiryTerm, hooks.UnsafeNoRaftFilter = true, true
	}
	dblog.Install(cfg.Logger)
	n := &Peer{
		cfg:   cfg,
		hooks: hooks,
		obs:   obs,
		log:   cfg.Logger.With("peer", cfg.Name),
		ready: make(chan struct{}),
	}
	n.journals.slots = make(chan struct{}, maxRemoteWatches)
	n.journals.snapshots = make(chan struct{}, maxRemoteSnapshots)
	n.dir = datadir.Dir{FS: cfg.FS, Path: cfg.DataDir, Log: n.log}
	// Before newClient: the client side ends with n.ctx.
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.client = newClient(n)
	n.leading = newLeading(n)
	if err := n.open(ctx); err != nil {
		n.shutdown(false)
		return nil, err
	}
	n.goFunc(func() { n.membership.RunBootstrap(n.ctx, n.ready) })
	n.goFunc(n.keepAliveLoop)
	n.goFunc(n.deadlockLoop)
	n.goFunc(func() { n.leading.Run(n.ctx) })
	n.ctrl = n.newController()
	n.goFunc(func() { n.ctrl.Run(n.ctx) })
	n.goFunc(func() { n.membership.RunPlacement(n.ctx) })
	n.goFunc(n.knownPeersLoop)
	n.goFunc(n.quorumLoop)
	return n, nil
}

func (n *Peer) open(ctx context.Context) error {
	cfg := n.cfg
	if err := n.dir.Create(); err != nil {
		return err
	}
	var err error
	tcfg := transport.Config{Logger: n.log.With("component", "transport"), TLS: cfg.TLS, Dial: n.hooks.RPCDial}
	scfg := tcfg
	scfg.Known, scfg.AnswerBound = n.knownConn, AnswerBound
	if n.rpc, err = transport.Listen(cfg.RPCAddr, scfg, n.handle); err != nil {
		return fmt.Errorf("listen rpc %s: %w", cfg.RPCAddr, err)
	}
	if n.peers, err = transport.NewClient(tcfg); err != nil {
		return err
	}
	n.router = n.newRouter()
	mcfg := mesh.Config{
		Name:      cfg.Name,
		BindAddr:  cfg.GossipAddr,
		SecretKey: cfg.GossipKey,
		Meta:      n.baseMeta(),
		Local:     config.IsLoopback(cfg.GossipAddr),
		Logger:    n.log.With("component", "gossip"),
		Bound:     n.layoutOwner,
	}
	if n.hooks.GossipTransport != nil {
		if mcfg.Transport, err = n.hooks.GossipTransport(cfg.GossipAddr); err != nil {
			return fmt.Errorf("start gossip on %s: %w", cfg.GossipAddr, err)
		}
	}
	n.mesh, err = mesh.Create(mcfg)
	if err != nil {
		return fmt.Errorf("start gossip on %s: %w", cfg.GossipAddr, err)
	}
	hc := replicas.Config{
		Dir:       cfg.FS.PathJoin(cfg.DataDir, "raft"),
		RaftAddr:  cfg.RaftAddr,
		RTT:       cfg.RTT,
		FS:        cfg.FS,
		Registry:  n.mesh.NodeRegistryFactory(),
		Transport: n.hooks.RaftTransport,
		Listener:  leaderListener{n},
		Logger:    n.log,
		OnStop:    n.leading.Drop,
		OnRaftState: func(shard, _, commit uint64) {
			n.obs.OnRaftState(shard, commit)
		},
		RaftMetrics: cfg.RaftMetrics,
	}
	if !n.hooks.UnsafeNoRaftFilter {
		hc.RaftPeers = raftPeers{n}
	}
	if n.obs.TimesSyncs() {
		hc.OnSync = n.obs.OnSync
	}
	if cfg.RaftTLS.enabled() {
		hc.CAFile, hc.CertFile, hc.KeyFile = cfg.RaftTLS.CAFile, cfg.RaftTLS.CertFile, cfg.RaftTLS.KeyFile
		hc.RaftAuthorize = n.raftMember
	}
	n.warnPlaintext()
	n.hintGOMAXPROCS()
	if n.replicas, err = replicas.Open(hc); err != nil {
		return err
	}
	n.nh = n.replicas.NodeHost()
	n.membership = n.newMembership()
	meta := n.baseMeta()
	if p, err := n.dir.LoadRecord(cfg.Name, n.nh.ID(), len(cfg.Join) > 0); err != nil {
		return err
	} else if p != nil {
		meta.Cluster = p.ClusterID
		if err := n.adopt(p); err != nil {
			return err
		}
	}
	if err := n.mesh.SetMeta(meta); err != nil {
		return err
	}
	join := datadir.JoinAddrs(cfg.Join, n.dir.LoadKnownPeers())
	if len(join) == 0 {
		return nil
	}
	// The peers we know may be starting too (or be down a while), so Start
	// does not wait for them: the join goes on in the background until one
	// answers, and they may also reach us first. Lock calls meanwhile wait
	// within their context and then say why (see waitReady).
	n.joinAddrs = join
	n.goFunc(func() { n.join(join) })
	return nil
}

// joinPatience is how long the background join tries before it logs that
// no address answered yet (it goes on trying).
const joinPatience = 5 * time.Second

// join joins the gossip mesh through addrs, retrying until one answers or
// the node closes. Until then the mesh's JoinError says what the last
// attempt hit (a gossip key mismatch is logged by the mesh at once).
func (n *Peer) join(addrs []string) {
	ctx, cancel := context.WithTimeout(n.ctx, joinPatience)
	_, err := n.mesh.Join(ctx, addrs)
	cancel()
	if err == nil || n.IsClosed() {
		return
	}
	n.log.Warn("no Join address answered yet; still trying", "join", addrs, "err", n.mesh.JoinError())
	if _, err := n.mesh.Join(n.ctx, addrs); err != nil {
		return // closed
	}
	n.log.Info("joined the gossip mesh", "join", addrs)
}

// Ready is closed once this peer knows the cluster layout and runs its
// replicas (node.Node.Ready).
func (n *Peer) Ready() <-chan struct{} { return n.ready }

// WaitServing waits until every lock shard answers a linearizable read
// through this peer (node.Node.WaitServing).
func (n *Peer) WaitServing(ctx context.Context) error {
	p, err := n.WaitReady(ctx)
	if err != nil {
		return err
	}
	shards := p.ShardIDs()[1:] // the lock shards
	errs := make([]error, len(shards))
	var wg sync.WaitGroup
	for i, shard := range shards {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = n.router.ReadRetrying(ctx, shard, replica.Query{Kind: replica.QueryKey})
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// GossipAddr returns the address memberlist listens on, for others to Join.
func (n *Peer) GossipAddr() string { return n.mesh.Addr() }

// Close closes this peer's sessions, handing their locks on, then leaves
// the gossip mesh and stops every goroutine, listener and file
// (node.Node.Close). It is idempotent.
func (n *Peer) Close() error {
	n.closeMu.Lock()
	defer n.closeMu.Unlock()
	if n.IsClosed() {
		return nil
	}
	n.closeSessions()
	n.shutdown(true)
	return nil
}

// Kill stops the peer abruptly, as a crash would: no session is closed and
// no goodbye is gossiped. Tests use it, and node.Start when it fails after
// Start.
func (n *Peer) Kill() {
	n.closeMu.Lock()
	defer n.closeMu.Unlock()
	if n.IsClosed() {
		return
	}
	n.shutdown(false)
}

// shutdown stops everything; leave says goodbye on gossip first.
func (n *Peer) shutdown(leave bool) {
	n.cancel()
	// Collections stop reading the peer before its parts close.
	n.obs.Close()
	if n.router != nil {
		// Calls still waiting on a command return lockerr.Closed now.
		n.router.Close()
	}
	if n.mesh != nil {
		if leave {
			_ = n.mesh.Leave(time.Second)
		}
		_ = n.mesh.Close()
	}
	if n.rpc != nil {
		_ = n.rpc.Close()
	}
	n.wg.Wait()
	if n.peers != nil {
		_ = n.peers.Close()
	}
	if n.replicas != nil {
		n.replicas.Close()
	}
}

// IsClosed reports whether Close or kill has begun: calls made from then
// on return lockerr.Closed.
func (n *Peer) IsClosed() bool { return n.ctx.Err() != nil }

// every runs f every interval, on the calling goroutine, until the node
// stops.
func (n *Peer) every(interval time.Duration, f func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-n.ctx.Done():
			return
		}
		f()
	}
}

func (n *Peer) goFunc(f func()) {
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		f()
	}()
}

// WaitReady blocks until the cluster layout is known.
func (n *Peer) WaitReady(ctx context.Context) (*layout.Placement, error) {
	select {
	case <-n.ready:
		return n.placement.Load(), nil
	case <-n.ctx.Done():
		return nil, lockerr.Closed
	case <-ctx.Done():
		if r := n.refusal.Load(); r != nil {
			return nil, fmt.Errorf("%w: not admitted to the cluster yet: %w: %w", lockerr.Unavailable, r, ctx.Err())
		}
		if r := n.levelRefusal.Load(); r != nil {
			return nil, fmt.Errorf("%w: %w: %w", lockerr.Unavailable, *r, ctx.Err())
		}
		if je := n.mesh.JoinError(); je != nil {
			return nil, fmt.Errorf("%w: not joined: no Join address answered (%v): %w", lockerr.Unavailable, je, ctx.Err())
		}
		if n.cfg.BootstrapExpect == 0 {
			return nil, fmt.Errorf("%w: not admitted to a cluster yet (joining through %v): %w", lockerr.Unavailable, n.joinAddrs, ctx.Err())
		}
		return nil, fmt.Errorf("%w: cluster not formed yet (bootstrap expects %d peers): %w", lockerr.Unavailable, n.cfg.BootstrapExpect, ctx.Err())
	}
}

// adopt makes p this peer's layout: it records it in the data dir, starts
// the replicas p places here and opens lock calls. Called once. It
// refuses, with an *layout.IdentityError, a layout that lists this peer's name
// under another NodeHostID: those replicas are another data dir's.
func (n *Peer) adopt(p *layout.Placement) error {
	if ie := p.CheckIdentity(n.cfg.Name, n.nh.ID()); ie != nil {
		return ie
	}
	if err := n.checkLevel(p); err != nil {
		return err
	}
	if err := n.dir.SaveRecord(p); err != nil {
		return err
	}
	// The replicas start talking before p is stored below: the Raft
	// transport's check of peers (raftMember) reads p from here meanwhile.
	n.adopting.Store(p)
	for _, shard := range p.ShardIDs() {
		r, ok := p.Replica(shard, n.cfg.Name)
		if !ok {
			continue
		}
		if err := n.startReplica(p, shard, r); err != nil {
			// A replica that halted while replaying its log (an entry
			// or snapshot of a newer release) stays stopped with its
			// data, logged and reported by Placement; the peer serves
			// its other shards, and the other replicas serve this one.
			var he *lockerr.HaltError
			if !errors.As(err, &he) {
				return err
			}
		}
	}
	membership.NoteShortfall(n.log, nil, p)
	n.placement.Store(p)
	close(n.ready)
	n.log.Info("cluster layout adopted", "cluster", p.ClusterID, "shards", p.Shards, "peers", len(p.Peers))
	return nil
}

// startReplica starts this peer's replica r of shard: from its data if it
// ran before, else as an initial member or by joining the running shard.
// It returns the *lockerr.HaltError of a replica that halted here.
func (n *Peer) startReplica(p *layout.Placement, shard uint64, r layout.Replica) error {
	halt := replica.Halter{OnStop: n.haltReplica, SnapshotIndex: func() uint64 { return n.snapshotIndex(shard) }, OnSkip: n.skippedEntry}
	for _, e := range n.cfg.UnsafeSkipEntries {
		if e.Shard == shard {
			halt.Skip = append(halt.Skip, e.Index)
		}
	}
	var create sm.CreateStateMachineFunc
	if shard == metaShardID {
		create = func(uint64, uint64) sm.IStateMachine { return replica.NewMeta(halt) }
	} else {
		create = func(uint64, uint64) sm.IStateMachine {
			return replica.NewLock(replica.LockConfig{Shard: shard, OnGrant: n.leading.OnApplyGrants, Journal: n.journals.start(shard, n.hooks.JournalEvents),
				OnApply: n.hooks.OnApply, SkipTermCheck: n.hooks.UnsafeSkipExpiryTerm,
				MaxFormat: n.TopLevel().CommandFormat(), MaxSnapshot: n.hooks.HoldSnapshot,
				SnapshotFormat: func() byte { return n.ClusterLevel().LockSnapshotFormat() }, Halt: halt,
				Counts: &n.counts, ReplayedTo: func() uint64 { return n.obs.StartCommit(shard) }})
		}
	}
	return n.replicas.Start(p, shard, r, create)
}

// skippedEntry logs an entry a replica passed over unread, as
// Config.UnsafeSkipEntries told it to. It runs on dragonboat's apply
// goroutine and does not block.
func (n *Peer) skippedEntry(shard, index uint64, cause error) {
	n.log.Warn("replica skipped an entry it cannot read, as UnsafeSkipEntries says; its commands are lost",
		"shard", shard, "index", index, "err", cause)
}

// haltReplica stops the replica whose state machine fail-stopped at an
// entry it cannot read, keeping its data: the log still holds the entry,
// and an upgraded peer replays it at its next start. It runs on
// dragonboat's apply goroutine and does not block.
func (n *Peer) haltReplica(he *lockerr.HaltError) {
	if he.Snapshot {
		n.log.Error("replica stopped: it cannot load a snapshot of its shard", "shard", he.Shard,
			"index", he.Index, "format_version", he.Version, "err", he.Err,
			"fix", "upgrade this peer; its replica loads the snapshot from its data dir at the next start")
	} else {
		n.log.Error("replica stopped: it cannot read an entry of its shard's log", "shard", he.Shard,
			"index", he.Index, "format_version", he.Version, "err", he.Err,
			"fix", "upgrade this peer; its replica replays the entry from the log at the next start. If no release reads the entry, restart every peer hosting the shard with it in Config.UnsafeSkipEntries (docs/UPGRADING.md)")
	}
	n.replicas.Halt(he.Shard, he)
}

// snapshotIndex is the log index of the newest snapshot dragonboat holds
// for this peer's replica of shard: the one a replica that halts while
// loading a snapshot was loading. 0 if there is none. It is called on
// dragonboat's snapshot goroutine and takes only the NodeHost's and the
// log reader's locks, which nothing holds while waiting for that goroutine.
func (n *Peer) snapshotIndex(shard uint64) uint64 {
	lr, err := n.nh.GetLogReader(shard)
	if err != nil {
		return 0
	}
	ss := lr.Snapshot()
	if pb.IsEmptySnapshot(ss) {
		return 0
	}
	defer func() { _ = ss.Unref() }()
	return ss.Index
}

// HaltedShard returns why this peer's replica of shard halted, or nil.
func (n *Peer) HaltedShard(shard uint64) *lockerr.HaltError {
	var he *lockerr.HaltError
	if errors.As(n.replicas.Halted(shard), &he) {
		return he
	}
	return nil
}

// HostsShard reports whether this peer runs a replica of shard.
func (n *Peer) HostsShard(shard uint64) bool { return n.replicas.Hosts(shard) }

// localReplica returns the id of the replica of shard this peer runs.
func (n *Peer) localReplica(shard uint64) (uint64, bool) { return n.replicas.Local(shard) }

// leaderListener receives dragonboat's leader changes on its own goroutine;
// it only records them and never blocks.
type leaderListener struct{ n *Peer }

func (l leaderListener) LeaderUpdated(info raftio.LeaderInfo) {
	l.n.leading.LeaderUpdated(info)
	if info.ShardID != metaShardID {
		l.n.obs.OnLeaderChange(info.ShardID)
	}
	if p := l.n.placement.Load(); p != nil && info.LeaderID != 0 {
		if name, ok := p.ReplicaPeer(info.ShardID, info.LeaderID); ok {
			l.n.SetLeader(info.ShardID, name)
		}
	}
}

// Now is the node's clock; the lease logic reads time only through it.
func (n *Peer) Now() time.Time { return n.cfg.Clock.Now() }

// warnPlaintext says which links are not protected, once at start: fine
// for local development, not for production. When Config.Insecure is what
// let an unprotected peer listen beyond loopback, it says so and names the
// exposed addresses.
func (n *Peer) warnPlaintext() {
	link := map[string]string{"GossipKey": "gossip", "RaftTLS": "raft", "TLS": "rpc"}
	peer := n.cfg.Checked
	missing := config.Missing(peer)
	var plain []string
	for _, field := range missing {
		plain = append(plain, link[field]+" (set "+field+")")
	}
	if len(plain) > 0 {
		n.log.Warn("running without encryption or peer authentication; use only for local development", "plaintext", plain)
	}
	if !n.cfg.Insecure {
		return
	}
	if exposed := config.Exposed(peer); len(exposed) > 0 && len(plain) > 0 {
		n.log.Warn("Insecure is set: unprotected ports listen beyond loopback; any host that reaches them can join, propose and lock, and a crafted gossip message costs memory (see docs/SECURITY.md)",
			"exposed", exposed, "unset", missing)
	} else {
		n.log.Info("Insecure is set but changes nothing: every address is loopback or every link is protected")
	}
}

// rpcAddr resolves a peer name to its transport address from gossip. A
// member gossiping a name the layout lists under another NodeHostID has
// none: it is not the peer the layout means (see sameIdentity).
func (n *Peer) rpcAddr(name string) (string, bool) {
	m, ok := n.mesh.Member(name)
	if !ok || m.State != mesh.StateAlive || m.Meta.RPCAddr == "" {
		return "", false
	}
	if p := n.placement.Load(); p != nil && !sameIdentity(p, m) {
		return "", false
	}
	return m.Meta.RPCAddr, true
}
