package node

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/internal/authz"
	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/level"
	"github.com/lockmesh/lockmesh/internal/lockerr"
	"github.com/lockmesh/lockmesh/internal/membership"
	"github.com/lockmesh/lockmesh/internal/peer"
	"github.com/lockmesh/lockmesh/internal/replica"
	"github.com/lockmesh/lockmesh/internal/router"
	"github.com/lockmesh/lockmesh/lockfsm"
	"github.com/lockmesh/lockmesh/mesh"
	"github.com/lockmesh/lockmesh/transport"
	"github.com/lockmesh/lockmesh/transport/transporttest"
)

// The hostile-peer suite: attackers of each strength call a peer's RPC
// port directly, with crafted requests, and every attack of the security
// review that needs no more than the port is tried. Each must be refused
// where it is accepted, the victim must keep its lock (Done open, token
// unchanged), and the cluster must go on granting. The Raft and gossip
// ports have suites of their own (internal/raftnet, mesh).
//
// Attackers:
//   - a stranger: a certificate of the cluster's CA for a name that is no
//     member (TLS cluster);
//   - a compromised member: peer-2's own certificate, acting on peer-1's
//     sessions (TLS cluster); what it can still do is docs/SECURITY.md's
//     documented limit;
//   - a local process on a plaintext loopback cluster: anonymous, so only
//     the rules that need no identity protect against it.

// attacker calls peers' RPC ports as one caller.
type attacker struct {
	t    testing.TB
	name string
	c    *transport.Client
}

func newAttacker(t testing.TB, name string, cfg *tls.Config) *attacker {
	c, err := transport.NewClient(transport.Config{TLS: cfg, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &attacker{t: t, name: name, c: c}
}

func (a *attacker) call(p *testPeer, method uint8, body []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return a.c.Call(ctx, p.node.peer.RPCAddr(), method, body)
}

// propose forwards cmds to p as a proposal on shard, the way a peer
// without a replica does, and returns the transport's answer.
func (a *attacker) propose(p *testPeer, shard uint64, cmds ...lockfsm.Command) error {
	a.t.Helper()
	raw, err := lockfsm.EncodeCommandsFormat(p.node.peer.ClusterLevel().CommandFormat(), cmds)
	if err != nil {
		a.t.Fatal(err)
	}
	body, err := peer.EncodeBody(router.ProposeRequest{Shard: shard, Cmds: raw, Level: p.node.peer.TopLevel()})
	if err != nil {
		a.t.Fatal(err)
	}
	_, err = a.call(p, peer.MethodPropose, body)
	return err
}

// recordedTerm is the leader term p's replica of shard has recorded: an
// ExpireSession carrying it is one the state machine would apply.
func recordedTerm(t testing.TB, p *testPeer, shard uint64) uint64 {
	t.Helper()
	// One try of a read is bounded by the proposal timeout, and a replica
	// just started may not serve a ReadIndex yet: try again until the
	// context ends (a try that times out returns at its own bound).
	ctx := ctxT(t, 20*time.Second)
	for {
		a, err := p.node.peer.ReadLocal(ctx, shard, replica.Query{Kind: replica.QuerySessions})
		if err == nil {
			return a.Term
		}
		if ctx.Err() != nil {
			t.Fatalf("%s: read shard %d: %v", p.cfg.Name, shard, err)
		}
		time.Sleep(10 * time.Millisecond) // a refusal (not ready) returns at once
	}
}

// refused fails the test unless err is an authorization refusal.
func refused(t testing.TB, what string, err error) {
	t.Helper()
	if lockerr.Code(err) != lockerr.CodeForbidden {
		t.Errorf("%s: %v, want it refused as forbidden", what, err)
	}
}

// victimScene is a lock held by peer-1 with a waiter on peer-3, the state
// a forged release or expiry would turn into two holders.
type victimScene struct {
	peers  []*testPeer
	key    string
	shard  uint64
	lock   *Lock
	holder lockfsm.Holder
	waiter chan *Lock // gets the waiter's lock when it is granted
}

func newVictimScene(t *testing.T, peers []*testPeer, key string) *victimScene {
	s := &victimScene{peers: peers, key: key, waiter: make(chan *Lock, 1)}
	s.shard = peers[0].node.peer.Placement().ShardOf(key)
	var err error
	if s.lock, err = peers[0].node.Lock(ctxT(t, 10*time.Second), key); err != nil {
		t.Fatal(err)
	}
	info, err := peers[0].node.Inspect(ctxT(t, 5*time.Second), key)
	if err != nil || len(info.Holders) != 1 {
		t.Fatalf("inspect %q: %+v, %v", key, info, err)
	}
	h := info.Holders[0]
	s.holder = lockfsm.Holder{Session: h.ShardSession, Req: h.Request, Token: h.Token, Owner: h.Peer}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() {
		if l, err := peers[2].node.Lock(ctx, key); err == nil {
			s.waiter <- l
		}
	}()
	return s
}

// hosts lists the peers that host the scene's shard.
func (s *victimScene) hosts() []*testPeer {
	var out []*testPeer
	for _, p := range s.peers {
		if p.node.peer.HostsShard(s.shard) {
			out = append(out, p)
		}
	}
	return out
}

// violation describes what the attacks did to the victim, or "".
func (s *victimScene) violation(t *testing.T) string {
	select {
	case l := <-s.waiter:
		select {
		case <-s.lock.Done():
			return fmt.Sprintf("the waiter was granted token %d and the victim's lock ended (%v) without its holder letting go", l.Token(), s.lock.Err())
		default:
			return fmt.Sprintf("two holders: the waiter was granted token %d while the victim's Done is open (token %d)", l.Token(), s.lock.Token())
		}
	default:
	}
	select {
	case <-s.lock.Done():
		return fmt.Sprintf("the victim's lock ended: %v", s.lock.Err())
	default:
	}
	info, err := s.peers[0].node.Inspect(ctxT(t, 5*time.Second), s.key)
	if err != nil {
		return fmt.Sprintf("inspect after the attacks: %v", err)
	}
	if len(info.Holders) != 1 || info.Holders[0].Token != s.holder.Token {
		return fmt.Sprintf("holders after the attacks: %+v, want token %d alone", info.Holders, s.holder.Token)
	}
	return ""
}

// finish checks the cluster still hands the key over: the victim unlocks
// and the waiter gets a newer token.
func (s *victimScene) finish(t *testing.T) {
	if err := s.lock.Unlock(ctxT(t, 10*time.Second)); err != nil {
		t.Fatalf("victim unlock: %v", err)
	}
	select {
	case l := <-s.waiter:
		if l.Token() <= s.holder.Token {
			t.Fatalf("waiter got token %d after %d", l.Token(), s.holder.Token)
		}
		l.Release()
	case <-time.After(20 * time.Second):
		t.Fatal("waiter not granted 20 s after the victim unlocked: the cluster stopped granting")
	}
}

// sessionAttacks forges, as a, every session command against the scene's
// victim on each host, and returns the answers by attack.
func (s *victimScene) sessionAttacks(a *attacker) map[string]error {
	v := s.holder
	out := map[string]error{}
	for _, h := range s.hosts() {
		at := func(what string) string { return fmt.Sprintf("%s via %s", what, h.cfg.Name) }
		out[at("forged Release")] = a.propose(h, s.shard, lockfsm.Command{Op: lockfsm.OpRelease, Session: v.Session, Target: v.Req})
		out[at("forged Cancel")] = a.propose(h, s.shard, lockfsm.Command{Op: lockfsm.OpCancel, Session: v.Session, Target: v.Req})
		out[at("forged CloseSession")] = a.propose(h, s.shard, lockfsm.Command{Op: lockfsm.OpCloseSession, Session: v.Session})
		out[at("ExpireSession")] = a.propose(h, s.shard, lockfsm.Command{Op: lockfsm.OpExpireSession, Session: v.Session, Term: recordedTerm(a.t, h, s.shard)})
		out[at("LeaderTerm 2^62")] = a.propose(h, s.shard, lockfsm.Command{Op: lockfsm.OpLeaderTerm, Term: 1 << 62})
		out[at("OpenSession with TTL 2^50 ms")] = a.propose(h, s.shard, lockfsm.Command{Op: lockfsm.OpOpenSession, Owner: a.name, TTLMillis: 1 << 50})
		body, _ := peer.EncodeBody(router.KeepAliveRequest{Shard: s.shard, Sessions: []uint64{v.Session}})
		_, out[at("forged keepalive")] = a.call(h, peer.MethodKeepAlive, body)
	}
	return out
}

// tlsCluster starts three peers with TLS certificates of ca and a gossip
// key, which Validate requires with TLS.
func tlsCluster(t *testing.T, ca *transporttest.CA, hook func(*peer.Hooks)) []*testPeer {
	key := randomKey(t, 32)
	return startCluster(t, clusterOpts{peers: 3, rf: 3, shards: 2, ttl: 2 * time.Second,
		mutate: func(c *Config) { c.GossipKey, c.TLS = key, ca.Issue(c.Name) }, hook: hook})
}

// A stranger with a certificate of the cluster's CA, and a compromised
// member acting on another member's session, are refused every session
// command, every leader-only command and every layout and membership
// change; the victim keeps its lock and the cluster goes on granting.
func TestHostileCertificateHolders(t *testing.T) {
	ca := transporttest.NewCA(t)
	peers := tlsCluster(t, ca, nil)
	s := newVictimScene(t, peers, "hostile/cert")
	p := peers[0].node.peer.Placement()

	for _, a := range []*attacker{
		newAttacker(t, "mallory", ca.Issue("mallory")),
		newAttacker(t, "peer-2", ca.Issue("peer-2")),
	} {
		for what, err := range s.sessionAttacks(a) {
			refused(t, a.name+": "+what, err)
		}
		// The forged layout that made two peers delete every replica.
		shrunk := p.Next()
		shrunk.Peers = shrunk.Peers[:1]
		raw, err := layout.Encode(shrunk)
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range peers {
			if !h.node.peer.HostsShard(layout.MetaShard) {
				continue
			}
			if a.name == "peer-2" && p.Hosts(layout.MetaShard, "peer-2") {
				continue // a meta host may write the layout: the documented limit
			}
			_, err := a.call(h, peer.MethodSetPlacement, raw)
			refused(t, a.name+": SetPlacement of a one-peer layout via "+h.cfg.Name, err)
			body, _ := peer.EncodeBody(membership.MembershipChange{Shard: s.shard, Add: false, Replica: 1})
			if !p.Hosts(layout.MetaShard, a.name) {
				_, err = a.call(h, peer.MethodConfigChange, body)
				refused(t, a.name+": ConfigChange via "+h.cfg.Name, err)
				body, _ = peer.EncodeBody(membership.TransferRequest{Shard: s.shard, Target: 1})
				_, err = a.call(h, peer.MethodTransferLeader, body)
				refused(t, a.name+": TransferLeader via "+h.cfg.Name, err)
			}
		}
	}
	// A stranger reads nothing either.
	mallory := newAttacker(t, "mallory", ca.Issue("mallory"))
	body, _ := peer.EncodeBody(router.ReadRequest{Shard: s.shard, Query: replica.Query{Kind: replica.QueryKey, Key: s.key}, Level: peers[0].node.peer.TopLevel()})
	_, err := mallory.call(s.hosts()[0], peer.MethodRead, body)
	refused(t, "mallory: read of the victim's key", err)
	body, _ = peer.EncodeBody(router.ReadRequest{Shard: s.shard, Query: replica.Query{Kind: replica.QueryKey, Key: s.key, Ages: true}, Level: peers[0].node.peer.TopLevel()})
	_, err = mallory.call(s.hosts()[0], peer.MethodRead, body)
	refused(t, "mallory: read of the victim's key with ages", err)
	body, _ = peer.EncodeBody(router.ReadRequest{Shard: s.shard, Query: replica.Query{Kind: replica.QueryTop, K: replica.MaxTop}, Level: peers[0].node.peer.TopLevel()})
	_, err = mallory.call(s.hosts()[0], peer.MethodRead, body)
	refused(t, "mallory: read of the shard's contention summary", err)
	body, _ = peer.EncodeBody(router.ReadRequest{Shard: s.shard, Query: replica.Query{Kind: replica.QueryWaits}, Level: peers[0].node.peer.TopLevel()})
	_, err = mallory.call(s.hosts()[0], peer.MethodRead, body)
	refused(t, "mallory: read of the shard's wait graph", err)
	_, err = mallory.call(peers[0], peer.MethodStatus, nil)
	refused(t, "mallory: read of a peer's status", err)
	_, err = mallory.call(peers[0], peer.MethodGetPlacement, nil)
	refused(t, "mallory: read of the layout", err)

	if v := s.violation(t); v != "" {
		t.Fatal(v)
	}
	if q := peers[0].node.peer.Placement(); len(q.Peers) != 3 {
		t.Fatalf("the layout lists %d peers after the attacks, want 3", len(q.Peers))
	}
	s.finish(t)
}

// On a plaintext loopback cluster every local process is trusted with
// what needs an identity to refuse (docs/SECURITY.md), but not with what
// needs none: leader-only commands and over-long sessions are refused.
func TestHostileLocalProcess(t *testing.T) {
	peers := startCluster(t, clusterOpts{peers: 3, rf: 3, shards: 2, ttl: 2 * time.Second})
	s := newVictimScene(t, peers, "hostile/local")
	a := newAttacker(t, "local", nil)
	for _, h := range s.hosts() {
		refused(t, "LeaderTerm 2^62 via "+h.cfg.Name, a.propose(h, s.shard, lockfsm.Command{Op: lockfsm.OpLeaderTerm, Term: 1 << 62}))
		refused(t, "ExpireSession via "+h.cfg.Name, a.propose(h, s.shard, lockfsm.Command{Op: lockfsm.OpExpireSession, Session: s.holder.Session, Term: recordedTerm(a.t, h, s.shard)}))
		refused(t, "OpenSession with TTL 2^50 ms via "+h.cfg.Name, a.propose(h, s.shard, lockfsm.Command{Op: lockfsm.OpOpenSession, Owner: "local", TTLMillis: 1 << 50}))
		body, _ := peer.EncodeBody(router.ReadRequest{Shard: s.shard, Query: replica.Query{Kind: replica.QuerySessions}, Level: h.node.peer.TopLevel()})
		_, err := a.call(h, peer.MethodRead, body)
		refused(t, "read of the whole session table via "+h.cfg.Name, err)
	}
	if v := s.violation(t); v != "" {
		t.Fatal(v)
	}
	s.finish(t)
}

// Finding 7 of the security review: the session caps were checked only
// where a proposal was accepted, against counts read before it committed,
// so proposals accepted at once each passed, and together opened four
// times an owner's cap. The state machine enforces the caps on apply now:
// floods of OpenSessions for one owner, forwarded at the same moment to
// every peer of the shard, open at most MaxSessionsPerOwner sessions, the
// rest are refused naming the cap, every replica counts alike, and the
// shard goes on serving.
func TestHostileConcurrentSessionFloods(t *testing.T) {
	peers := startCluster(t, clusterOpts{peers: 3, rf: 3, shards: 2, ttl: 2 * time.Second})
	const key = "flooded"
	shard := peers[0].node.peer.Placement().ShardOf(key)
	lockAndUnlock(t, peers[0].node, key)
	pollUntil(t, 20*time.Second, "every replica knowing the shard's leader", func() bool {
		for _, p := range peers {
			if _, _, ok, err := p.node.peer.NodeHost().GetLeaderID(shard); !ok || err != nil {
				return false
			}
		}
		return true
	})

	a := newAttacker(t, "local", nil)
	const floods = 4
	flood := make([]lockfsm.Command, lockfsm.MaxBatch)
	for i := range flood {
		flood[i] = lockfsm.Command{Op: lockfsm.OpOpenSession, Owner: "flood", TTLMillis: 60_000}
	}
	raw, err := lockfsm.EncodeCommandsFormat(peers[0].node.peer.ClusterLevel().CommandFormat(), flood)
	if err != nil {
		t.Fatal(err)
	}
	body, err := peer.EncodeBody(router.ProposeRequest{Shard: shard, Cmds: raw, Level: peers[0].node.peer.TopLevel()})
	if err != nil {
		t.Fatal(err)
	}
	type answer struct {
		via     string
		results []lockfsm.Result
		err     error
	}
	start, answers := make(chan struct{}), make(chan answer, floods)
	for i := range floods {
		h := peers[i%len(peers)]
		go func() {
			<-start
			ans := answer{via: h.cfg.Name}
			var raw []byte
			if raw, ans.err = a.call(h, peer.MethodPropose, body); ans.err == nil {
				var resp router.ProposeResponse
				if ans.err = peer.DecodeBody(raw, &resp); ans.err == nil {
					ans.results, ans.err = lockfsm.DecodeResults(resp.Results)
				}
			}
			answers <- ans
		}()
	}
	close(start)
	opened := 0
	for range floods {
		ans := <-answers
		switch {
		case lockerr.Code(ans.err) == lockerr.CodeForbidden:
			// The check where a flood is accepted refuses it whole once
			// the others have committed: an early refusal.
			continue
		case router.Retryable(ans.err):
			// Its outcome is unknown: the replicas' count below covers it.
			t.Logf("a flood via %s: %v", ans.via, ans.err)
			continue
		case ans.err != nil:
			t.Fatalf("a flood via %s: %v", ans.via, ans.err)
		}
		for _, r := range ans.results {
			switch {
			case r.Status == lockfsm.StatusOK:
				opened++
			case r.Status == lockfsm.StatusSessionLimit && strings.Contains(r.Err, fmt.Sprint("MaxSessionsPerOwner is ", authz.MaxSessionsPerOwner)):
			default:
				t.Fatalf("a flood via %s: %v %q, want opened or refused naming the owner's cap", ans.via, r.Status, r.Err)
			}
		}
	}
	// Every replica holds what the floods were told, and no more than
	// the cap.
	type count struct{ index, owned uint64 }
	counts := make([]count, len(peers))
	pollUntil(t, 20*time.Second, "every replica at the same index", func() bool {
		for i, p := range peers {
			v, err := p.node.peer.NodeHost().StaleRead(shard, replica.StateReader(func(st *lockfsm.State) any {
				_, owned := st.SessionCount("flood")
				return count{st.Index(), uint64(owned)}
			}))
			if counts[i], _ = v.(count); err != nil || counts[i] != counts[0] {
				return false
			}
		}
		return true
	})
	t.Logf("%d floods of %d OpenSessions for one owner: %d opened as answered, %d on every replica", floods, len(flood), opened, counts[0].owned)
	if counts[0].owned > authz.MaxSessionsPerOwner || uint64(opened) > counts[0].owned {
		t.Fatalf("%d sessions open for one owner (%d answered as opened); MaxSessionsPerOwner is %d", counts[0].owned, opened, authz.MaxSessionsPerOwner)
	}
	lockAndUnlock(t, peers[0].node, key)
}

// An entry proposed over the Raft port reaches the shard as it was
// written, so from the level whose peers mark every OpenSession Capped,
// an unmarked one is refused there: it would escape the session caps on
// apply. Below that level nothing is marked, and nothing need be.
func TestRaftProposalsMustMarkOpenSessions(t *testing.T) {
	for _, lvl := range []level.Level{level.Family - 1, level.Family} {
		peers := startCluster(t, clusterOpts{peers: 1, rf: 1, shards: 2, hook: func(h *peer.Hooks) { h.HoldLevel = lvl }})
		n := peers[0].node
		if got := n.peer.ClusterLevel(); got != lvl {
			t.Fatalf("the cluster runs at level %d, want %d", got, lvl)
		}
		shard, port := n.peer.Placement().ShardOf("x"), n.peer.RaftPort()
		open := lockfsm.Command{Op: lockfsm.OpOpenSession, Owner: "local", TTLMillis: 1000}
		unmarked, err := lockfsm.EncodeCommandsFormat(lockfsm.FormatTagged, []lockfsm.Command{open})
		if err != nil {
			t.Fatal(err)
		}
		err = port.Proposal(authz.Caller{}, shard, unmarked)
		switch {
		case lvl.CapsSessions() && !errors.Is(err, authz.ErrForbidden):
			t.Errorf("level %d: an unmarked OpenSession over the Raft port: %v, want it refused", lvl, err)
		case !lvl.CapsSessions() && err != nil:
			t.Errorf("level %d: an unmarked OpenSession over the Raft port: %v, want it accepted", lvl, err)
		}
		if !lvl.CapsSessions() {
			continue
		}
		open.Capped = true
		marked, err := lockfsm.EncodeCommandsFormat(lockfsm.FormatTagged, []lockfsm.Command{open})
		if err != nil {
			t.Fatal(err)
		}
		if err := port.Proposal(authz.Caller{}, shard, marked); err != nil {
			t.Errorf("level %d: a marked OpenSession over the Raft port: %v", lvl, err)
		}
	}
}

// A joiner promised no bootstrap plan, so a commit sent to it is refused
// and nothing is written into its data dir (it used to adopt any commit).
func TestHostileBootstrapCommitToJoiner(t *testing.T) {
	joiner := &testPeer{cfg: testConfig(t, "joiner", clusterOpts{shards: 2, rf: 1, ttl: time.Second})}
	joiner.cfg.BootstrapExpect = 0
	joiner.cfg.Join = []string{"127.0.0.1:1"} // nobody: it waits to be admitted
	joiner.start(t)
	t.Cleanup(joiner.stop)

	plan := layout.New(42, 2, 1, layout.KeySchemeHashTag, []layout.Peer{{Name: "joiner", NodeHostID: joiner.node.peer.NodeHost().ID()}})
	raw, err := layout.Encode(plan)
	if err != nil {
		t.Fatal(err)
	}
	a := newAttacker(t, "local", nil)
	_, err = a.call(joiner, peer.MethodCommit, raw)
	refused(t, "bootstrap commit to a joiner", err)
	if p := joiner.node.peer.Placement(); p != nil {
		t.Fatalf("the joiner adopted cluster %d", p.ClusterID)
	}
	var cid [8]byte
	binary.BigEndian.PutUint64(cid[:], 42)
	if _, err := a.call(joiner, peer.MethodAbort, cid[:]); err != nil {
		t.Fatalf("abort of a plan it never promised: %v", err)
	}
}

// The broken variant: with authorization switched off, the same forged
// release by a stranger's certificate grants the waiter while the
// victim's Done stays open. The suite sees it, so it can fail.
func TestHostileBrokenVariantIsCaught(t *testing.T) {
	ca := transporttest.NewCA(t)
	peers := tlsCluster(t, ca, func(h *peer.Hooks) { h.UnsafeNoAuthz = true })
	s := newVictimScene(t, peers, "hostile/broken")
	a := newAttacker(t, "mallory", ca.Issue("mallory"))
	if err := a.propose(s.hosts()[0], s.shard, lockfsm.Command{Op: lockfsm.OpRelease, Session: s.holder.Session, Target: s.holder.Req}); err != nil {
		t.Fatalf("forged release with authorization off: %v", err)
	}
	select {
	case l := <-s.waiter:
		select {
		case <-s.lock.Done():
			t.Fatalf("the waiter got token %d, but the victim was told (%v): not the silent double holder of the review", l.Token(), s.lock.Err())
		default:
		}
		if v := s.violation(t); v == "" {
			t.Fatal("the suite's check saw nothing wrong with two holders")
		} else {
			t.Logf("caught: two holders, the victim (token %d, Done open) and the waiter (token %d); the check says: %s", s.lock.Token(), l.Token(), v)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the forged release granted nobody in 20 s: the broken variant shows nothing")
	}
}

// warnings returns the messages of the warnings recorded so far.
func (r logRecorder) warnings() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, rec := range *r.records {
		if rec.Level >= slog.LevelWarn {
			out = append(out, rec.Message)
		}
	}
	return out
}

// A peer that holds the gossip key but a certificate of another CA joins
// gossip, yet is never admitted: the controller asks it to prove its
// name over TLS first (finding 8: it was made a voter of shards it could
// never run, and one crash then stopped them).
func TestHostileForeignCertificateNotAdmitted(t *testing.T) {
	ca, other := transporttest.NewCA(t), transporttest.NewCA(t)
	key := randomKey(t, 32)
	rec := newLogRecorder()
	peers := startCluster(t, clusterOpts{peers: 3, rf: 3, shards: 2, mutate: func(c *Config) {
		c.GossipKey, c.TLS, c.Logger = key, ca.Issue(c.Name), slog.New(rec)
	}})
	lockAndUnlock(t, peers[0].node, "admit/a")

	impostor := &testPeer{cfg: joinerConfig(t, "impostor", peers)}
	impostor.cfg.GossipKey, impostor.cfg.TLS = key, other.Issue("impostor")
	impostor.start(t)
	t.Cleanup(impostor.stop)
	pollUntil(t, 20*time.Second, "the impostor seen in gossip", func() bool {
		m, ok := peers[0].node.peer.Mesh().Member("impostor")
		return ok && m.State == mesh.StateAlive
	})
	pollUntil(t, 20*time.Second, "the controller refusing the impostor", func() bool {
		return slices.ContainsFunc(rec.warnings(), func(m string) bool {
			return strings.Contains(m, "not admitting a peer that does not prove its identity")
		})
	})
	for _, p := range peers {
		if _, ok := p.node.peer.Placement().Peer("impostor"); ok {
			t.Fatalf("%s's layout lists the impostor", p.cfg.Name)
		}
	}

	// The positive control: a joiner with the cluster's CA is admitted.
	joiner := &testPeer{cfg: joinerConfig(t, "joiner", peers)}
	joiner.cfg.GossipKey, joiner.cfg.TLS = key, ca.Issue("joiner")
	joiner.start(t)
	t.Cleanup(joiner.stop)
	pollUntil(t, 20*time.Second, "the joiner admitted", func() bool {
		_, ok := peers[0].node.peer.Placement().Peer("joiner")
		return ok
	})
}

// The transport reserves room for an answer before it runs the handler,
// so the bound must cover what each method can answer: a read of one
// request's state is small, anything that lists a key's holders, the
// layout or every shard may take a whole frame.
func TestAnswerBound(t *testing.T) {
	enc := func(v any) []byte {
		b, err := peer.EncodeBody(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, tc := range []struct {
		name   string
		method uint8
		body   []byte
		want   int
	}{
		{"request state", peer.MethodRead, enc(router.ReadRequest{Shard: 2, Query: replica.Query{Kind: replica.QueryRequest, Session: 1, Req: 1}}), peer.SmallAnswer},
		{"a key's holders", peer.MethodRead, enc(router.ReadRequest{Shard: 2, Query: replica.Query{Kind: replica.QueryKey, Key: "k"}}), peer.MaxBodySize},
		{"a contention summary", peer.MethodRead, enc(router.ReadRequest{Shard: 2, Query: replica.Query{Kind: replica.QueryTop, K: replica.MaxTop}}), peer.MaxBodySize},
		{"a wait graph", peer.MethodRead, enc(router.ReadRequest{Shard: 2, Query: replica.Query{Kind: replica.QueryWaits}}), peer.MaxBodySize},
		{"undecodable read", peer.MethodRead, []byte{0xc1}, peer.MaxBodySize},
		{"layout", peer.MethodGetPlacement, nil, peer.MaxBodySize},
		{"status", peer.MethodStatus, nil, peer.MaxBodySize},
		{"membership", peer.MethodMembership, enc(membership.ShardRequest{Shard: 2}), peer.LargeAnswer},
		{"watch snapshot", peer.MethodWatch, enc(peer.WatchRequest{Shard: 2, Key: "k", Snapshot: true}), peer.MaxBodySize},
		{"watch that waits", peer.MethodWatch, enc(peer.WatchRequest{Shard: 2, Key: "k", After: 7, WaitMillis: 1000}), peer.LargeAnswer},
		{"proposal of 1000 bytes", peer.MethodPropose, make([]byte, 1000), 8*1000 + peer.SmallAnswer},
		{"notify", peer.MethodNotify, make([]byte, 1000), peer.SmallAnswer},
	} {
		if got := peer.AnswerBound(tc.method, tc.body); got != tc.want {
			t.Errorf("%s: bound %d, want %d", tc.name, got, tc.want)
		}
	}
}
