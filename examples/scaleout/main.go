// Command scaleout grows a lock mesh from 3 to 6 peers inside one process,
// over real loopback TCP with data on disk, while a goroutine keeps locking
// and unlocking a few keys, then has one of the original peers leave
// gracefully. After each step it waits until the layout settles (every
// shard has 3 replicas, replicas per peer differ by at most one and every
// peer leads a shard) and prints replicas and leaderships per peer.
//
//	go run ./examples/scaleout
//
// Its last two lines are the final layout, peers sorted by name:
//
//	replicas per peer: peer-1=11 peer-2=10 ...
//	leaders per peer: peer-1=4 peer-2=3 ...
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/lockmesh/lockmesh/node"
)

const (
	rtt        = 20 * time.Millisecond
	sessionTTL = 2 * time.Second
	rf         = node.DefaultReplicationFactor
	// settleBound caps the wait for the layout to settle after each step.
	settleBound = 20 * time.Second
)

func main() {
	if err := run(context.Background(), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "scaleout:", err)
		os.Exit(1)
	}
}

// mesh is the set of running peers; the load goroutine picks from it.
type mesh struct {
	mu    sync.RWMutex // held for reading across each lock call of the load
	peers []*node.Node // running peers, in start order
}

func (m *mesh) list() []*node.Node {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return slices.Clone(m.peers)
}

func run(ctx context.Context, out io.Writer) error {
	dir, err := os.MkdirTemp("", "lockmesh-scaleout-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	m := &mesh{}
	defer func() {
		for _, p := range m.list() {
			p.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()

	// 1. Three peers form the cluster.
	started := time.Now()
	for i := 1; i <= 3; i++ {
		p, err := startPeer(ctx, dir, i, 3, m.list())
		if err != nil {
			return err
		}
		m.peers = append(m.peers, p)
	}
	for _, p := range m.peers {
		if err := waitReady(ctx, p); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "3 peers formed a cluster in %v (data in %s)\n", time.Since(started).Round(time.Millisecond), dir)

	// 2. A few locks taken and released on different peers.
	for i, key := range []string{"invoice/1", "invoice/2", "invoice/3"} {
		p := m.peers[i%len(m.peers)]
		l, err := p.Lock(ctx, key)
		if err != nil {
			return err
		}
		if err := l.Unlock(ctx); err != nil {
			return err
		}
		fmt.Fprintf(out, "%s locked and released %q (token %d)\n", p.Name(), key, l.Token())
	}
	if err := settle(ctx, out, m, "3 peers", time.Now(), true); err != nil {
		return err
	}

	// 3. Background load for the rest of the run.
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	ld := &load{keys: []string{"job/a", "job/b", "job/c", "job/d"}, last: map[string]uint64{}}
	loadDone := make(chan struct{})
	go func() {
		defer close(loadDone)
		ld.run(loadCtx, m)
	}()

	// 4. Grow to 6 peers, one at a time.
	for i := 4; i <= 6; i++ {
		joined := time.Now()
		p, err := startPeer(ctx, dir, i, 0, m.list())
		if err != nil {
			return err
		}
		if err := waitReady(ctx, p); err != nil {
			p.Close()
			return err
		}
		m.mu.Lock()
		m.peers = append(m.peers, p)
		m.mu.Unlock()
		if err := settle(ctx, out, m, p.Name()+" joined", joined, true); err != nil {
			return err
		}
	}

	// 5. An original peer leaves gracefully: its replicas and leaderships
	// move to the others first. It is taken out of the load first (the
	// write lock waits for a lock call in flight on it).
	m.mu.Lock()
	leaving := m.peers[2]
	m.peers = slices.Delete(m.peers, 2, 3)
	m.mu.Unlock()
	left := time.Now()
	lctx, lcancel := context.WithTimeout(ctx, time.Minute)
	err = leaving.Leave(lctx)
	lcancel()
	if err != nil {
		return fmt.Errorf("%s: %w", leaving.Name(), err)
	}
	fmt.Fprintf(out, "%s left gracefully in %v\n", leaving.Name(), time.Since(left).Round(time.Millisecond))
	var final layout
	if err := settleInto(ctx, out, m, leaving.Name()+" left", left, false, &final); err != nil {
		return err
	}

	stopLoad()
	<-loadDone
	if err := ld.result(); err != nil {
		return err
	}
	fmt.Fprintf(out, "background load: %d lock/unlock rounds on %d keys, fencing tokens increased on every grant (%d calls failed and were retried)\n",
		ld.rounds, len(ld.keys), ld.failed)
	fmt.Fprintln(out, final.line("replicas per peer", final.replicas))
	fmt.Fprintln(out, final.line("leaders per peer", final.leaders))
	return nil
}

// startPeer starts peer-i. expect > 0 makes it one of the peers forming the
// cluster; 0 joins the cluster through the first of others.
func startPeer(ctx context.Context, dir string, i, expect int, others []*node.Node) (*node.Node, error) {
	raft, err := freeAddr()
	if err != nil {
		return nil, err
	}
	cfg := node.Config{
		Name:            fmt.Sprintf("peer-%d", i),
		DataDir:         fmt.Sprintf("%s/peer-%d", dir, i),
		GossipAddr:      "127.0.0.1:0",
		RaftAddr:        raft,
		RPCAddr:         "127.0.0.1:0",
		BootstrapExpect: expect,
		RTT:             rtt,
		SessionTTL:      sessionTTL,
	}
	if len(others) > 0 {
		cfg.Join = []string{others[0].GossipAddr()}
	}
	return node.Start(ctx, cfg)
}

func waitReady(ctx context.Context, p *node.Node) error {
	select {
	case <-p.Ready():
		return nil
	case <-time.After(30 * time.Second):
		return fmt.Errorf("%s not ready after 30s", p.Name())
	case <-ctx.Done():
		return ctx.Err()
	}
}

// layout is replicas and leaderships per running peer.
type layout struct {
	names             []string // sorted
	replicas, leaders map[string]int
	problem           string // why it is not settled; "" if it is
}

func (l layout) line(title string, counts map[string]int) string {
	var b strings.Builder
	b.WriteString(title + ":")
	for _, name := range l.names {
		fmt.Fprintf(&b, " %s=%d", name, counts[name])
	}
	return b.String()
}

// readLayout reads the layout from the first peer and each shard's leader
// from the peers hosting it (dragonboat's own view there).
func readLayout(ctx context.Context, peers []*node.Node) (layout, error) {
	l := layout{replicas: map[string]int{}, leaders: map[string]int{}}
	byName := map[string]*node.Node{}
	for _, p := range peers {
		l.names = append(l.names, p.Name())
		byName[p.Name()] = p
		l.replicas[p.Name()] = 0
		l.leaders[p.Name()] = 0
	}
	slices.SortFunc(l.names, cmpPeer)
	views := map[string][]node.ShardInfo{}
	for _, p := range peers {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		v, err := p.Placement(pctx)
		cancel()
		if err != nil {
			return l, fmt.Errorf("%s: placement: %w", p.Name(), err)
		}
		views[p.Name()] = v
	}
	problems := []string{}
	for i, s := range views[peers[0].Name()] {
		live := 0
		for _, r := range s.Replicas {
			if _, ok := byName[r]; ok {
				live++
				l.replicas[r]++
			}
		}
		if live != rf || len(s.Replicas) != rf {
			problems = append(problems, fmt.Sprintf("shard %d on %v", s.Shard, s.Replicas))
		}
		// The leader as the hosts of the shard see it; they must agree.
		leader := ""
		for _, r := range s.Replicas {
			v, ok := views[r]
			if !ok || i >= len(v) || v[i].Shard != s.Shard {
				continue
			}
			switch g := v[i].Leader; {
			case g == "":
			case leader == "":
				leader = g
			case leader != g:
				problems = append(problems, fmt.Sprintf("shard %d led by %s or %s", s.Shard, leader, g))
			}
		}
		if _, ok := byName[leader]; ok {
			l.leaders[leader]++
		} else {
			problems = append(problems, fmt.Sprintf("shard %d has no known leader", s.Shard))
		}
	}
	if lo, hi := spread(l.replicas); hi-lo > 1 {
		problems = append(problems, fmt.Sprintf("replicas per peer from %d to %d", lo, hi))
	}
	if lo, hi := spread(l.leaders); lo == 0 {
		problems = append(problems, "a peer leads no shard")
	} else if hi > 2*lo {
		problems = append(problems, fmt.Sprintf("leaderships per peer from %d to %d (more than twice)", lo, hi))
	}
	l.problem = strings.Join(problems, "; ")
	return l, nil
}

func spread(m map[string]int) (lo, hi int) {
	lo = -1
	for _, v := range m {
		if lo < 0 || v < lo {
			lo = v
		}
		hi = max(hi, v)
	}
	return lo, hi
}

// cmpPeer orders peer-2 before peer-10.
func cmpPeer(a, b string) int {
	if len(a) != len(b) {
		return len(a) - len(b)
	}
	return strings.Compare(a, b)
}

// settle waits until the layout settles (or settleBound passes) and prints
// it, with the time since since.
func settle(ctx context.Context, out io.Writer, m *mesh, step string, since time.Time, table bool) error {
	var l layout
	return settleInto(ctx, out, m, step, since, table, &l)
}

func settleInto(ctx context.Context, out io.Writer, m *mesh, step string, since time.Time, table bool, l *layout) error {
	deadline := time.Now().Add(settleBound)
	for {
		var err error
		*l, err = readLayout(ctx, m.list())
		if err == nil && l.problem == "" {
			fmt.Fprintf(out, "%s: layout settled in %v\n", step, time.Since(since).Round(time.Millisecond))
			break
		}
		if time.Now().After(deadline) {
			if err != nil {
				return fmt.Errorf("%s: %w", step, err)
			}
			fmt.Fprintf(out, "%s: layout NOT settled after %v: %s\n", step, time.Since(since).Round(time.Millisecond), l.problem)
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	if table {
		for _, name := range l.names {
			fmt.Fprintf(out, "  %-7s %2d replicas, leads %d\n", name, l.replicas[name], l.leaders[name])
		}
	}
	return nil
}

// load locks and unlocks its keys in turn, on the running peers in turn,
// and checks that each key's fencing tokens strictly increase.
type load struct {
	keys   []string
	last   map[string]uint64
	rounds int
	failed int
	err    error
}

func (ld *load) run(ctx context.Context, m *mesh) {
	for i := 0; ctx.Err() == nil; i++ {
		key := ld.keys[i%len(ld.keys)]
		m.mu.RLock()
		p := m.peers[(i/len(ld.keys))%len(m.peers)]
		err := ld.once(ctx, p, key)
		m.mu.RUnlock()
		switch {
		case err == nil:
			ld.rounds++
		case ctx.Err() != nil:
		case errors.Is(err, errRegression):
			ld.err = err
			return
		default:
			// A lock call may time out while a replica moves; the key's
			// next grant must still carry a higher token.
			ld.failed++
		}
	}
}

var errRegression = errors.New("fencing token did not increase")

func (ld *load) once(ctx context.Context, p *node.Node, key string) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	l, err := p.Lock(cctx, key)
	if err != nil {
		return err
	}
	if tok := l.Token(); tok <= ld.last[key] {
		ld.err = fmt.Errorf("%w: %s got %q with token %d after token %d", errRegression, p.Name(), key, tok, ld.last[key])
		_ = l.Unlock(context.Background())
		return ld.err
	} else {
		ld.last[key] = tok
	}
	return l.Unlock(cctx)
}

func (ld *load) result() error {
	if ld.err != nil {
		return ld.err
	}
	if ld.rounds == 0 {
		return errors.New("background load: no lock was granted")
	}
	return nil
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
