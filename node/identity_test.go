package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/lni/vfs"

	"github.com/lockmesh/lockmesh/internal/layout"
)

func TestCheckIdentity(t *testing.T) {
	p := layout.New(7, 2, 3, layout.KeySchemeHashTag, []layout.Peer{{Name: "a", NodeHostID: "id-a"}, {Name: "b", NodeHostID: "id-b"}, {Name: "c", NodeHostID: "id-c"}})
	for _, tc := range []struct {
		name, hostID string
		refused      bool
	}{
		{"a", "id-a", false},    // the listed identity
		{"d", "id-d", false},    // a name the layout does not list: a new peer
		{"d", "id-a", false},    // the name decides, not the id
		{"b", "id-wiped", true}, // a listed name with a new data dir
		{"a", "id-b", true},     // a listed name with another listed peer's data dir
		{"c", "", true},         // a listed name not gossiping its NodeHostID yet
		{"a", "ID-A", true},     // ids compare exactly
	} {
		ie := p.CheckIdentity(tc.name, tc.hostID)
		if (ie != nil) != tc.refused {
			t.Errorf("CheckIdentity(%q, %q) = %v, want refused %v", tc.name, tc.hostID, ie, tc.refused)
		}
		if ie == nil {
			continue
		}
		pe, _ := p.Peer(tc.name)
		msg := ie.Error()
		for _, want := range []string{"peer " + tc.name + " ", pe.NodeHostID, "this data dir has " + tc.hostID, "wiped or replaced", "DeadAfter", "new Name"} {
			if !strings.Contains(msg, want) {
				t.Errorf("CheckIdentity(%q, %q): %q does not say %q", tc.name, tc.hostID, msg, want)
			}
		}
	}
	// Wrapped as lock calls wrap it, it is still found.
	err := fmt.Errorf("%w: %w", ErrUnavailable, p.CheckIdentity("b", "id-wiped"))
	var ie *layout.IdentityError
	if !errors.As(err, &ie) || ie.Listed != "id-b" || ie.Local != "id-wiped" || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("wrapped identity error lost its parts: %v", err)
	}
}

// runningIDs copies the replica ids n runs, by shard.
func runningIDs(n *Node) map[uint64]uint64 { return n.peer.Replicas().Running() }

// oldReplicaRuns names a replica id from old that n runs, if any.
func oldReplicaRuns(n *Node, old map[uint64]bool) string {
	for shard, id := range runningIDs(n) {
		if old[id] {
			return fmt.Sprintf("replica %d of shard %d", id, shard)
		}
	}
	return ""
}

// wipe crashes p and starts it again under the same name and addresses on
// an empty disk, as after a replaced disk or a lost volume, without
// waiting for it to be ready.
func (fc *faultCluster) wipe(p *faultPeer) {
	fc.t.Helper()
	fc.kill(p)
	fc.replaceDisk(p) // later kills and stalls of p act on the new disk
	fc.start(p)
	p.gate.open()
}

// identityReason is a phrase of the error a wiped peer's lock calls return
// while the layout lists its name under its old NodeHostID.
const identityReason = "the data dir was wiped or replaced"

// A peer whose data dir was wiped comes back under its old name with a new
// NodeHostID. It must never run the replica ids of its old identity: with
// empty logs they would vote with a member that missed the last commits
// and form a quorum that has lost them. It waits, saying why, until the
// cluster has replaced its old identity (DeadAfter), then joins as a new
// peer with new replica ids.
//
// Peers: A and C carry the commits, B is stopped while the key is handed
// over, D is a client-only peer that holds the key throughout. Then C is
// wiped and A crashes, and B returns: B and the wiped C are the only
// replicas up, and only A's disk has the grants.
func TestWipedPeerRejoinsAsNewPeer(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for a wiped peer to be replaced")
	}
	// Nobody is replaced while B is down; DeadAfter is short for the
	// restarted peers, so the wiped C is replaced quickly. The TTL outlasts
	// the test: a holder that disappears can only be a lost commit.
	o := clusterOpts{peers: 3, expect: 3, shards: 4, rf: 3, ttl: 2 * time.Minute, deadAfter: time.Hour}
	var peers []*testPeer
	var gossip []string
	for i := range 4 {
		cfg := testConfig(t, fmt.Sprintf("peer-%d", i+1), o)
		cfg.GossipAddr = freeAddr(t)
		gossip = append(gossip, cfg.GossipAddr)
		peers = append(peers, &testPeer{cfg: cfg})
	}
	t.Cleanup(func() {
		for _, p := range peers {
			p.stop()
		}
	})
	for i, p := range peers {
		p.cfg.Join = append(append([]string(nil), gossip[:i]...), gossip[i+1:]...)
	}
	a, b, c, d := peers[0], peers[1], peers[2], peers[3]
	d.cfg.BootstrapExpect, d.cfg.NoReplicas = 0, true
	for _, p := range peers {
		p.start(t)
	}
	for _, p := range peers {
		p.waitReady(t)
	}
	ctx := ctxT(t, 4*time.Minute)
	const key = "invoice/42"

	if err := b.node.Close(); err != nil {
		t.Fatal(err)
	}
	var last uint64
	for i, p := range []*testPeer{a, c, d, a, c} {
		l, err := p.node.Lock(ctx, key)
		if err != nil {
			t.Fatalf("handover %d on %s: %v", i, p.cfg.Name, err)
		}
		if l.Token() <= last {
			t.Fatalf("token %d after %d", l.Token(), last)
		}
		last = l.Token()
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	held, err := d.node.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if held.Token() <= last {
		t.Fatalf("token %d after %d", held.Token(), last)
	}
	pl, err := a.node.readMetaPlacement(ctx)
	if err != nil {
		t.Fatal(err)
	}
	old := map[uint64]bool{}
	for _, id := range runningIDs(c.node) {
		old[id] = true
	}
	oldHostID, firstNewID := c.node.peer.NodeHost().ID(), pl.NextReplicaID
	t.Logf("%s holds %s with token %d; %s runs replicas %v as NodeHostID %s", d.cfg.Name, key, held.Token(), c.cfg.Name, runningIDs(c.node), oldHostID)

	// C is wiped and A crashes; B comes back.
	c.node.peer.Kill()
	a.node.peer.Kill()
	for _, p := range []*testPeer{a, b, c} {
		p.cfg.DeadAfter = 2 * time.Second
	}
	c.cfg.fs = vfs.NewMem()
	logs := newLogRecorder()
	c.cfg.Logger = slog.New(logs)
	b.start(t)
	c.start(t)
	if c.node.peer.NodeHost().ID() == oldHostID {
		t.Fatalf("the wiped peer kept NodeHostID %s", oldHostID)
	}
	checkOld := func(when string) {
		t.Helper()
		if r := oldReplicaRuns(c.node, old); r != "" {
			t.Fatalf("%s: the wiped peer %s runs %s of its old identity", when, c.cfg.Name, r)
		}
	}

	// Only B and the wiped C are up. Nothing may read the key as free or
	// grant it while D holds it, and C must say why it does not serve.
	var refused error
	observed := time.Now()
	for deadline := observed.Add(30 * time.Second); refused == nil || time.Since(observed) < 2*time.Second; {
		checkOld("while A was down")
		for _, p := range []*testPeer{b, c, d} {
			rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			info, err := p.node.Inspect(rctx, key)
			cancel()
			if err == nil && (len(info.Holders) != 1 || info.Holders[0].Token != held.Token()) {
				t.Fatalf("%s reads %s as %+v while token %d is held: a quorum lost committed grants", p.cfg.Name, key, info, held.Token())
			}
			if p == c && err != nil && strings.Contains(err.Error(), identityReason) {
				refused = err
			}
		}
		for _, p := range []*testPeer{b, c} {
			rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			l, err := p.node.TryLock(rctx, key)
			cancel()
			if err == nil {
				t.Fatalf("%s granted %s with token %d while token %d is held", p.cfg.Name, key, l.Token(), held.Token())
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the wiped peer never said why it does not serve within 30s")
		}
	}
	t.Logf("the wiped peer refused: %v", refused)

	// A returns: A and B have a quorum and every commit.
	a.start(t)
	a.waitReady(t)
	info, err := a.node.Inspect(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(info.Holders) != 1 || info.Holders[0].Token != held.Token() {
		t.Fatalf("with A back %s reads %s as %+v, want the holder with token %d", a.cfg.Name, key, info, held.Token())
	}

	// The cluster replaces C's old identity after DeadAfter and admits the
	// wiped C as a new peer; the controller then gives it new replicas.
	var newIDs map[uint64]uint64
	for deadline := time.Now().Add(2 * time.Minute); ; {
		checkOld("before the wiped peer was readmitted")
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		p, err := a.node.readMetaPlacement(rctx)
		cancel()
		newIDs = runningIDs(c.node)
		if err == nil && len(newIDs) > 0 && hostsAny(p, c.cfg.Name) {
			if pe, _ := p.Peer(c.cfg.Name); pe.NodeHostID != c.node.peer.NodeHost().ID() {
				t.Fatalf("the layout lists %s with NodeHostID %s; it runs as %s", c.cfg.Name, pe.NodeHostID, c.node.peer.NodeHost().ID())
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the wiped peer was not readmitted with replicas within 2 minutes (ready: %v, runs %v)", isReady(c.node), newIDs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for shard, id := range newIDs {
		if id < firstNewID {
			t.Fatalf("the readmitted peer runs replica %d of shard %d, an id given out before the wipe (the first new id is %d)", id, shard, firstNewID)
		}
	}
	for id := range old {
		for _, shard := range pl.ShardIDs() {
			if c.node.peer.NodeHost().HasNodeInfo(shard, id) {
				t.Fatalf("the wiped peer has Raft data for replica %d of shard %d of its old identity", id, shard)
			}
		}
	}
	t.Logf("the wiped peer was readmitted with replicas %v", newIDs)
	if n := logs.count(slog.LevelError, "refusing the cluster layout"); n != 1 {
		t.Fatalf("the wiped peer logged its refusal %d times, want once", n)
	}

	// The key's state and its tokens are intact, seen from the new peer.
	info, err = c.node.Inspect(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(info.Holders) != 1 || info.Holders[0].Token != held.Token() {
		t.Fatalf("after readmission %s reads %s as %+v, want the holder with token %d", c.cfg.Name, key, info, held.Token())
	}
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	next, err := c.node.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if next.Token() <= held.Token() {
		t.Fatalf("token %d granted after token %d", next.Token(), held.Token())
	}
	if err := next.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// count is the number of records at level whose message is msg.
func (r logRecorder) count(level slog.Level, msg string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := 0
	for _, rec := range *r.records {
		if rec.Level == level && rec.Message == msg {
			c++
		}
	}
	return c
}

func isReady(n *Node) bool {
	select {
	case <-n.Ready():
		return true
	default:
		return false
	}
}

// injectWipeRestart is the wipe-restart nemesis, in the shape of the
// entries of nemeses: it crashes the peer leading the most shards and
// starts it again under the same name and addresses on an empty disk (a
// replaced disk, a lost volume). The peer must never run a replica id of
// its old identity, and must be admitted again as a new peer and host
// replicas within DeadAfter plus membershipWithin. Use it on a cluster with
// a short DeadAfter: with the default 30s a round takes most of a minute.
func injectWipeRestart(ctx context.Context, lr *loadRun) {
	fc := lr.fc
	victim := fc.mostLeading()
	old := map[uint64]bool{}
	for _, id := range runningIDs(victim.node()) {
		old[id] = true
	}
	within := victim.cfg.DeadAfter + membershipWithin
	if victim.cfg.DeadAfter == 0 {
		within += 30 * time.Second
	}
	start := time.Now()
	fc.wipe(victim)
	n := victim.node()
	for {
		if r := oldReplicaRuns(n, old); r != "" {
			lr.violate("wipe-restart: %s runs %s of its identity before the wipe", victim.name, r)
			return
		}
		if ids := runningIDs(n); isReady(n) && len(ids) > 0 {
			fc.t.Logf("wipe-restart: %s readmitted with replicas %v %.1fs after its restart", victim.name, ids, time.Since(start).Seconds())
			return
		}
		if time.Since(start) > within || ctx.Err() != nil {
			lr.violate("wipe-restart: %s not readmitted with replicas within %v of its restart (ready: %v)", victim.name, within, isReady(n))
			return
		}
		sleepCtx(ctx, 20*time.Millisecond)
	}
}

func TestNemesisWipeRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("nemesis suite skipped in -short mode")
	}
	nm := nemesis{name: "wipe-restart", inject: injectWipeRestart}
	r := runNemesis(t, nm, 0, faultOpts{mutate: func(c *Config) { c.DeadAfter = 3 * time.Second }})
	reportViolations(t, r)
	if r.ops < 100 {
		t.Errorf("only %d ops checked: the load did not run", r.ops)
	}
}
