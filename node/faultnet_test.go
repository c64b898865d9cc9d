package node

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/lni/vfs"

	"github.com/lockmesh/lockmesh/internal/clock"
	"github.com/lockmesh/lockmesh/internal/faultnet"
	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/peer"
)

// faultClock is an injectable lease clock: the real clock plus an offset
// that tests can jump, an optional rate skew, and a freeze for simulated
// process pauses. It derives every reading from time.Now with Add, so the
// monotonic reading is kept and shifted along with the wall reading: a Jump
// is a jump of the clock the lease logic measures durations with.
type faultClock struct {
	mu       sync.Mutex
	offset   time.Duration
	rate     float64   // 0 means the real rate
	skewFrom time.Time // real time the current rate started
	frozen   bool
	frozenAt time.Time
}

// AfterFunc is Go's: a deadline timer waits what the clock says is
// left, and the waiter compares the deadline with Now again on firing.
func (c *faultClock) AfterFunc(d time.Duration, f func()) clock.Timer { return time.AfterFunc(d, f) }

func (c *faultClock) Now() time.Time {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.readLocked(now)
}

func (c *faultClock) readLocked(now time.Time) time.Time {
	if c.frozen {
		return c.frozenAt
	}
	t := now.Add(c.offset)
	if c.rate != 0 {
		t = t.Add(time.Duration(float64(now.Sub(c.skewFrom)) * (c.rate - 1)))
	}
	return t
}

// Jump moves the clock by d (negative: back in time).
func (c *faultClock) Jump(d time.Duration) {
	c.mu.Lock()
	c.offset += d
	c.mu.Unlock()
}

// Skew makes the clock run at rate times real time from now on (1: real).
func (c *faultClock) Skew(rate float64) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.offset = c.readLocked(now).Sub(now)
	c.rate, c.skewFrom = rate, now
}

// Freeze stops the clock, as the clock of a paused process appears to the
// process itself.
func (c *faultClock) Freeze() {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.frozen {
		c.frozenAt = c.readLocked(now)
		c.frozen = true
	}
}

// Thaw restarts a frozen clock where real time is: the whole pause passes
// at once, as it does for a process resumed after SIGSTOP.
func (c *faultClock) Thaw() {
	c.mu.Lock()
	c.frozen = false
	c.mu.Unlock()
}

// Reset removes every fault: real time, real rate.
func (c *faultClock) Reset() {
	c.mu.Lock()
	c.offset, c.rate, c.frozen = 0, 0, false
	c.mu.Unlock()
}

// gate stops the load workers of a paused or crashed peer: a paused
// process runs none of its code, its lock holders included.
type gate struct {
	mu sync.Mutex
	ch chan struct{} // nil while open
}

func (g *gate) close() {
	g.mu.Lock()
	if g.ch == nil {
		g.ch = make(chan struct{})
	}
	g.mu.Unlock()
}

func (g *gate) open() {
	g.mu.Lock()
	if g.ch != nil {
		close(g.ch)
		g.ch = nil
	}
	g.mu.Unlock()
}

func (g *gate) isClosed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.ch != nil
}

func (g *gate) wait(ctx context.Context) {
	g.mu.Lock()
	ch := g.ch
	g.mu.Unlock()
	if ch != nil {
		select {
		case <-ch:
		case <-ctx.Done():
		}
	}
}

// faultPeer is one peer of a fault cluster. Its disk, addresses and clock
// survive kill and restart; a kill loses what the disk had not synced.
type faultPeer struct {
	name  string
	cfg   Config
	hooks peer.Hooks
	clock *faultClock
	gate  gate
	// disk is the peer's strict in-memory file system; its Config.fs is
	// disk wrapped with stall, which can block its fsyncs.
	disk  *vfs.MemFS
	stall *diskStall
	// incarnation counts the peer's starts: each start is a new apply
	// stream for the apply log.
	incarnation int
	cur         atomic.Pointer[Node]
	// left is set when the peer is asked to Leave: its workers stop at
	// the first ErrClosed instead of waiting for a restart.
	left atomic.Bool
}

func (p *faultPeer) node() *Node { return p.cur.Load() }

// faultCluster is an in-process cluster whose Raft, RPC and gossip traffic
// runs through one faultnet.Network, so a partition cuts all three. Gossip
// (real loopback UDP/TCP) also runs through a second network, gossipNet,
// whose rules cut gossip alone.
type faultCluster struct {
	t         testing.TB
	net       *faultnet.Network
	gossipNet *faultnet.Network
	// peers are the current members; retired ones were asked to leave and
	// are only closed at cleanup. Both change on the test goroutine alone.
	peers   []*faultPeer
	retired []*faultPeer
	opts    faultOpts
	// applies records every replica's apply stream of the lock shards.
	applies *applyLog
	seq     int64
	started int // peers ever created, for naming

	// addrMu guards the address-to-peer maps the fault network resolves
	// through: peers added to a running cluster extend them.
	addrMu     sync.Mutex
	raftPeer   map[string]string
	rpcPeer    map[string]string
	gossipPeer map[string]string
}

type faultOpts struct {
	peers, shards int
	ttl           time.Duration
	mutate        func(*Config)     // applied to every peer's config
	hook          func(*peer.Hooks) // applied to every peer's test hooks
}

// faultClusterSeq keeps Raft addresses unique across tests: the channel
// transport's listener table is process-wide.
var faultClusterSeq atomic.Int64

func startFaultCluster(t testing.TB, o faultOpts) *faultCluster {
	t.Helper()
	if o.peers == 0 {
		o.peers = 3
	}
	if o.shards == 0 {
		o.shards = 4
	}
	if o.ttl == 0 {
		o.ttl = time.Second
	}
	fc := &faultCluster{t: t, net: faultnet.New(), gossipNet: faultnet.New(), opts: o, applies: newApplyLog(),
		seq: faultClusterSeq.Add(1), raftPeer: map[string]string{}, rpcPeer: map[string]string{}, gossipPeer: map[string]string{}}
	for i := 0; i < o.peers; i++ {
		fc.peers = append(fc.peers, fc.newPeer(o.peers))
	}
	// Every peer joins through all the others; its addresses are fixed
	// across restarts.
	for _, p := range fc.peers {
		for _, q := range fc.peers {
			if q != p {
				p.cfg.Join = append(p.cfg.Join, q.cfg.GossipAddr)
			}
		}
	}
	t.Cleanup(func() {
		fc.net.Heal()
		fc.gossipNet.Heal()
		for _, p := range append(append([]*faultPeer(nil), fc.peers...), fc.retired...) {
			p.clock.Reset()
			p.stall.Release()
			p.gate.open()
			if n := p.node(); n != nil {
				_ = n.Close()
			}
		}
	})
	for _, p := range fc.peers {
		fc.start(p)
	}
	for _, p := range fc.peers {
		fc.waitReady(p)
	}
	return fc
}

// newPeer configures the next peer, peer-<n>, with every fault hook: Raft,
// RPC and gossip through the fault networks, the fault clock, a strict
// in-memory disk that can stall. bootstrapExpect 0 makes a peer that joins a running cluster; the
// caller sets Join.
func (fc *faultCluster) newPeer(bootstrapExpect int) *faultPeer {
	t, o := fc.t, fc.opts
	t.Helper()
	fc.started++
	name := fmt.Sprintf("peer-%d", fc.started)
	p := &faultPeer{name: name, clock: &faultClock{}, disk: newPeerDisk(t, "/data/"+name), stall: &diskStall{}}
	p.cfg = Config{
		Name:              name,
		DataDir:           "/data/" + name,
		GossipAddr:        freeAddr(t),
		RaftAddr:          fmt.Sprintf("fault%d-%s:1", fc.seq, name),
		RPCAddr:           freeAddr(t),
		BootstrapExpect:   bootstrapExpect,
		Shards:            o.shards,
		ReplicationFactor: 3,
		SessionTTL:        o.ttl,
		RTT:               10 * time.Millisecond,
		Logger:            testLogger(),
		fs:                vfs.Wrap(p.disk, p.stall),
		clock:             p.clock,
	}
	fc.addrMu.Lock()
	fc.raftPeer[p.cfg.RaftAddr] = name
	fc.rpcPeer[p.cfg.RPCAddr] = name
	fc.gossipPeer[p.cfg.GossipAddr] = name
	fc.addrMu.Unlock()
	p.hooks.RaftTransport = fc.net.RaftTransportFactory(name, func(addr string) string { return fc.peerOf(fc.raftPeer, addr) })
	p.hooks.RPCDial = fc.net.Dialer(name, func(addr string) string { return fc.peerOf(fc.rpcPeer, addr) })
	p.hooks.GossipTransport = func(bindAddr string) (memberlist.NodeAwareTransport, error) {
		inner, err := newGossipTransport(bindAddr)
		if err != nil {
			return nil, err
		}
		peerOf := func(addr string) string { return fc.peerOf(fc.gossipPeer, addr) }
		return fc.gossipNet.GossipTransport(name, fc.net.GossipTransport(name, inner, peerOf), peerOf), nil
	}
	if o.mutate != nil {
		o.mutate(&p.cfg)
	}
	if o.hook != nil {
		o.hook(&p.hooks)
	}
	return p
}

func (fc *faultCluster) peerOf(m map[string]string, addr string) string {
	fc.addrMu.Lock()
	defer fc.addrMu.Unlock()
	return m[addr]
}

// addPeer starts a new peer that joins the running cluster through the
// current members (BootstrapExpect 0), waits until it is ready and makes it
// a member of fc. Call it from the test goroutine.
func (fc *faultCluster) addPeer() *faultPeer {
	fc.t.Helper()
	p := fc.newPeer(0)
	for _, q := range fc.peers {
		p.cfg.Join = append(p.cfg.Join, q.cfg.GossipAddr)
	}
	// Registered before it starts, so cleanup closes it even if it never
	// becomes ready.
	fc.peers = append(fc.peers, p)
	fc.start(p)
	fc.waitReady(p)
	return p
}

// leave makes p leave gracefully (Node.Leave: its replicas move away, then
// it closes) and takes it out of fc's members; its workers stop at their
// next ErrClosed. Call it from the test goroutine.
func (fc *faultCluster) leave(ctx context.Context, p *faultPeer) error {
	p.left.Store(true)
	for i, q := range fc.peers {
		if q == p {
			fc.peers = append(fc.peers[:i:i], fc.peers[i+1:]...)
			break
		}
	}
	fc.retired = append(fc.retired, p)
	return p.node().Leave(ctx)
}

// newGossipTransport is memberlist's own UDP/TCP transport on bindAddr,
// built as memberlist builds it when Config.Transport is nil.
func newGossipTransport(bindAddr string) (*memberlist.NetTransport, error) {
	host, portStr, err := net.SplitHostPort(bindAddr)
	if err != nil {
		return nil, err
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("gossip port %q: %w", portStr, err)
	}
	return memberlist.NewNetTransport(&memberlist.NetTransportConfig{
		BindAddrs: []string{host},
		BindPort:  port,
		Logger:    log.New(io.Discard, "", 0),
	})
}

func (fc *faultCluster) start(p *faultPeer) {
	fc.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p.incarnation++
	hooks := p.hooks
	if hooks.OnApply == nil {
		hooks.OnApply = fc.applies.hook(p.name, p.incarnation)
	}
	n, err := start(ctx, p.cfg, hooks)
	if err != nil {
		fc.t.Fatalf("start %s: %v", p.name, err)
	}
	p.cur.Store(n)
}

func (fc *faultCluster) waitReady(p *faultPeer) {
	fc.t.Helper()
	select {
	case <-p.node().Ready():
	case <-time.After(20 * time.Second):
		fc.t.Fatalf("%s not ready after 20s", p.name)
	}
}

// kill crashes p (no session closed, no goodbye) and stops its workers.
// Its disk loses everything not synced before the crash, which kill
// reports. p's disk must not be stalled.
func (fc *faultCluster) kill(p *faultPeer) diskLoss {
	p.gate.close()
	return crashDisk(p.disk, p.node().peer.Kill)
}

// replaceDisk gives p a new, empty disk (its data dir created and synced,
// nothing in it), as when a data dir is wiped or the machine replaced; the
// stall control carries over. p must not be running.
func (fc *faultCluster) replaceDisk(p *faultPeer) {
	p.disk = newPeerDisk(fc.t, p.cfg.DataDir)
	p.cfg.fs = vfs.Wrap(p.disk, p.stall)
}

// restart starts p again from its data dir and lets its workers run.
func (fc *faultCluster) restart(p *faultPeer) {
	fc.start(p)
	fc.waitReady(p)
	p.gate.open()
}

// isolateHold cuts p off the network and stops its load workers where they
// are (holders stay inside, checking nothing); with freezeClock its lease
// clock stops too. It is not a process pause: the node's own goroutines
// (dragonboat's ticks and workers, the lease expiry and keepalive loops,
// Go timers) keep running, and traffic is dropped rather than held. A
// stalled disk (diskStall) is the closer in-process stand-in for a paused
// leader; examples/peer's TestProcessesPause stops a real process.
func (fc *faultCluster) isolateHold(p *faultPeer, freezeClock bool) {
	p.gate.close()
	if freezeClock {
		p.clock.Freeze()
	}
	fc.net.Isolate(p.name)
}

// rejoinHeld undoes isolateHold: the clock catches up with real time at
// once.
func (fc *faultCluster) rejoinHeld(p *faultPeer) {
	fc.net.Rejoin(p.name)
	p.clock.Thaw()
	p.gate.open()
}

// leaderCounts reports how many shards (meta included) each peer leads, by
// the view of the first live peer that knows each shard's leader.
func (fc *faultCluster) leaderCounts() map[string]int {
	counts := map[string]int{}
	for _, p := range fc.peers {
		counts[p.name] = 0
	}
	leaders, _ := fc.shardLeaders()
	for _, name := range leaders {
		counts[name]++
	}
	return counts
}

// shardLeaders names the leader of each shard whose leader a live peer
// knows, and returns the layout it read them through (nil if no peer is
// live).
func (fc *faultCluster) shardLeaders() (map[uint64]string, *layout.Placement) {
	leaders := map[uint64]string{}
	var pl *layout.Placement
	for _, p := range fc.peers {
		if n := p.node(); n != nil && !n.peer.IsClosed() {
			pl = n.peer.Placement()
			break
		}
	}
	if pl == nil {
		return leaders, nil
	}
	for _, shard := range pl.ShardIDs() {
		for _, p := range fc.peers {
			n := p.node()
			if n == nil || n.peer.IsClosed() {
				continue
			}
			if id, _, ok, err := n.peer.NodeHost().GetLeaderID(shard); err == nil && ok {
				if pe, ok := pl.PeerByReplica(id); ok {
					leaders[shard] = pe.Name
					break
				}
			}
		}
	}
	return leaders, pl
}

// leadingKeys picks the peer leading the shards of the most of keys (of
// the most shards when tied): the leader whose faults touch the most of
// the load.
func (fc *faultCluster) leadingKeys(keys []string) *faultPeer {
	leaders, pl := fc.shardLeaders()
	if pl == nil {
		return fc.mostLeading()
	}
	byKeys := map[string]int{}
	for _, key := range keys {
		byKeys[leaders[pl.ShardOf(key)]]++
	}
	shards := fc.leaderCounts()
	best := fc.peers[0]
	for _, p := range fc.peers[1:] {
		if byKeys[p.name] > byKeys[best.name] || (byKeys[p.name] == byKeys[best.name] && shards[p.name] > shards[best.name]) {
			best = p
		}
	}
	return best
}

// mostLeading and leastLeading pick the peer leading the most (fewest)
// shards.
func (fc *faultCluster) mostLeading() *faultPeer  { return fc.pickByLeads(fc.peers, true) }
func (fc *faultCluster) leastLeading() *faultPeer { return fc.pickByLeads(fc.peers, false) }

// pickByLeads picks, among candidates, the peer leading the most (fewest)
// shards.
func (fc *faultCluster) pickByLeads(candidates []*faultPeer, most bool) *faultPeer {
	counts := fc.leaderCounts()
	best := candidates[0]
	for _, p := range candidates[1:] {
		if (most && counts[p.name] > counts[best.name]) || (!most && counts[p.name] < counts[best.name]) {
			best = p
		}
	}
	return best
}

func (fc *faultCluster) others(p *faultPeer) []string {
	var out []string
	for _, q := range fc.peers {
		if q != p {
			out = append(out, q.name)
		}
	}
	return out
}

func TestFaultClock(t *testing.T) {
	c := &faultClock{}
	a := c.Now()
	c.Jump(time.Hour)
	if d := c.Now().Sub(a); d < time.Hour || d > time.Hour+time.Second {
		t.Fatalf("after Jump(1h) the clock moved %v", d)
	}
	c.Jump(-time.Hour)
	c.Freeze()
	f := c.Now()
	time.Sleep(20 * time.Millisecond)
	if !c.Now().Equal(f) {
		t.Fatal("a frozen clock moved")
	}
	c.Thaw()
	if d := c.Now().Sub(f); d < 20*time.Millisecond {
		t.Fatalf("a thawed clock is %v past the freeze, want the real 20ms+", d)
	}
	c.Skew(2)
	b := c.Now()
	time.Sleep(50 * time.Millisecond)
	if d := c.Now().Sub(b); d < 100*time.Millisecond {
		t.Fatalf("clock at rate 2 moved %v in 50ms", d)
	}
	// The monotonic reading survives, so Sub ignores wall-clock steps.
	if s := c.Now().String(); !containsMono(s) {
		t.Fatalf("reading %q has no monotonic part", s)
	}
}

func containsMono(s string) bool {
	for i := 0; i+2 < len(s); i++ {
		if s[i:i+2] == "m=" {
			return true
		}
	}
	return false
}
