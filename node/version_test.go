package node

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/lni/dragonboat/v4"
	sm "github.com/lni/dragonboat/v4/statemachine"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/level"
	"github.com/lockmesh/lockmesh/internal/peer"
	"github.com/lockmesh/lockmesh/internal/replica"
	"github.com/lockmesh/lockmesh/internal/router"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// unreadable is a tagged Acquire with field tag 48, which no release knows.
var unreadable = []byte{lockfsm.FormatTagged, 0x91, 0x82, 0x01, byte(lockfsm.OpAcquire), 48, 0x01}

// In a cluster, an entry no replica can read halts the shard on every
// peer: no lock of that shard is granted from a state that skipped it,
// other shards go on, and a restarted peer halts again at the same index.
func TestReplicaStopsOnEntryItCannotDecode(t *testing.T) {
	peers := startCluster(t, clusterOpts{peers: 3, shards: 2, rf: 3})
	p1 := peers[0].node
	keyOf := func(shard uint64) string {
		for i := 0; ; i++ {
			if k := fmt.Sprintf("key-%d", i); p1.peer.Placement().ShardOf(k) == shard {
				return k
			}
		}
	}
	bad, good := layout.FirstLockShard, layout.FirstLockShard+1
	l, err := p1.Lock(ctxT(t, 10*time.Second), keyOf(bad))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(ctxT(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}

	// The controller may be moving the shard's leadership meanwhile, and
	// a leader that is handing over drops proposals: the try then times
	// out with nothing committed. Like the router, propose again while the
	// outcome is unknown, until this replica answers halted or is halted
	// (a try that committed but whose answer was lost).
	// It is proposed on the leader's peer: a Propose a follower forwards
	// over the Raft port is refused there (internal/raftauth), as it
	// carries what no replica could apply.
	deadline := time.Now().Add(20 * time.Second)
	for {
		r, err := proposeOnLeader(t, peers, bad, unreadable)
		if err == nil && r.Value == replica.ResultHalted || p1.peer.HaltedShard(bad) != nil {
			break
		}
		if err == nil || !router.Retryable(err) || time.Now().After(deadline) {
			t.Fatalf("proposing an unreadable entry: %+v %v", r, err)
		}
		t.Logf("proposal of the unreadable entry not committed (%v); proposing it again", err)
	}
	var index uint64
	for _, p := range peers {
		he := waitHalted(t, p.node, bad)
		if index == 0 {
			index = he.Index
		}
		if he.Index != index || he.Version != lockfsm.FormatTagged || !errors.Is(he, lockfsm.ErrUnsupported) {
			t.Fatalf("%s halted with %v, want index %d", p.cfg.Name, he, index)
		}
	}

	if _, err := p1.TryLock(ctxT(t, 2*time.Second), keyOf(bad)); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("TryLock on the halted shard: %v, want ErrUnavailable", err)
	}
	if l, err := peers[1].node.Lock(ctxT(t, 10*time.Second), keyOf(good)); err != nil {
		t.Fatalf("Lock on a healthy shard: %v", err)
	} else {
		_ = l.Unlock(ctxT(t, 10*time.Second))
	}

	// The same release restarted cannot read the entry either: it halts at
	// the same index instead of skipping it.
	p1.Close()
	peers[0].start(t)
	peers[0].waitReady(t)
	if he := waitHalted(t, peers[0].node, bad); he.Index != index {
		t.Fatalf("after restart halted at %d, want %d", he.Index, index)
	}
}

func waitHalted(t *testing.T, n *Node, shard uint64) *HaltError {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if he := n.peer.HaltedShard(shard); he != nil && !n.peer.HostsShard(shard) {
			return he
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s: replica of shard %d did not halt", n.cfg.Name, shard)
	return nil
}

// replicaDigests reads the canonical snapshot of each running replica of
// shard, by peer name.
func replicaDigests(t *testing.T, peers []*testPeer, shard uint64) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, p := range peers {
		if !p.node.peer.HostsShard(shard) {
			continue
		}
		v, err := p.node.peer.NodeHost().StaleRead(shard, replica.StateReader(func(s *lockfsm.State) any {
			var b bytes.Buffer
			_ = s.Save(&b)
			return b.String()
		}))
		if err != nil {
			continue
		}
		out[p.cfg.Name] = v.(string)
	}
	return out
}

// waitConverged waits until every peer runs a replica of shard and all of
// them hold the same state: replicas that diverged never converge.
func waitConverged(t *testing.T, peers []*testPeer, shard uint64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		d := replicaDigests(t, peers, shard)
		same := len(d) == len(peers)
		for _, v := range d {
			same = same && v == d[peers[0].cfg.Name]
		}
		if same {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("replicas of shard %d did not converge: %d of %d readable", shard, len(d), len(peers))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A rolling upgrade, with one peer held at feature level 1 (playing the
// older release). The cluster forms at level 1, hashes whole keys and
// writes only format-2 entries, so the old peer never halts; an entry of
// the newer format that reaches it anyway stops its replica instead of
// being skipped, while the others go on. Once the peer is upgraded, its
// replica replays that entry, the controller raises the level to 2, and
// every replica of every shard holds the same state. A Session's locks
// show its ID in Inspect once the level is raised, and 0 before.
func TestRollingUpgradeFromLevel1(t *testing.T) {
	peers := startMixedCluster(t, clusterOpts{expect: 3, shards: 2, rf: 3}, "peer", 1)
	old := peers[2]
	for _, p := range peers {
		pl := p.node.peer.Placement()
		if layout.LevelOf(pl) != 1 || pl.KeyScheme != layout.KeySchemeWhole {
			t.Fatalf("%s: cluster formed at level %d with key scheme %d; want 1 and whole keys (peer-3 speaks only 1)", p.cfg.Name, layout.LevelOf(pl), pl.KeyScheme)
		}
	}

	// Traffic from every peer, across the controller's rounds: nothing
	// the old peer cannot read is written, and the level stays 1.
	for round := range 5 {
		for _, p := range peers {
			l, err := p.node.Lock(ctxT(t, 10*time.Second), fmt.Sprintf("{order-%d}/items", round))
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Unlock(ctxT(t, 10*time.Second)); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(peers[0].node.peer.ControlInterval())
	}
	for shard := layout.FirstLockShard; shard < layout.FirstLockShard+2; shard++ {
		if he := old.node.peer.HaltedShard(shard); he != nil {
			t.Fatalf("the level-1 peer halted at level 1: %v", he)
		}
	}
	if lv := layout.LevelOf(peers[0].node.peer.Placement()); lv != 1 {
		t.Fatalf("level raised to %d while a peer speaks only 1", lv)
	}

	// Below level 3 sessions go unlabelled: Inspect shows no Session id.
	if ids := sessionIDsShown(t, peers[0].node); ids[0] != 0 || ids[1] != 0 {
		t.Fatalf("Inspect shows Session ids %v at level 1; the old peer would halt on a label", ids)
	}

	// A format-3 entry forced into a shard: the old replica stops there.
	shard := layout.FirstLockShard
	forced, err := lockfsm.EncodeCommandsFormat(lockfsm.FormatTagged, []lockfsm.Command{{Op: lockfsm.OpOpenSession, Owner: "forced", TTLMillis: 60_000}})
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; {
		_, err := proposeOnLeader(t, peers, shard, forced)
		if err == nil {
			break
		}
		if !router.Retryable(err) || time.Now().After(deadline) {
			t.Fatal(err)
		}
	}
	he := waitHalted(t, old.node, shard)
	if !errors.Is(he, lockfsm.ErrVersion) || he.Version != lockfsm.FormatTagged {
		t.Fatalf("old replica halted with %v", he)
	}
	for _, p := range peers[:2] {
		if he := p.node.peer.HaltedShard(shard); he != nil {
			t.Fatalf("%s halted too: %v", p.cfg.Name, he)
		}
	}
	// The old peer still locks keys of that shard, through the others.
	for i := 0; ; i++ {
		key := fmt.Sprintf("k-%d", i)
		if old.node.peer.Placement().ShardOf(key) != shard {
			continue
		}
		l, err := old.node.Lock(ctxT(t, 10*time.Second), key)
		if err != nil {
			t.Fatalf("Lock on the halted shard from the old peer: %v", err)
		}
		_ = l.Unlock(ctxT(t, 10*time.Second))
		break
	}

	// Upgrade: the same data dir, the new release.
	old.node.Close()
	old.hooks.HoldLevel = 0
	old.start(t)
	old.waitReady(t)
	deadline := time.Now().Add(30 * time.Second)
	for {
		raised := true
		for _, p := range peers {
			raised = raised && layout.LevelOf(p.node.peer.Placement()) == level.Max
		}
		if raised {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the level was not raised to %d after the upgrade", level.Max)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if ks := peers[0].node.peer.Placement().KeyScheme; ks != layout.KeySchemeWhole {
		t.Fatalf("the key scheme changed to %d with the level: keys would move between shards", ks)
	}
	for _, p := range peers {
		l, err := p.node.Lock(ctxT(t, 10*time.Second), "after-upgrade")
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Unlock(ctxT(t, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	ids := sessionIDsShown(t, old.node)
	if ids[0] == 0 || ids[0] != ids[1] {
		t.Fatalf("after the raise, Inspect shows Session ids %v for one Session's locks on two shards; want its ID on both", ids)
	}
	for s := layout.FirstLockShard; s < layout.FirstLockShard+2; s++ {
		for _, p := range peers {
			if he := p.node.peer.HaltedShard(s); he != nil {
				t.Fatalf("%s halted after the upgrade: %v", p.cfg.Name, he)
			}
		}
		waitConverged(t, peers, s)
	}
}

// sessionIDsShown locks a key on each of two shards with one new Session
// of n, and returns the Session id Inspect shows for each lock, after
// checking it is the one of the Session's ID or 0.
func sessionIDsShown(t *testing.T, n *Node) [2]uint64 {
	t.Helper()
	ctx := ctxT(t, 20*time.Second)
	s, err := n.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	p := n.peer.Placement()
	var ids [2]uint64
	for i, shard := range []uint64{layout.FirstLockShard, layout.FirstLockShard + 1} {
		key := keyOnShard(p, shard, "sid")
		if _, err := s.Lock(ctx, key); err != nil {
			t.Fatal(err)
		}
		info, err := n.Inspect(ctx, key)
		if err != nil || len(info.Holders) != 1 {
			t.Fatalf("Inspect(%q): %+v, %v", key, info, err)
		}
		h := info.Holders[0]
		if h.Session != 0 && h.Session != s.ID() {
			t.Fatalf("Inspect(%q) shows Session %d; the holder's ID is %d", key, h.Session, s.ID())
		}
		if h.ShardSession == 0 || h.Peer != n.Name() {
			t.Fatalf("Inspect(%q) holder %+v: no shard session or the wrong peer", key, h)
		}
		ids[i] = h.Session
	}
	return ids
}

// keyOnShard returns the first key prefix-N that layout p places on shard.
func keyOnShard(p *layout.Placement, shard uint64, prefix string) string {
	for i := 0; ; i++ {
		if key := fmt.Sprintf("%s-%d", prefix, i); p.ShardOf(key) == shard {
			return key
		}
	}
}

// startMixedCluster forms a cluster of o.expect peers named prefix-1 and
// on, the last held to feature level hold as a peer of an older release,
// each with hooks applied, and waits until every one is ready.
func startMixedCluster(t *testing.T, o clusterOpts, prefix string, hold level.Level, hooks ...func(*peer.Hooks)) []*testPeer {
	t.Helper()
	var peers []*testPeer
	for i := range o.expect {
		p := &testPeer{cfg: testConfig(t, fmt.Sprintf("%s-%d", prefix, i+1), o)}
		for _, h := range hooks {
			h(&p.hooks)
		}
		peers = append(peers, p)
	}
	peers[len(peers)-1].hooks.HoldLevel = hold
	t.Cleanup(func() {
		for _, p := range peers {
			p.stop()
		}
	})
	for i, p := range peers {
		if i > 0 {
			p.cfg.Join = []string{peers[0].node.GossipAddr()}
		}
		p.start(t)
	}
	for _, p := range peers {
		p.waitReady(t)
	}
	return peers
}

// proposeOnLeader proposes data on shard through the replica of the peer
// that leads it, as its own proposal: forced entries a follower would
// forward over the Raft port are refused there, since the filter
// (internal/raftauth) lets through only what every member applies. With
// no leader known, it answers dragonboat's ErrShardNotReady.
func proposeOnLeader(t *testing.T, peers []*testPeer, shard uint64, data []byte) (sm.Result, error) {
	t.Helper()
	for _, p := range peers {
		if p.node.leadsShard(shard) {
			return p.node.peer.NodeHost().SyncPropose(ctxT(t, 3*time.Second), p.node.peer.NodeHost().GetNoOPSession(shard), data)
		}
	}
	return sm.Result{}, dragonboat.ErrShardNotReady
}
