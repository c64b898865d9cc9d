package node

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lni/dragonboat/v4/raftio"
	pb "github.com/lni/dragonboat/v4/raftpb"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/peer"
	"github.com/lockmesh/lockmesh/internal/replica"
	"github.com/lockmesh/lockmesh/lockfsm"
	"github.com/lockmesh/lockmesh/transport/transporttest"
)

var (
	raftFuzzSeed      = flag.Uint64("raftfuzz.seed", 0, "TestRaftFuzz: generator seed (0: a random one, printed at the start)")
	raftFuzzBatches   = flag.Int("raftfuzz.batches", 0, "TestRaftFuzz: batches per attacker (0: 300, or 5000 with LOCKMESH_SOAK=1)")
	raftFuzzTracePath = flag.String("raftfuzz.trace", "", "TestRaftFuzz: file every batch is described in before it is sent (default: a new file in the temp dir, removed if the test passes)")
)

const (
	// raftFuzzCheckEvery is how many batches are sent between two checks
	// of the cluster.
	raftFuzzCheckEvery = 20
	// raftFuzzServeBound is how long a peer may take to answer Status,
	// and each shard to serve a lock and its unlock, at a check: an
	// election takes well under a second at the tests' 10 ms RTT, so this
	// holds on a loaded 2-core machine unless a shard has stopped.
	raftFuzzServeBound = 20 * time.Second
	// raftFuzzHeapBound is the most heap (runtime HeapAlloc) the test
	// process may hold at a check, the three peers and the test together.
	// They need some tens of MiB; a peer that keeps what it is sent, or
	// allocates what a message claims, crosses it.
	raftFuzzHeapBound = 1 << 30
	// raftFuzzFlood is the most messages in one decode-amplification
	// batch (a batch of empty messages).
	raftFuzzFlood = 20000
)

// TestRaftFuzz sends generated Raft traffic to the Raft ports of live
// 3-peer clusters, over real TCP, and checks that nothing it sends takes a
// peer or a shard down. The generator knows dragonboat's wire format and
// reads the cluster (its layout and replica ids, each shard's term, commit
// and last index, the lock shards' live sessions), so most batches pass
// the frame, deployment id and version checks and reach the Raft state
// machines: every message type 0..28, those dragonboat only makes locally
// included, and some out of range; To and From mostly real replicas of the
// shard; terms, indexes, commits and hints of 0, small, near the real
// ones, huge and random; entries contiguous or not, of every type, with
// and without client ids, carrying random bytes, valid lockmesh commands
// (leader-only ones, sessions of real holders) or layouts, or dragonboat
// config changes; now and then a batch of thousands of empty messages.
//
// Three attackers, a subtest and a fresh cluster each:
//   - anonymous: any local process, on a plaintext loopback cluster;
//   - nonmember: a certificate of the cluster's CA for a name no layout
//     lists, on a RaftTLS cluster. Each of its connections must be closed
//     after the handshake (one the port keeps open fails the test); the
//     run still checks that the cluster stays live;
//   - member: peer-1's own Raft certificate (a compromised member),
//     sending to peer-2 and peer-3 of a RaftTLS cluster.
//
// Before the first batch, after every raftFuzzCheckEvery batches and after
// the last, it checks that every peer is open, answers Status within
// raftFuzzServeBound and is ready; that no replica has halted; that the
// meta shard answers a linearizable read of the layout, and every lock
// shard grants and releases a lock, each within raftFuzzServeBound (asked
// of each peer in turn); and that the heap of the process holding the
// three peers stays below raftFuzzHeapBound, 1 GiB. A panic on any
// goroutine, dragonboat's included, ends the test binary: that is the
// crash this test exists to find.
//
// Bounds: -raftfuzz.batches per attacker, 300 by default, 5000 with
// LOCKMESH_SOAK=1. An attacker's 300 batches and 16 checks take seconds
// on 2 cores, its cluster's start included (the nonmember run: about
// 3 s); a check that fails takes at most raftFuzzServeBound per step. -raftfuzz.seed replays a run's generator choices;
// the values it reads from the live cluster may differ. A crash loses the
// t.Log output, so the seed and the path of a trace are printed to stderr
// at the start, and every batch is described in the trace before it is
// sent.
//
//	go test ./node -run '^TestRaftFuzz$' -v
//	go test ./node -run '^TestRaftFuzz$/^member$' -raftfuzz.seed=7 -raftfuzz.batches=2000 -timeout 30m
func TestRaftFuzz(t *testing.T) {
	seed := *raftFuzzSeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	batches := *raftFuzzBatches
	if batches <= 0 {
		batches = 300
		if os.Getenv("LOCKMESH_SOAK") == "1" {
			batches = 5000
		}
	}
	trace := openRaftFuzzTrace(t, seed)
	t.Logf("seed %d, %d batches per attacker, trace %s", seed, batches, trace.f.Name())
	ca := transporttest.NewCA(t)
	dir := t.TempDir()
	key := randomKey(t, 32)
	// Each attacker draws from its own stream of the seed, so one can be
	// replayed alone.
	rng := func(stream uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, stream)) }

	t.Run("anonymous", func(t *testing.T) {
		peers := startClusterWith(t, clusterOpts{peers: 3, rf: 3}, func(int, *Config) {})
		fuzzRaft(t, raftAttack{peers: peers, targets: peers, rng: rng(1), batches: batches, trace: trace})
	})

	t.Run("nonmember", func(t *testing.T) {
		peers := startClusterWith(t, clusterOpts{peers: 3, rf: 3}, func(_ int, c *Config) {
			hardened(c, ca, dir, key)
		})
		cfg := &tls.Config{
			Certificates: []tls.Certificate{ca.Certificate("mallory")},
			RootCAs:      ca.Pool(),
			MinVersion:   tls.VersionTLS12,
		}
		fuzzRaft(t, raftAttack{peers: peers, targets: peers, tls: cfg, stranger: true, rng: rng(2), batches: batches, trace: trace})
	})

	t.Run("member", func(t *testing.T) {
		fuzzRaft(t, memberAttack(t, ca, dir, key, nil, rng(3), batches, trace))
	})
}

// memberAttack is peer-1's certificate attacking peer-2 and peer-3 of a
// RaftTLS cluster whose peers have hook.
func memberAttack(t *testing.T, ca *transporttest.CA, dir string, key []byte, hook func(*peer.Hooks), rng *rand.Rand, batches int, trace *raftFuzzTrace) raftAttack {
	files := map[string]RaftTLS{}
	peers := startCluster(t, clusterOpts{peers: 3, rf: 3, hook: hook, mutate: func(c *Config) {
		hardened(c, ca, dir, key)
		files[c.Name] = c.RaftTLS
	}})
	own := files[peers[0].cfg.Name]
	cert, err := tls.LoadX509KeyPair(own.CertFile, own.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}
	return raftAttack{peers: peers, targets: peers[1:], tls: cfg, rng: rng, batches: batches, trace: trace}
}

// TestRaftFuzzCatchesTwoHolders: with authorization off (the hostile
// suites' broken variant), a member's forged release of another member's
// lock commits, and the fuzzer's watch of a held lock reports two
// holders. It caught it within 20 batches in each of 3 runs.
func TestRaftFuzzCatchesTwoHolders(t *testing.T) {
	trace := openRaftFuzzTrace(t, 1)
	a := memberAttack(t, transporttest.NewCA(t), t.TempDir(), randomKey(t, 32), func(h *peer.Hooks) { h.UnsafeNoAuthz = true },
		rand.New(rand.NewPCG(1, 3)), 300, trace)
	var seen string
	a.violated = func(v string) { seen = v }
	fuzzRaft(t, a)
	if seen == "" {
		t.Fatal("300 batches with authorization off, and the watch saw no two holders")
	}
	t.Logf("caught: %s", seen)
}

// raftAttack is one attacker's run against one cluster.
type raftAttack struct {
	peers   []*testPeer // the cluster
	targets []*testPeer // the peers whose Raft ports it sends to
	tls     *tls.Config // its client config; nil for plaintext
	// stranger marks a certificate that names no member: the port must
	// close each of its connections.
	stranger bool
	rng      *rand.Rand
	batches  int
	trace    *raftFuzzTrace
	// violated, when set, is told of two holders and ends the attack
	// (the broken variant's test); nil fails the test.
	violated func(string)
}

func fuzzRaft(t *testing.T, a raftAttack) {
	probe := newRaftFuzzProbe(t, a.peers)
	// The control: the cluster serves before the attack, so a failed
	// check later is the attack's doing.
	probe.check(t, 0, nil)
	// With identity, forged commands on another member's sessions are
	// refused: a lock held by peer-2 with a waiter on peer-3 must never
	// have two holders. (Anonymously, on plaintext loopback, a forged
	// release of any session is a trusted local process's right.)
	var watch *holdWatch
	gen := &raftGen{r: a.rng, v: readRaftView(a.peers)}
	if a.tls != nil {
		watch = newHoldWatch(t, a.peers[1], a.peers[2], "raftfuzz/held")
		gen.held = append(gen.held, watch.attempt(t, a.peers[1]))
		if !a.stranger {
			gen.self = a.peers[0].cfg.Name
		}
	}

	senders := make([]*raftSender, len(a.targets))
	for i, p := range a.targets {
		senders[i] = &raftSender{addr: p.cfg.RaftAddr, tls: a.tls}
	}
	defer func() {
		for _, s := range senders {
			s.close()
		}
	}()

	recent := make([]string, 0, raftFuzzCheckEvery)
	for i := 1; i <= a.batches; i++ {
		k := gen.r.IntN(len(a.targets))
		target := a.targets[k]
		b, what := gen.batch(target.cfg.Name)
		body, err := b.Marshal()
		if err != nil {
			t.Fatalf("marshal batch %d: %v", i, err)
		}
		line := fmt.Sprintf("%s #%d -> %s %s, %d bytes: %s", t.Name(), i, target.cfg.Name, target.cfg.RaftAddr, len(body), what)
		a.trace.write(line)
		recent = append(recent, line)
		s := senders[k]
		s.send(raftFuzzFrame(body, a.tls != nil))
		if a.stranger && s.conn != nil {
			if !closedByPeer(s.conn, 2*time.Second) {
				t.Fatalf("%s kept a connection of a certificate that names no member open for 2 s after batch %d", target.cfg.Name, i)
			}
			s.refused++
			s.close()
		}
		if i%raftFuzzCheckEvery == 0 || i == a.batches {
			if watch != nil {
				if v := watch.violation(); v != "" {
					if a.violated != nil {
						a.violated(v)
						return
					}
					for _, line := range recent {
						t.Log("sent since the last check: " + line)
					}
					t.Fatalf("after %d batches: %s", i, v)
				}
			}
			probe.check(t, i, recent)
			recent = recent[:0]
			gen.v = readRaftView(a.peers)
		}
	}
	if watch != nil {
		watch.finish(t)
	}

	written := 0
	for i, s := range senders {
		written += s.written
		t.Logf("%s: %d batches written on %d connections; %d times the port refused a connection or had closed it", a.targets[i].cfg.Name, s.written, s.dials, s.refused)
	}
	if !a.stranger && written == 0 {
		t.Fatalf("no batch could be written to any Raft port: the attack never happened")
	}
}

// holdWatch is a lock held through an attack with a waiter behind it:
// the waiter granted while the holder's Done is open is two holders.
type holdWatch struct {
	key    string
	lock   *Lock
	waiter chan *Lock
	got    *Lock // the waiter's lock, once granted
}

func newHoldWatch(t *testing.T, holder, waiter *testPeer, key string) *holdWatch {
	t.Helper()
	l, err := holder.node.Lock(ctxT(t, 20*time.Second), key)
	if err != nil {
		t.Fatalf("%s: lock %q: %v", holder.cfg.Name, key, err)
	}
	w := &holdWatch{key: key, lock: l, waiter: make(chan *Lock, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() {
		for ctx.Err() == nil {
			if l, err := waiter.node.Lock(ctx, key); err == nil {
				w.waiter <- l
				return
			}
		}
	}()
	return w
}

// attempt names the held lock's attempt, for forged releases of it.
func (w *holdWatch) attempt(t *testing.T, holder *testPeer) heldAttempt {
	t.Helper()
	info, err := holder.node.Inspect(ctxT(t, 10*time.Second), w.key)
	if err != nil || len(info.Holders) != 1 {
		t.Fatalf("inspect %q: %+v, %v", w.key, info, err)
	}
	h := info.Holders[0]
	return heldAttempt{shard: holder.node.peer.Placement().ShardOf(w.key), session: h.ShardSession, req: h.Request}
}

// violation says whether the waiter holds the key while the holder's
// lease is still good; a holder whose lease the attack's disruption ended
// (Done closed) may rightly be followed.
func (w *holdWatch) violation() string {
	if w.got == nil {
		select {
		case w.got = <-w.waiter:
		default:
			return ""
		}
	}
	select {
	case <-w.lock.Done():
		return ""
	default:
		return fmt.Sprintf("two holders: the waiter was granted token %d while the holder's Done is open (token %d)", w.got.Token(), w.lock.Token())
	}
}

// finish releases the held lock and checks that the key was handed on
// with a newer token.
func (w *holdWatch) finish(t *testing.T) {
	t.Helper()
	if v := w.violation(); v != "" {
		t.Fatal(v)
	}
	w.lock.Release()
	if w.got == nil {
		select {
		case w.got = <-w.waiter:
		case <-time.After(raftFuzzServeBound):
			t.Fatalf("the waiter was not granted %v after the holder let go", raftFuzzServeBound)
		}
	}
	if w.got.Token() <= w.lock.Token() {
		t.Fatalf("the waiter's token %d is not above the holder's %d", w.got.Token(), w.lock.Token())
	}
	w.got.Release()
}

// raftFuzzFrame frames body as dragonboat's TCP transport does (see
// internal/raftnet/frame.go): magic, an 18-byte header of kind 100
// (message batch), size, header CRC and body CRC, then the body. Under
// TLS the body CRC is 0, as dragonboat leaves it.
func raftFuzzFrame(body []byte, encrypted bool) []byte {
	f := make([]byte, 20+len(body))
	f[0], f[1] = 0xAE, 0x7D
	h := f[2:20]
	binary.BigEndian.PutUint16(h[0:], 100)
	binary.BigEndian.PutUint64(h[2:], uint64(len(body)))
	if !encrypted {
		binary.BigEndian.PutUint32(h[14:], crc32.ChecksumIEEE(body))
	}
	binary.BigEndian.PutUint32(h[10:], crc32.ChecksumIEEE(h))
	copy(f[20:], body)
	return f
}

// raftSender keeps a connection to one Raft port, dialing again when the
// port has closed it (as it does after a frame it refuses or a panic it
// recovers from).
type raftSender struct {
	addr string
	tls  *tls.Config
	conn net.Conn

	written, dials, refused int
}

func (s *raftSender) send(frame []byte) {
	if s.conn != nil && closedByPeer(s.conn, time.Millisecond) {
		s.refused++
		s.close()
	}
	if s.conn == nil {
		c, err := s.dial()
		if err != nil {
			s.refused++
			return
		}
		s.conn = c
	}
	s.conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := s.conn.Write(frame); err != nil {
		s.refused++
		s.close()
		return
	}
	s.written++
}

func (s *raftSender) dial() (net.Conn, error) {
	s.dials++
	c, err := net.DialTimeout("tcp", s.addr, 5*time.Second)
	if err != nil || s.tls == nil {
		return c, err
	}
	cfg := s.tls.Clone()
	cfg.ServerName, _, _ = net.SplitHostPort(s.addr)
	tc := tls.Client(c, cfg)
	tc.SetDeadline(time.Now().Add(5 * time.Second))
	if err := tc.Handshake(); err != nil {
		c.Close()
		return nil, err
	}
	tc.SetDeadline(time.Time{})
	return tc, nil
}

func (s *raftSender) close() {
	if s.conn != nil {
		s.conn.Close()
		s.conn = nil
	}
}

// closedByPeer reports whether the far end has closed c, waiting up to
// wait for it. A Raft port never writes on a message connection, so
// anything but a timeout from a read means the connection is gone.
func closedByPeer(c net.Conn, wait time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(wait))
	var b [1]byte
	_, err := c.Read(b[:])
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

// raftFuzzTrace is the file every batch is described in before it is
// sent, so that a crash, which ends the test binary and loses its t.Log
// output, can be traced to what caused it.
type raftFuzzTrace struct{ f *os.File }

func openRaftFuzzTrace(t *testing.T, seed uint64) *raftFuzzTrace {
	var f *os.File
	var err error
	if *raftFuzzTracePath != "" {
		f, err = os.Create(*raftFuzzTracePath)
	} else {
		f, err = os.CreateTemp("", "raftfuzz-*.trace")
	}
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(os.Stderr, "TestRaftFuzz: seed %d (replay with -raftfuzz.seed=%d); each batch is described in %s before it is sent\n", seed, seed, f.Name())
	t.Cleanup(func() {
		f.Close()
		if t.Failed() || *raftFuzzTracePath != "" {
			t.Logf("trace of the batches sent: %s", f.Name())
			return
		}
		os.Remove(f.Name())
	})
	return &raftFuzzTrace{f: f}
}

// write appends line unbuffered: what was written survives a crash.
func (tr *raftFuzzTrace) write(line string) {
	tr.f.WriteString(line + "\n")
}

// raftFuzzProbe checks that a cluster under attack is alive and serving.
type raftFuzzProbe struct {
	peers  []*testPeer
	shards []uint64          // the lock shards, in order
	keys   map[uint64]string // a key of each lock shard
	turn   int               // which peer the next check asks
}

func newRaftFuzzProbe(t *testing.T, peers []*testPeer) *raftFuzzProbe {
	p := peers[0].node.peer.Placement()
	pr := &raftFuzzProbe{peers: peers, shards: p.ShardIDs()[1:], keys: map[uint64]string{}}
	for i := 0; len(pr.keys) < len(pr.shards); i++ {
		if i == 100000 {
			t.Fatalf("no key among %d lands on each of shards %v", i, pr.shards)
		}
		key := fmt.Sprintf("raftfuzz/probe-%d", i)
		if s := p.ShardOf(key); pr.keys[s] == "" {
			pr.keys[s] = key
		}
	}
	return pr
}

// check fails the test, listing recent (what was sent since the last
// check), unless every peer is open, ready and answers Status, no replica
// has halted, the meta shard and every lock shard serve, and the heap is
// within its bound.
func (pr *raftFuzzProbe) check(t *testing.T, batches int, recent []string) {
	t.Helper()
	fail := func(format string, args ...any) {
		t.Helper()
		for _, line := range recent {
			t.Log("sent since the last check: " + line)
		}
		t.Fatalf("after %d batches: %s", batches, fmt.Sprintf(format, args...))
	}
	ctx := func() context.Context { return ctxT(t, raftFuzzServeBound) }

	for _, p := range pr.peers {
		if p.node.peer.IsClosed() {
			fail("%s has closed", p.cfg.Name)
		}
		// Ready needs a known leader of every lock shard: a batch may have
		// caused an election (a TimeoutNow from a real replica is one),
		// so it must come back within the bound, as the reads below must.
		stCtx := ctx()
		for {
			st, err := p.node.Status(stCtx)
			if err == nil && st.Ready {
				break
			}
			if stCtx.Err() != nil {
				fail("%s: Status says it is not ready within %v (%v)", p.cfg.Name, raftFuzzServeBound, err)
			}
			select {
			case <-stCtx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
		for _, shard := range p.node.peer.Placement().ShardIDs() {
			if he := p.node.peer.HaltedShard(shard); he != nil {
				fail("%s: replica of shard %d halted: %v", p.cfg.Name, shard, he)
			}
		}
	}

	p := pr.peers[pr.turn%len(pr.peers)]
	pr.turn++
	start := time.Now()
	// One read may meet an election the batches caused (a TimeoutNow
	// from a real replica is one): the meta shard must serve within the
	// bound, as the lock shards must, so the read is tried until then.
	readCtx := ctx()
	for {
		_, err := p.node.readMetaPlacement(readCtx)
		if err == nil {
			break
		}
		if readCtx.Err() != nil {
			fail("%s: linearizable read of the layout (meta shard): %v; %s", p.cfg.Name, err, raftStates(pr.peers, layout.MetaShard))
		}
		select {
		case <-readCtx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
	var slowest time.Duration
	var slowShard uint64
	for _, shard := range pr.shards {
		key, began := pr.keys[shard], time.Now()
		c := ctx()
		l, err := p.node.Lock(c, key)
		if err != nil {
			fail("%s: lock %q (shard %d): %v; %s", p.cfg.Name, key, shard, err, raftStates(pr.peers, shard))
		}
		if err := l.Unlock(c); err != nil {
			fail("%s: unlock %q (shard %d): %v; %s", p.cfg.Name, key, shard, err, raftStates(pr.peers, shard))
		}
		if d := time.Since(began); d > slowest {
			slowest, slowShard = d, shard
		}
	}

	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	if ms.HeapAlloc > raftFuzzHeapBound {
		fail("heap holds %d MiB, more than the bound of %d MiB", ms.HeapAlloc>>20, raftFuzzHeapBound>>20)
	}
	t.Logf("after %d batches: every peer up, every shard served via %s in %v (slowest shard %d: %v), heap %d MiB, RSS %s",
		batches, p.cfg.Name, time.Since(start).Round(time.Millisecond), slowShard, slowest.Round(time.Millisecond), ms.HeapAlloc>>20, rss())
}

// rss is the process's resident set size, read from /proc where there is
// one: logged beside the heap, which it bounds from below.
func rss() string {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return "unknown"
	}
	var size, resident int64
	if _, err := fmt.Sscan(string(b), &size, &resident); err != nil {
		return "unknown"
	}
	return fmt.Sprintf("%d MiB", resident*int64(os.Getpagesize())>>20)
}

// raftStates says what each peer's replica of shard knows: its leader,
// term, vote, commit and log range.
func raftStates(peers []*testPeer, shard uint64) string {
	var out []string
	for _, p := range peers {
		leader, term, known, err := p.node.peer.NodeHost().GetLeaderID(shard)
		s := fmt.Sprintf("%s: leader %d (known %v, term %d, err %v)", p.cfg.Name, leader, known, term, err)
		if lr, err := p.node.peer.NodeHost().GetLogReader(shard); err == nil {
			st, _ := lr.NodeState()
			first, last := lr.GetRange()
			s += fmt.Sprintf(", state term %d vote %d commit %d, log %d..%d", st.Term, st.Vote, st.Commit, first, last)
		}
		out = append(out, s)
	}
	return fmt.Sprintf("shard %d as each peer sees it: %s", shard, strings.Join(out, "; "))
}

// raftView is what the generator knows of the cluster, read at each
// check.
type raftView struct {
	layout     *layout.Placement
	deployment uint64 // dragonboat's deployment id: batches with another are dropped
	format     byte   // the lockfsm command format the cluster writes
	addrs      []string
	// The highest term, commit and last log index any peer's replica of
	// each shard has.
	term, commit, last map[uint64]uint64
	sessions           map[uint64][]uint64 // live session ids of each lock shard
}

func readRaftView(peers []*testPeer) *raftView {
	n := peers[0].node
	v := &raftView{
		layout:     n.peer.Placement(),
		deployment: deploymentID(n),
		format:     n.peer.ClusterLevel().CommandFormat(),
		term:       map[uint64]uint64{},
		commit:     map[uint64]uint64{},
		last:       map[uint64]uint64{},
		sessions:   map[uint64][]uint64{},
	}
	for _, p := range peers {
		v.addrs = append(v.addrs, p.cfg.RaftAddr, p.node.peer.NodeHost().ID())
		for _, shard := range v.layout.ShardIDs() {
			lr, err := p.node.peer.NodeHost().GetLogReader(shard)
			if err != nil {
				continue
			}
			st, _ := lr.NodeState()
			_, last := lr.GetRange()
			v.term[shard] = max(v.term[shard], st.Term)
			v.commit[shard] = max(v.commit[shard], st.Commit)
			v.last[shard] = max(v.last[shard], last)
			if shard == layout.MetaShard || len(v.sessions[shard]) > 0 {
				continue
			}
			ids, err := p.node.peer.NodeHost().StaleRead(shard, replica.StateReader(func(s *lockfsm.State) any {
				var ids []uint64
				for _, si := range s.Sessions() {
					ids = append(ids, si.ID)
				}
				return ids
			}))
			if err == nil {
				v.sessions[shard], _ = ids.([]uint64)
			}
		}
	}
	return v
}

// deploymentID is the deployment id n's NodeHost checks every batch
// against.
func deploymentID(n *Node) uint64 {
	c := n.peer.NodeHost().NodeHostConfig()
	return c.GetDeploymentID()
}

// raftGen generates message batches for the cluster of its view.
type raftGen struct {
	r *rand.Rand
	v *raftView
	// held are lock attempts a peer other than the attacker holds: a
	// forged Release or Cancel aims at one of them half the time, and one
	// batch in 20 is a well-formed forged release of one.
	held []heldAttempt
	// self is the member the attacker's certificate names; "" without.
	self string
}

// heldAttempt is a granted Acquire: its shard, session and request.
type heldAttempt struct{ shard, session, req uint64 }

// forgedRelease is a well-formed Propose, from the attacker's own replica
// (any other replica when it has no name), of a Release of a held
// attempt: only authorization stands between it and two holders.
func (g *raftGen) forgedRelease(target string) (pb.Message, string) {
	h := g.held[g.r.IntN(len(g.held))]
	to, _ := g.v.layout.ReplicaID(h.shard, target)
	from, ok := g.v.layout.ReplicaID(h.shard, g.self)
	if !ok {
		from = g.from(h.shard, to)
	}
	cmds := []lockfsm.Command{{Op: lockfsm.OpRelease, Session: h.session, Req: 1000 + g.r.Uint64N(1000), Target: h.req}}
	b, err := lockfsm.EncodeCommandsFormat(g.v.format, cmds)
	if err != nil {
		panic(err)
	}
	m := pb.Message{Type: pb.Propose, ShardID: h.shard, To: to, From: from,
		Entries: []pb.Entry{{Type: pb.EncodedEntry, ClientID: 1 + g.r.Uint64N(1<<62), Key: 1 + g.r.Uint64N(1<<62), Cmd: append([]byte{0}, b...)}}}
	return m, describeMessage(m, []string{"forged release of a held lock: " + describeCommands(cmds)})
}

var raftFuzzHuge = []uint64{1 << 32, 1 << 62, 1 << 63, math.MaxUint64 - 1, math.MaxUint64}

// value is 0, small, near real, huge or random.
func (g *raftGen) value(real uint64) uint64 {
	switch x := g.r.IntN(100); {
	case x < 15:
		return 0
	case x < 30:
		return 1 + g.r.Uint64N(8)
	case x < 65:
		d := g.r.Int64N(7) - 3
		if d < 0 && uint64(-d) > real {
			return 0
		}
		return real + uint64(d)
	case x < 85:
		return raftFuzzHuge[g.r.IntN(len(raftFuzzHuge))]
	default:
		return g.r.Uint64()
	}
}

// batch is a message batch for the peer called target, and what it is.
func (g *raftGen) batch(target string) (pb.MessageBatch, string) {
	b := pb.MessageBatch{DeploymentId: g.v.deployment, BinVer: raftio.TransportBinVersion}
	var what []string
	if g.r.IntN(20) == 0 {
		b.DeploymentId = []uint64{0, g.v.deployment + 1, g.r.Uint64()}[g.r.IntN(3)]
		what = append(what, fmt.Sprintf("deployment %d", b.DeploymentId))
	}
	if g.r.IntN(20) == 0 {
		b.BinVer = []uint32{0, raftio.TransportBinVersion - 1, raftio.TransportBinVersion + 1, math.MaxUint32}[g.r.IntN(4)]
		what = append(what, fmt.Sprintf("binver %d", b.BinVer))
	}
	switch x := g.r.IntN(10); {
	case x < 6:
		b.SourceAddress = g.v.addrs[g.r.IntN(len(g.v.addrs))]
	case x < 8:
	case x < 9:
		b.SourceAddress = "127.0.0.1:1"
	default:
		b.SourceAddress = strings.Repeat("x", 1+g.r.IntN(4096))
	}
	what = append(what, fmt.Sprintf("source %.40q", b.SourceAddress))

	if len(g.held) > 0 && g.r.IntN(20) == 0 {
		m, w := g.forgedRelease(target)
		b.Requests = []pb.Message{m}
		return b, strings.Join(append(what, w), "; ")
	}
	if g.r.IntN(50) == 0 {
		ms, w := g.flood(target)
		b.Requests = ms
		return b, strings.Join(append(what, w), "; ")
	}
	n := 1 + g.r.IntN(8)
	if g.r.IntN(20) == 0 {
		n = 1 + g.r.IntN(64)
	}
	for range n {
		m, w := g.message(target)
		b.Requests = append(b.Requests, m)
		what = append(what, w)
	}
	return b, strings.Join(what, "; ")
}

// flood is thousands of empty messages, all zero or all addressed to one
// of target's replicas: what a batch costs to decode and queue.
func (g *raftGen) flood(target string) ([]pb.Message, string) {
	ms := make([]pb.Message, 2000+g.r.IntN(raftFuzzFlood-2000))
	if g.r.IntN(2) == 0 {
		return ms, fmt.Sprintf("%d zero messages", len(ms))
	}
	shard := g.realShard()
	to, _ := g.v.layout.ReplicaID(shard, target)
	m := pb.Message{Type: g.msgType(), ShardID: shard, To: to, From: g.from(shard, to)}
	for i := range ms {
		ms[i] = m
	}
	return ms, fmt.Sprintf("%d empty messages like %s", len(ms), describeMessage(m, nil))
}

func (g *raftGen) realShard() uint64 {
	ids := g.v.layout.ShardIDs()
	return ids[g.r.IntN(len(ids))]
}

func (g *raftGen) msgType() pb.MessageType {
	if g.r.IntN(10) == 0 {
		odd := []pb.MessageType{pb.LogQuery + 1, pb.LogQuery + 2, 64, 255, -1, math.MaxInt32, math.MinInt32}
		return odd[g.r.IntN(len(odd))]
	}
	return pb.MessageType(g.r.IntN(int(pb.LogQuery) + 1))
}

func (g *raftGen) shard() uint64 {
	switch x := g.r.IntN(100); {
	case x < 85:
		return g.realShard()
	case x < 90:
		return 0
	case x < 95:
		ids := g.v.layout.ShardIDs()
		return ids[len(ids)-1] + 1 + g.r.Uint64N(100)
	default:
		return g.value(0)
	}
}

// anyReplica is a replica id of any shard.
func (g *raftGen) anyReplica() uint64 {
	rs := g.v.layout.Replicas[g.realShard()]
	if len(rs) == 0 {
		return 0
	}
	return rs[g.r.IntN(len(rs))].ID
}

// to is mostly target's replica of shard, so that the message is
// delivered and not ignored as addressed to another replica.
func (g *raftGen) to(shard uint64, target string) uint64 {
	x := g.r.IntN(100)
	if id, ok := g.v.layout.ReplicaID(shard, target); ok && x < 75 {
		return id
	}
	rs := g.v.layout.Replicas[shard]
	switch {
	case x < 85 && len(rs) > 0:
		return rs[g.r.IntN(len(rs))].ID
	case x < 90:
		return 0
	case x < 95:
		return g.anyReplica()
	default:
		return g.value(g.v.layout.NextReplicaID)
	}
}

// from is mostly another real replica of shard than to.
func (g *raftGen) from(shard, to uint64) uint64 {
	var others []uint64
	for _, r := range g.v.layout.Replicas[shard] {
		if r.ID != to {
			others = append(others, r.ID)
		}
	}
	switch x := g.r.IntN(100); {
	case x < 70 && len(others) > 0:
		return others[g.r.IntN(len(others))]
	case x < 80:
		return to
	case x < 90:
		return 0
	default:
		return g.value(g.v.layout.NextReplicaID)
	}
}

func (g *raftGen) message(target string) (pb.Message, string) {
	shard := g.shard()
	m := pb.Message{Type: g.msgType(), ShardID: shard}
	m.To = g.to(shard, target)
	m.From = g.from(shard, m.To)
	term, commit, last := g.v.term[shard], g.v.commit[shard], g.v.last[shard]
	m.Term = g.value(term)
	m.LogTerm = g.value(term)
	m.LogIndex = g.value(last)
	m.Commit = g.value(commit)
	// Hint is a replica id in a LeaderTransfer, an index or a read
	// context elsewhere.
	if rs := g.v.layout.Replicas[shard]; len(rs) > 0 && g.r.IntN(2) == 0 {
		m.Hint = rs[g.r.IntN(len(rs))].ID
	} else {
		m.Hint = g.value(last)
	}
	if g.r.IntN(4) == 0 {
		m.HintHigh = g.value(0)
	}
	m.Reject = g.r.IntN(4) == 0
	var entries []string
	m.Entries, entries = g.entries(&m)
	if m.Type == pb.Propose && shard != layout.MetaShard && g.r.IntN(3) == 0 {
		// A proposal as a peer makes one, which only authorization can
		// refuse: one entry of lock commands, with dragonboat's header.
		m.Term = 0
		cmds := g.lockCommands(shard)
		format := g.v.format
		if lockfsm.MinCommandFormat(cmds) == lockfsm.FormatTagged {
			format = lockfsm.FormatTagged
		}
		if b, err := lockfsm.EncodeCommandsFormat(format, cmds); err == nil {
			m.Entries = []pb.Entry{{Type: pb.EncodedEntry, ClientID: 1 + g.r.Uint64N(math.MaxUint64-1), Key: 1 + g.r.Uint64N(math.MaxUint64-1), Cmd: append([]byte{0}, b...)}}
			entries = []string{"well-formed: " + describeCommands(cmds)}
		}
	}
	if m.Type == pb.InstallSnapshot && g.r.IntN(2) == 0 {
		m.Snapshot = g.snapshot(shard)
	}
	return m, describeMessage(m, entries)
}

func describeMessage(m pb.Message, entries []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s(%d) shard %d %d->%d term %d logterm %d logindex %d commit %d hint %d",
		m.Type, int32(m.Type), m.ShardID, m.From, m.To, m.Term, m.LogTerm, m.LogIndex, m.Commit, m.Hint)
	if m.HintHigh != 0 {
		fmt.Fprintf(&b, " hinthigh %d", m.HintHigh)
	}
	if m.Reject {
		b.WriteString(" reject")
	}
	if !pb.IsEmptySnapshot(m.Snapshot) || m.Snapshot.Dummy || m.Snapshot.Filepath != "" {
		ss := m.Snapshot
		fmt.Fprintf(&b, " snapshot{index %d term %d shard %d file %q size %d dummy %v type %d witness %v members %v}",
			ss.Index, ss.Term, ss.ShardID, ss.Filepath, ss.FileSize, ss.Dummy, ss.Type, ss.Witness, ss.Membership.Addresses)
	}
	if len(m.Entries) > 0 {
		fmt.Fprintf(&b, " entries(%d)[%s]", len(m.Entries), strings.Join(entries, ", "))
	}
	return b.String()
}

// entries mostly rides on Replicate and Propose, the types that carry
// them, but may come with any type.
func (g *raftGen) entries(m *pb.Message) ([]pb.Entry, []string) {
	carries := m.Type == pb.Replicate || m.Type == pb.Propose
	var n int
	switch x := g.r.IntN(100); {
	case x < 3:
		n = 100 + g.r.IntN(1900)
	case carries && x < 90, !carries && x < 15:
		n = 1 + g.r.IntN(8)
	}
	if n == 0 {
		return nil, nil
	}
	contiguous := g.r.IntN(10) < 7
	term := g.value(g.v.term[m.ShardID])
	es := make([]pb.Entry, n)
	var what []string
	if contiguous {
		what = append(what, fmt.Sprintf("contiguous from %d", m.LogIndex+1))
	}
	for i := range es {
		e := &es[i]
		if contiguous {
			e.Index, e.Term = m.LogIndex+1+uint64(i), term
		} else {
			e.Index, e.Term = g.value(g.v.last[m.ShardID]), g.value(term)
		}
		e.Type = []pb.EntryType{pb.ApplicationEntry, pb.ApplicationEntry, pb.ApplicationEntry, pb.ConfigChangeEntry, pb.EncodedEntry, pb.MetadataEntry, 4}[g.r.IntN(7)]
		if g.r.IntN(2) == 0 {
			e.Key = g.r.Uint64()
		}
		if g.r.IntN(10) >= 4 {
			e.ClientID = g.r.Uint64()
		}
		e.SeriesID = []uint64{0, 0, 1, 1 + g.r.Uint64N(100), math.MaxUint64 - 1, math.MaxUint64, g.r.Uint64()}[g.r.IntN(7)]
		if g.r.IntN(3) == 0 {
			e.RespondedTo = g.value(0)
		}
		var cmd string
		e.Cmd, cmd = g.cmd(m.ShardID, e.Type, n > 8)
		if n <= 8 {
			var w string
			if !contiguous {
				w = fmt.Sprintf("i%d t%d ", e.Index, e.Term)
			}
			what = append(what, fmt.Sprintf("%stype %d client %d series %d responded %d: %s", w, e.Type, e.ClientID, e.SeriesID, e.RespondedTo, cmd))
		}
	}
	return es, what
}

// cmd is an entry's payload: empty, random bytes, or what the shard's
// state machine (or dragonboat, for a config change) reads. short keeps
// it small, for messages of many entries.
func (g *raftGen) cmd(shard uint64, typ pb.EntryType, short bool) ([]byte, string) {
	x := g.r.IntN(100)
	switch {
	case x < 20:
		return nil, "empty"
	case x < 65:
		switch {
		case typ == pb.ConfigChangeEntry && g.r.IntN(2) == 0:
			return g.configChange(shard)
		case shard == layout.MetaShard:
			if b, what, ok := g.layoutCmd(); ok {
				return b, what
			}
		default:
			cmds := g.lockCommands(shard)
			format := g.v.format
			if lockfsm.MinCommandFormat(cmds) == lockfsm.FormatTagged {
				format = lockfsm.FormatTagged
			}
			if b, err := lockfsm.EncodeCommandsFormat(format, cmds); err == nil {
				return b, describeCommands(cmds)
			}
		}
	}
	n := 1 + g.r.IntN(64)
	if !short && g.r.IntN(20) == 0 {
		n = 1 + g.r.IntN(16<<10)
	}
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(g.r.Uint32())
	}
	return b, fmt.Sprintf("%d random bytes %x...", n, b[:min(n, 8)])
}

func (g *raftGen) configChange(shard uint64) ([]byte, string) {
	cc := pb.ConfigChange{
		ConfigChangeId: g.value(g.v.commit[shard]),
		Type:           pb.ConfigChangeType(g.r.IntN(5)),
		ReplicaID:      []uint64{g.anyReplica(), g.value(g.v.layout.NextReplicaID), 0}[g.r.IntN(3)],
		Address:        []string{"", "127.0.0.1:1", g.v.addrs[g.r.IntN(len(g.v.addrs))]}[g.r.IntN(3)],
		Initialize:     g.r.IntN(2) == 0,
	}
	b, err := cc.Marshal()
	if err != nil {
		return nil, "empty (config change did not marshal: " + err.Error() + ")"
	}
	return b, fmt.Sprintf("config change %s(%d) replica %d %q init %v id %d", cc.Type, int32(cc.Type), cc.ReplicaID, cc.Address, cc.Initialize, cc.ConfigChangeId)
}

// layoutCmd is a meta shard entry: the current layout's successor, as
// is or with a peer dropped or a replica moved.
func (g *raftGen) layoutCmd() ([]byte, string, bool) {
	p := g.v.layout.Next()
	what := "the next layout"
	switch g.r.IntN(3) {
	case 1:
		if len(p.Peers) > 1 {
			p.Peers = p.Peers[:len(p.Peers)-1]
			what = "the next layout without " + g.v.layout.Peers[len(p.Peers)].Name
		}
	case 2:
		shard := g.realShard()
		if rs := slices.Clone(p.Replicas[shard]); len(rs) > 1 {
			rs[0].Peer = "mallory"
			p.Replicas[shard] = rs
			what = fmt.Sprintf("the next layout with shard %d's replica %d on mallory", shard, rs[0].ID)
		}
	}
	if g.r.IntN(4) == 0 {
		p.Epoch = g.value(p.Epoch)
	}
	b, err := layout.Encode(p)
	if err != nil {
		return nil, "", false
	}
	return b, fmt.Sprintf("%s, epoch %d", what, p.Epoch), true
}

// lockCommands is a batch of lockmesh commands: any op, leader-only ones
// included, mostly on the shard's real sessions. Acquires name keys of
// their own, not the probe's: whether an attacker may hold a key is the
// RPC suites' question; this test asks whether the shards keep serving.
func (g *raftGen) lockCommands(shard uint64) []lockfsm.Command {
	sessions := g.v.sessions[shard]
	cmds := make([]lockfsm.Command, 1+g.r.IntN(3))
	for i := range cmds {
		c := &cmds[i]
		c.Op = lockfsm.Op(1 + g.r.IntN(int(lockfsm.OpExpireHold)))
		if len(sessions) > 0 && g.r.IntN(10) < 7 {
			c.Session = sessions[g.r.IntN(len(sessions))]
		} else {
			c.Session = max(1, g.value(0))
		}
		c.Req = 1 + g.r.Uint64N(64)
		term := g.v.term[shard]
		switch c.Op {
		case lockfsm.OpOpenSession:
			c.Session = 0
			c.Owner = []string{"peer-1", "peer-2", "peer-3", "mallory"}[g.r.IntN(4)]
			c.TTLMillis = max(1, g.value(1000))
		case lockfsm.OpAcquire:
			c.Key = fmt.Sprintf("raftfuzz/forged-%d", g.r.IntN(8))
			c.Wait = g.r.IntN(2) == 0
			c.Limit = uint32(g.r.IntN(3))
			if g.r.IntN(4) == 0 {
				c.MaxHoldMillis = max(1, g.value(1000))
			}
		case lockfsm.OpRelease, lockfsm.OpCancel:
			c.Target = 1 + g.r.Uint64N(64)
			for _, h := range g.held {
				if h.shard == shard && g.r.IntN(2) == 0 {
					c.Session, c.Target = h.session, h.req
				}
			}
		case lockfsm.OpExpireHold:
			c.Target = 1 + g.r.Uint64N(64)
			c.Term = max(1, g.value(term))
		case lockfsm.OpExpireSession, lockfsm.OpLeaderTerm:
			c.Term = max(1, g.value(term))
		}
	}
	return cmds
}

func describeCommands(cmds []lockfsm.Command) string {
	var parts []string
	for _, c := range cmds {
		parts = append(parts, fmt.Sprintf("%s{session %d req %d target %d key %q owner %q ttl %d term %d}", c.Op, c.Session, c.Req, c.Target, c.Key, c.Owner, c.TTLMillis, c.Term))
	}
	return "lockmesh commands " + strings.Join(parts, " ")
}

// snapshot is an InstallSnapshot's snapshot: indexes, terms and
// membership mixing real and forged, and files that are not there.
func (g *raftGen) snapshot(shard uint64) pb.Snapshot {
	ss := pb.Snapshot{
		Index:    g.value(g.v.last[shard]),
		Term:     g.value(g.v.term[shard]),
		ShardID:  []uint64{shard, shard, 0, g.realShard()}[g.r.IntN(4)],
		Filepath: []string{"", "/nonexistent/snapshot", "../../../etc/passwd"}[g.r.IntN(3)],
		FileSize: g.value(1024),
		Dummy:    g.r.IntN(2) == 0,
		Type:     pb.StateMachineType(g.r.IntN(5)),
		Witness:  g.r.IntN(4) == 0,
		Membership: pb.Membership{
			ConfigChangeId: g.value(g.v.commit[shard]),
			Addresses:      map[uint64]string{},
		},
	}
	for _, r := range g.v.layout.Replicas[shard] {
		if g.r.IntN(4) > 0 {
			ss.Membership.Addresses[r.ID] = g.v.addrs[g.r.IntN(len(g.v.addrs))]
		}
	}
	if g.r.IntN(2) == 0 {
		ss.Membership.Addresses[g.value(g.v.layout.NextReplicaID)] = "127.0.0.1:1"
	}
	return ss
}
