package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"time"

	"github.com/lockmesh/lockmesh/node"
)

func init() {
	Register("lockmesh", func(env Env) (System, error) {
		return &lockmeshSystem{dir: env.Dir, shards: env.Shards}, nil
	})
	Register("lockmesh-release", func(env Env) (System, error) {
		return &lockmeshSystem{dir: env.Dir, shards: env.Shards, release: true}, nil
	})
	// The cost of observing: the same cluster with OpenTelemetry's SDK
	// recording every metric, and with every call traced as well.
	Register("lockmesh-metrics", func(env Env) (System, error) {
		return &lockmeshSystem{dir: env.Dir, shards: env.Shards, observe: observeMetrics}, nil
	})
	Register("lockmesh-traced", func(env Env) (System, error) {
		return &lockmeshSystem{dir: env.Dir, shards: env.Shards, observe: observeTraces}, nil
	})
	// What forwarding costs: each mutex Lock is called on the peer that
	// leads its key's shard, so no command is forwarded. Not a deployment
	// (an application cannot pick its peer per key); the bound of what a
	// cheaper forwarded path could give.
	Register("lockmesh-leader", func(env Env) (System, error) {
		return &lockmeshSystem{dir: env.Dir, shards: env.Shards, atLeader: true}, nil
	})
}

// lockmeshSystem is 3 lockmesh peers in the bench process, talking over
// real loopback TCP with their data on disk (fsync on): the defaults.
// With release set, workers give locks up with Lock.Release, which does
// not wait for the release to commit, instead of Lock.Unlock.
type lockmeshSystem struct {
	dir     string
	shards  int // 0: node's default
	release bool
	// atLeader calls each mutex Lock on the peer leading its key's shard,
	// as leaders (read after Settle) says.
	atLeader bool
	leaders  map[uint64]*node.Node
	observe  observeMode
	obs      *observers
	peers    []*node.Node
}

func (s *lockmeshSystem) Name() string {
	switch {
	case s.release:
		return "lockmesh-release"
	case s.observe == observeMetrics:
		return "lockmesh-metrics"
	case s.observe == observeTraces:
		return "lockmesh-traced"
	case s.atLeader:
		return "lockmesh-leader"
	}
	return "lockmesh"
}
func (s *lockmeshSystem) PIDs() []int { return nil }

// RaftCounts sums the peers' counters: every replica applies every entry
// of its shard, so the ratio is that of the shards' entries.
func (s *lockmeshSystem) RaftCounts() (entries, commands uint64) {
	for _, p := range s.peers {
		st := p.Stats()
		entries += st.RaftEntries
		commands += st.Commands
	}
	return entries, commands
}

func (s *lockmeshSystem) Start(ctx context.Context) error {
	s.obs = newObservers(s.observe)
	peers, err := StartLockmesh(ctx, s.dir, 3, func(c *node.Config) {
		c.Shards = s.shards
		s.obs.tune(c)
	})
	s.peers = peers
	return err
}

// Settle waits until the peers' controller has evened out shard leadership.
func (s *lockmeshSystem) Settle(ctx context.Context) error {
	if len(s.peers) == 0 {
		return errors.New("lockmesh is not started")
	}
	if err := WaitSettled(ctx, s.peers[0], 2*time.Second); err != nil {
		return err
	}
	if s.atLeader {
		shards, err := s.peers[0].Placement(ctx)
		if err != nil {
			return err
		}
		byName := map[string]*node.Node{}
		for _, p := range s.peers {
			byName[p.Name()] = p
		}
		s.leaders = map[uint64]*node.Node{}
		for _, sh := range shards {
			if p, ok := byName[sh.Leader]; ok {
				s.leaders[sh.Shard] = p
			}
		}
	}
	return nil
}

func (s *lockmeshSystem) Stop() error {
	closePeers(s.peers)
	s.peers = nil
	s.obs.stop()
	return nil
}

// NewWorker spreads workers over the peers round-robin, as an application
// embedding one peer per process would.
func (s *lockmeshSystem) NewWorker(id int) (Worker, error) {
	if len(s.peers) == 0 {
		return nil, errors.New("lockmesh is not started")
	}
	w := &lockmeshWorker{n: s.peers[id%len(s.peers)], release: s.release}
	if s.atLeader {
		w.leaders = s.leaders
	}
	return w, nil
}

// lockmeshWorker takes mutexes with Node.Lock, on the node's default
// sessions, and the lock family (read/write locks, semaphores, LockAll)
// through a Session of its own, opened at its first family lock, as an
// etcd worker's concurrency.Session.
type lockmeshWorker struct {
	n       *node.Node
	release bool
	sess    *node.Session
	// leaders, when set, is the peer leading each shard: Lock is called
	// there (lockmesh-leader).
	leaders map[uint64]*node.Node
}

// peerFor is the peer the worker locks key through.
func (w *lockmeshWorker) peerFor(ctx context.Context, key string) *node.Node {
	if w.leaders != nil {
		if shard, err := w.n.ShardOf(ctx, key); err == nil {
			if p, ok := w.leaders[shard]; ok {
				return p
			}
		}
	}
	return w.n
}

func (w *lockmeshWorker) Lock(ctx context.Context, key string) (uint64, bool, func(context.Context) error, error) {
	l, err := w.peerFor(ctx, key).Lock(ctx, key)
	if err != nil {
		return 0, false, nil, err
	}
	return l.Token(), true, w.unlock(l), nil
}

// unlock is how the worker gives l up: Unlock, or Release with release set.
func (w *lockmeshWorker) unlock(l *node.Lock) func(context.Context) error {
	if w.release {
		return func(context.Context) error { return l.Release() }
	}
	return l.Unlock
}

func (w *lockmeshWorker) TryLock(ctx context.Context, key string) (uint64, bool, func(context.Context) error, error) {
	l, err := w.n.TryLock(ctx, key)
	if errors.Is(err, node.ErrLocked) {
		return 0, false, nil, fmt.Errorf("%w: %v", ErrBusy, err)
	}
	if err != nil {
		return 0, false, nil, err
	}
	return l.Token(), true, w.unlock(l), nil
}

// session returns the worker's Session, opening it on first use.
func (w *lockmeshWorker) session(ctx context.Context) (*node.Session, error) {
	if w.sess == nil {
		s, err := w.n.NewSession(ctx)
		if err != nil {
			return nil, err
		}
		w.sess = s
	}
	return w.sess, nil
}

func (w *lockmeshWorker) RLock(ctx context.Context, key string) (uint64, bool, func(context.Context) error, error) {
	return w.rw(ctx, key, (*node.RWMutex).RLock)
}

func (w *lockmeshWorker) WLock(ctx context.Context, key string) (uint64, bool, func(context.Context) error, error) {
	return w.rw(ctx, key, (*node.RWMutex).Lock)
}

func (w *lockmeshWorker) rw(ctx context.Context, key string, lock func(*node.RWMutex, context.Context, ...node.LockOption) (*node.Lock, error)) (uint64, bool, func(context.Context) error, error) {
	s, err := w.session(ctx)
	if err != nil {
		return 0, false, nil, err
	}
	l, err := lock(s.RWMutex(key), ctx)
	if err != nil {
		return 0, false, nil, err
	}
	return l.Token(), true, w.unlock(l), nil
}

func (w *lockmeshWorker) Acquire(ctx context.Context, key string, permits, n int) (func(context.Context) error, error) {
	s, err := w.session(ctx)
	if err != nil {
		return nil, err
	}
	l, err := s.Semaphore(key, permits).Acquire(ctx, n)
	if err != nil {
		return nil, err
	}
	return w.unlock(l), nil
}

func (w *lockmeshWorker) LockAll(ctx context.Context, keys []string) ([]uint64, bool, func(context.Context) error, error) {
	s, err := w.session(ctx)
	if err != nil {
		return nil, false, nil, err
	}
	m, err := s.LockAll(ctx, keys...)
	if err != nil {
		return nil, false, nil, err
	}
	tokens := make([]uint64, 0, len(keys))
	for _, l := range m.Locks() {
		tokens = append(tokens, l.Token())
	}
	if w.release {
		return tokens, true, func(context.Context) error { return m.Release() }, nil
	}
	return tokens, true, m.Unlock, nil
}

// Close closes the worker's Session, if it opened one, which frees
// anything it still holds at once.
func (w *lockmeshWorker) Close() error {
	if w.sess == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return w.sess.Close(ctx)
}

// StartLockmesh starts n peers on 127.0.0.1 that bootstrap one cluster, each
// with its data under dir, and waits until every one is ready. tune, when
// not nil, adjusts each peer's config. On error it closes what it started
// and returns nil peers.
func StartLockmesh(ctx context.Context, dir string, n int, tune func(*node.Config)) ([]*node.Node, error) {
	var peers []*node.Node
	fail := func(err error) ([]*node.Node, error) {
		closePeers(peers)
		return nil, err
	}
	var seed string
	for i := 1; i <= n; i++ {
		raft, err := freeAddr()
		if err != nil {
			return fail(err)
		}
		cfg := node.Config{
			Name:            fmt.Sprintf("peer-%d", i),
			DataDir:         filepath.Join(dir, fmt.Sprintf("peer-%d", i)),
			GossipAddr:      "127.0.0.1:0",
			RaftAddr:        raft,
			RPCAddr:         "127.0.0.1:0",
			BootstrapExpect: n,
		}
		if seed != "" {
			cfg.Join = []string{seed}
		}
		if tune != nil {
			tune(&cfg)
		}
		p, err := node.Start(ctx, cfg)
		if err != nil {
			return fail(fmt.Errorf("start peer %d: %w", i, err))
		}
		if seed == "" {
			seed = p.GossipAddr()
		}
		peers = append(peers, p)
	}
	for _, p := range peers {
		select {
		case <-p.Ready():
		case <-ctx.Done():
			return fail(fmt.Errorf("%s not ready: %w", p.Name(), ctx.Err()))
		}
	}
	// Ready means the layout is known; the first lock call on each shard
	// still waits for its leader election. Take one lock per peer so that
	// start-up time includes serving.
	for _, p := range peers {
		l, err := p.Lock(ctx, "bench/start/"+p.Name())
		if err != nil {
			return fail(fmt.Errorf("first lock on %s: %w", p.Name(), err))
		}
		if err := l.Unlock(ctx); err != nil {
			return fail(fmt.Errorf("first unlock on %s: %w", p.Name(), err))
		}
	}
	return peers, nil
}

// WaitSettled waits until every shard has a leader, no peer leads two more
// shards than another, and that has held for stable: a fresh cluster's
// controller moves leaderships for a few seconds after it serves, and each
// move stalls its shard for an election round. n may be a client-only
// node: Node.Placement asks the replicas' hosts who leads.
func WaitSettled(ctx context.Context, n *node.Node, stable time.Duration) error {
	var last string
	since := time.Now()
	for {
		shards, err := n.Placement(ctx)
		if err != nil {
			return err
		}
		now, balanced := leadership(shards)
		if !balanced || now != last {
			last, since = now, time.Now()
		} else if time.Since(since) >= stable {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("leadership not settled (last seen %s): %w", last, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// leadership renders who leads each shard, and says whether every shard has
// a leader and leader counts per replica host differ by at most one.
func leadership(shards []node.ShardInfo) (string, bool) {
	var b strings.Builder
	count := map[string]int{}
	for _, s := range shards {
		for _, r := range s.Replicas {
			count[r] += 0
		}
	}
	balanced := true
	for _, s := range shards {
		fmt.Fprintf(&b, "%d:%s ", s.Shard, s.Leader)
		if s.Leader == "" {
			balanced = false
			continue
		}
		count[s.Leader]++
	}
	lo, hi := len(shards), 0
	for _, c := range count {
		lo, hi = min(lo, c), max(hi, c)
	}
	return b.String(), balanced && hi-lo <= 1
}

func closePeers(peers []*node.Node) {
	for _, p := range peers {
		_ = p.Close()
	}
}

// freeAddr returns a loopback address with a port nobody listens on now.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// FreePort returns a loopback port nobody listens on now, for systems that
// need fixed ports.
func FreePort() (int, error) {
	a, err := freeAddr()
	if err != nil {
		return 0, err
	}
	_, p, _ := net.SplitHostPort(a)
	var port int
	_, err = fmt.Sscan(p, &port)
	return port, err
}

// WaitTCP waits until addr accepts TCP connections or ctx ends.
func WaitTCP(ctx context.Context, addr string) error {
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			return c.Close()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not listening: %w (last: %v)", addr, ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
