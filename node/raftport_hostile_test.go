package node

import (
	"crypto/tls"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/lni/dragonboat/v4/raftio"
	pb "github.com/lni/dragonboat/v4/raftpb"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/level"
	"github.com/lockmesh/lockmesh/internal/lockerr"
	"github.com/lockmesh/lockmesh/internal/peer"
	"github.com/lockmesh/lockmesh/lockfsm"
	"github.com/lockmesh/lockmesh/transport/transporttest"
)

// The Raft port's hostile suite: forged Raft messages of each finding of
// the attacker review, sent to real Raft ports (raftnet over TCP, with
// and without RaftTLS) of in-process clusters. Without the filter in
// front of dragonboat (internal/raftauth) each crash attack ends this
// test binary: dragonboat panics on a step or apply worker that no
// recover reaches.

// raftForger sends forged Raft message batches to peers' Raft ports.
type raftForger struct {
	t   testing.TB
	tls *tls.Config // nil: a local process on a plaintext cluster
}

// send delivers msgs to p in one batch, and returns once p's port has
// read it and handed it on: the frame is followed by dragonboat's
// end-of-stream mark, which the port answers after the frames before it.
func (f raftForger) send(p *testPeer, msgs ...pb.Message) {
	f.t.Helper()
	b := pb.MessageBatch{Requests: msgs, DeploymentId: deploymentID(p.node), SourceAddress: p.cfg.RaftAddr, BinVer: raftio.TransportBinVersion}
	body, err := b.Marshal()
	if err != nil {
		f.t.Fatal(err)
	}
	s := raftSender{addr: p.cfg.RaftAddr, tls: f.tls}
	c, err := s.dial()
	if err != nil {
		f.t.Fatalf("dial %s's Raft port: %v", p.cfg.Name, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(append(raftFuzzFrame(body, f.tls != nil), 0, 0)); err != nil {
		f.t.Fatalf("write to %s's Raft port: %v", p.cfg.Name, err)
	}
	var answer [2]byte
	io.ReadFull(c, answer[:]) // the mark back, or EOF if the port closed the connection
}

// raftTarget is a replica an attack is aimed at: to is the target peer's
// replica of shard, from the replica the forged messages claim to come
// from.
type raftTarget struct {
	peer            *testPeer
	shard, to, from uint64
}

// raftTargets lists, for every peer but the sender and every shard it
// hosts, the replica to attack and a sender replica: the sender's own
// when it hosts the shard (a member's certificate can only claim its own
// replicas), else another replica of the shard.
func raftTargets(peers []*testPeer, sender string) []raftTarget {
	p := peers[0].node.peer.Placement()
	var out []raftTarget
	for _, pe := range peers {
		if pe.cfg.Name == sender {
			continue
		}
		for _, shard := range p.ShardIDs() {
			to, ok := p.ReplicaID(shard, pe.cfg.Name)
			if !ok {
				continue
			}
			from, ok := p.ReplicaID(shard, sender)
			if !ok {
				for _, r := range p.Replicas[shard] {
					if r.ID != to {
						from = r.ID
						break
					}
				}
			}
			out = append(out, raftTarget{peer: pe, shard: shard, to: to, from: from})
		}
	}
	return out
}

// forgedTerm is a term far above the cluster's and within the filter's
// bound on jumps: dragonboat takes messages of it as from a new leader.
const forgedTerm = 1 << 19

// crashMessages are the messages the review sent to one replica that
// crashed its process or halted its shard, each aimed at x.
func crashMessages(x raftTarget) map[string][]pb.Message {
	at := func(t pb.MessageType) pb.Message {
		return pb.Message{Type: t, ShardID: x.shard, To: x.to, From: x.from, Term: forgedTerm}
	}
	out := map[string][]pb.Message{}
	for _, t := range []pb.MessageType{pb.Election, pb.LeaderHeartbeat, pb.CheckQuorum, pb.BatchedReadIndex,
		pb.LocalTick, pb.Unreachable, pb.SnapshotStatus, pb.LogQuery, pb.ConfigChangeEvent, pb.InstallSnapshot} {
		out["local "+t.String()] = []pb.Message{at(t)}
	}
	out["type 255"] = []pb.Message{at(pb.MessageType(255))}
	hb := at(pb.Heartbeat)
	hb.Commit = 1 << 40
	out["Heartbeat with commit 2^40"] = []pb.Message{hb}
	for _, t := range []pb.MessageType{pb.RequestPreVote, pb.RequestVote} {
		m := at(t)
		m.Term = 0
		out[t.String()+" of term 0"] = []pb.Message{m}
	}
	lt := at(pb.LeaderTransfer)
	lt.Term = 0
	out["LeaderTransfer to nobody"] = []pb.Message{lt}
	to0 := at(pb.Heartbeat)
	to0.To = 0
	out["To 0"] = []pb.Message{to0}
	rep := at(pb.Replicate)
	rep.Entries = []pb.Entry{{Index: 1, Term: forgedTerm}, {Index: 5, Term: forgedTerm}}
	out["Replicate with a gap, conflicting with committed entries"] = []pb.Message{rep}
	return out
}

// forgedProposals are Propose messages the review committed, each aimed
// at x: entries dragonboat cannot apply, a payload lockmesh cannot read,
// and leader-only commands.
func forgedProposals(t testing.TB, x raftTarget, l level.Level) map[string]pb.Message {
	propose := func(entries ...pb.Entry) pb.Message {
		return pb.Message{Type: pb.Propose, ShardID: x.shard, To: x.to, From: x.from, Entries: entries}
	}
	commands := func(cmds ...lockfsm.Command) pb.Entry {
		raw, err := lockfsm.EncodeCommandsFormat(l.CommandFormat(), cmds)
		if err != nil {
			t.Fatal(err)
		}
		return pb.Entry{Type: pb.EncodedEntry, ClientID: 12345, Key: 7, Cmd: append([]byte{0}, raw...)}
	}
	out := map[string]pb.Message{
		"payload without a client session (crash loop)": propose(pb.Entry{Type: pb.ApplicationEntry, Cmd: []byte("crash-loop")}),
		"encoded payload without a client session":      propose(pb.Entry{Type: pb.EncodedEntry, Cmd: []byte{0, 'x'}}),
		"undecodable payload (halts every replica)":     propose(pb.Entry{Type: pb.EncodedEntry, ClientID: 12345, Key: 7, Cmd: []byte{0, 0xc1, 0xc1}}),
		"proposal key 0": propose(pb.Entry{Type: pb.EncodedEntry, ClientID: 12345, Cmd: []byte{0, 0xc1}}),
	}
	if x.shard != layout.MetaShard {
		out["LeaderTerm 2^62"] = propose(commands(lockfsm.Command{Op: lockfsm.OpLeaderTerm, Term: 1 << 62}))
		out["ExpireSession of session 1"] = propose(commands(lockfsm.Command{Op: lockfsm.OpExpireSession, Session: 1, Term: 1 << 62}))
	}
	return out
}

// raftPortHealthy fails t unless every peer serves: no replica halted,
// every lock shard grants through every peer, and no lock shard recorded
// a leader term at or above 2^62 (a forged LeaderTerm).
func raftPortHealthy(t *testing.T, peers []*testPeer) {
	t.Helper()
	p := peers[0].node.peer.Placement()
	for _, pe := range peers {
		for _, shard := range p.ShardIDs() {
			if he := pe.node.peer.HaltedShard(shard); he != nil {
				t.Errorf("%s: replica of shard %d halted: %v", pe.cfg.Name, shard, he)
			}
		}
	}
	for _, shard := range p.ShardIDs()[1:] {
		for _, pe := range peers {
			lockAndUnlock(t, pe.node, keyOnShard(p, shard, fmt.Sprintf("raftport/%s", pe.cfg.Name)))
		}
	}
	for _, problem := range forgedTerms(t, peers) {
		t.Error(problem)
	}
}

// forgedTerms lists the lock shard replicas that recorded a leader term
// at or above 2^62: a forged LeaderTerm committed.
func forgedTerms(t *testing.T, peers []*testPeer) []string {
	var out []string
	for _, shard := range peers[0].node.peer.Placement().ShardIDs()[1:] {
		for _, pe := range peers {
			if !pe.node.peer.HostsShard(shard) {
				continue
			}
			if term := recordedTerm(t, pe, shard); term >= 1<<62 {
				out = append(out, fmt.Sprintf("%s: shard %d recorded leader term %d: a forged LeaderTerm committed", pe.cfg.Name, shard, term))
			}
		}
	}
	return out
}

// attackRaftPort sends every crash message and forged proposal of the
// review to every replica of every peer but sender, as f, and checks
// after each kind that the cluster serves.
func attackRaftPort(t *testing.T, peers []*testPeer, f raftForger, sender string) {
	targets := raftTargets(peers, sender)
	for _, x := range targets {
		for _, msgs := range crashMessages(x) {
			f.send(x.peer, msgs...)
		}
	}
	raftPortHealthy(t, peers)
	for _, x := range targets {
		for _, m := range forgedProposals(t, x, x.peer.node.peer.ClusterLevel()) {
			f.send(x.peer, m)
		}
	}
	raftPortHealthy(t, peers)
}

// restartable returns a mutate that gives each peer fixed gossip and RPC
// addresses, at which it is found again after a restart.
func restartable(t testing.TB) func(*Config) {
	return func(c *Config) { c.GossipAddr, c.RPCAddr = freeAddr(t), freeAddr(t) }
}

// restartAll closes every peer and starts it again on its data dir: an
// entry in a log that crashes its apply would crash every restart.
func restartAll(t *testing.T, peers []*testPeer) {
	t.Helper()
	for _, p := range peers {
		p.node.Close()
	}
	for _, p := range peers {
		p.start(t)
	}
	for _, p := range peers {
		p.waitReady(t)
	}
}

// TestRaftPortLocalProcess: on a plaintext loopback cluster any local
// process reaches the Raft port anonymously. None of the review's crash
// messages crashes a peer or stops a shard, no forged proposal commits
// (LeaderTerm 2^62, a payload dragonboat or lockmesh cannot apply), and
// the whole cluster restarts on its data dirs and serves.
//
// Before the filter: the first local-type message ended the test binary
// ("local message sent to Step"), as did a Heartbeat's commit of 2^40
// ("invalid commitTo index") and the payload without a client session
// ("not session managed, not empty", again at every restart).
func TestRaftPortLocalProcess(t *testing.T) {
	peers := startCluster(t, clusterOpts{peers: 3, rf: 3, mutate: restartable(t)})
	scene := newVictimScene(t, peers, "raftport/victim")
	attackRaftPort(t, peers, raftForger{t: t}, "nobody")
	if v := scene.violation(t); v != "" {
		t.Fatalf("after the attacks: %s", v)
	}
	scene.finish(t)
	restartAll(t, peers)
	raftPortHealthy(t, peers)
}

// TestRaftPortMemberCertificate: with RaftTLS, a compromised member
// (peer-1's certificate) sends the review's messages to the other peers
// as its own replicas: none crashes a peer or commits. It may not claim
// another member's replica, nor propose on another member's session: a
// forged Release of peer-2's lock is dropped, and the lock is kept. A
// certificate of the CA for a name no layout lists is refused at the
// handshake.
func TestRaftPortMemberCertificate(t *testing.T) {
	ca, dir, key := transporttest.NewCA(t), t.TempDir(), randomKey(t, 32)
	peers := startCluster(t, clusterOpts{peers: 3, rf: 3, mutate: func(c *Config) {
		restartable(t)(c)
		hardened(c, ca, dir, key)
	}})
	member := &tls.Config{Certificates: []tls.Certificate{ca.Certificate("peer-1")}, RootCAs: ca.Pool()}
	f := raftForger{t: t, tls: member}

	// peer-2 holds a key; peer-3 waits for it.
	scene := newVictimScene(t, []*testPeer{peers[1], peers[0], peers[2]}, "raftport/victim")
	attackRaftPort(t, peers, f, "peer-1")
	p := peers[0].node.peer.Placement()
	v := scene.holder
	for _, x := range raftTargets(peers, "peer-1") {
		if x.shard != scene.shard {
			continue
		}
		raw, err := lockfsm.EncodeCommandsFormat(peers[0].node.peer.ClusterLevel().CommandFormat(), []lockfsm.Command{{Op: lockfsm.OpRelease, Session: v.Session, Target: v.Req}})
		if err != nil {
			t.Fatal(err)
		}
		release := pb.Message{Type: pb.Propose, ShardID: x.shard, To: x.to, From: x.from,
			Entries: []pb.Entry{{Type: pb.EncodedEntry, ClientID: 12345, Key: 7, Cmd: append([]byte{0}, raw...)}}}
		f.send(x.peer, release)
		// Claiming peer-2's replica is refused whatever the message.
		if id, ok := p.ReplicaID(x.shard, "peer-2"); ok && id != x.to {
			release.From = id
			f.send(x.peer, release)
		}
	}
	raftPortHealthy(t, peers)
	if v := scene.violation(t); v != "" {
		t.Fatalf("after a member's forged Release over Raft: %s", v)
	}
	scene.finish(t)

	stranger := raftSender{addr: peers[1].cfg.RaftAddr, tls: &tls.Config{Certificates: []tls.Certificate{ca.Certificate("mallory")}, RootCAs: ca.Pool()}}
	if c, err := stranger.dial(); err == nil {
		if !closedByPeer(c, 5*time.Second) {
			t.Error("a certificate of the CA for a non-member kept a Raft connection open")
		}
		c.Close()
	}
	restartAll(t, peers)
	raftPortHealthy(t, peers)
}

// TestRaftPortBrokenVariantIsCaught: with the filter off, a forged
// LeaderTerm proposal commits, and raftPortHealthy reports it. (The crash
// messages are not sent: they would end the test binary.)
func TestRaftPortBrokenVariantIsCaught(t *testing.T) {
	peers := startCluster(t, clusterOpts{peers: 3, rf: 3, hook: func(h *peer.Hooks) { h.UnsafeNoRaftFilter = true }})
	for _, p := range peers {
		if err := p.node.WaitServing(ctxT(t, 20*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	f := raftForger{t: t}
	for _, x := range raftTargets(peers, "nobody") {
		if m, ok := forgedProposals(t, x, peers[0].node.peer.ClusterLevel())["LeaderTerm 2^62"]; ok {
			f.send(x.peer, m)
		}
	}
	// Every lock shard's replicas apply what their leader commits; the
	// check must see it on each.
	want := 3 * peers[0].node.peer.Placement().Shards
	pollUntil(t, 20*time.Second, "the check to see the forged LeaderTerm on every lock shard replica", func() bool {
		return len(forgedTerms(t, peers)) == want
	})
}

// TestLevel3CommandsRefusedBelowLevel3: in a cluster at level 2 (one
// peer of a release that reads no level-3 field), a command with a
// level-3 field would halt that peer's replica. Forwarded over RPC it is
// refused as retryable (the forwarder's view of a raise may be ahead of
// the serving peer's); proposed over Raft it is dropped: no session of
// its owner opens. The broken variant, the Raft filter off, lets the
// Raft proposal commit, and the test sees the session open. (The held
// peer plays the old release by the format byte only, so its replica
// does not halt on the label here as the real one would.)
func TestLevel3CommandsRefusedBelowLevel3(t *testing.T) {
	labelled := lockfsm.Command{Op: lockfsm.OpOpenSession, Owner: "mixed-1-forged", TTLMillis: 1000, Label: 77}
	testCommandsRefusedBelowTheirLevel(t, level.Tagged, labelled)
}

// TestLevel4CommandsRefusedBelowLevel4: the same in a cluster at level 3
// (one peer held there) for a command with a level-4 field, a value: an
// OpenSession carrying one (which its replicas ignore, but the held
// peer's could not read: tag 19).
func TestLevel4CommandsRefusedBelowLevel4(t *testing.T) {
	valued := lockfsm.Command{Op: lockfsm.OpOpenSession, Owner: "mixed-1-forged", TTLMillis: 1000, Label: 77, Capped: true, Value: []byte("level 4")}
	testCommandsRefusedBelowTheirLevel(t, level.Family, valued)
}

// testCommandsRefusedBelowTheirLevel forges forged, an OpenSession for
// mixed-1-forged of a level above hold, in a cluster held at hold.
func testCommandsRefusedBelowTheirLevel(t *testing.T, hold level.Level, forged lockfsm.Command) {
	for _, broken := range []bool{false, true} {
		t.Run(map[bool]string{false: "filtered", true: "filter off"}[broken], func(t *testing.T) {
			peers := startMixedCluster(t, clusterOpts{expect: 3, shards: 2, rf: 3}, "mixed", hold,
				func(h *peer.Hooks) { h.UnsafeNoRaftFilter = broken })
			if lvl := peers[0].node.peer.ClusterLevel(); lvl != hold {
				t.Fatalf("cluster at level %d, want %d", lvl, hold)
			}
			old := peers[2]
			p := peers[0].node.peer.Placement()
			shard := p.ShardIDs()[1]
			key := keyOnShard(p, shard, "mixed")
			lockAndUnlock(t, old.node, key)
			if !broken {
				err := newAttacker(t, "local", nil).propose(peers[0], shard, forged)
				if lockerr.Code(err) != lockerr.CodeBusy {
					t.Fatalf("a level-%d OpenSession forwarded at level %d: %v, want refused as busy", forged.FeatureLevel(), hold, err)
				}
			}
			raw, err := lockfsm.EncodeCommandsFormat(lockfsm.FormatTagged, []lockfsm.Command{forged})
			if err != nil {
				t.Fatal(err)
			}
			var leader raftTarget
			pollUntil(t, 10*time.Second, "a leader of the shard", func() bool {
				for _, x := range raftTargets(peers, "nobody") {
					if x.shard == shard && x.peer.node.leadsShard(shard) {
						leader = x
						return true
					}
				}
				return false
			})
			refusedBefore := leader.peer.node.peer.Replicas().RaftRefused()
			raftForger{t: t}.send(leader.peer, pb.Message{Type: pb.Propose, ShardID: shard, To: leader.to, From: leader.from,
				Entries: []pb.Entry{{Type: pb.EncodedEntry, ClientID: 12345, Key: 7, Cmd: append([]byte{0}, raw...)}}})
			// Counted on a peer of this release: the held one may not read
			// the entry.
			owned := func() int {
				_, n := peers[0].node.peer.ShardSessions(shard).Count("mixed-1-forged")
				return n
			}
			if broken {
				pollUntil(t, 10*time.Second, "the forged OpenSession to commit without the filter", func() bool { return owned() == 1 })
				return
			}
			if n := leader.peer.node.peer.Replicas().RaftRefused(); n == refusedBefore {
				t.Fatalf("%s's filter refused nothing after the forged Propose", leader.peer.cfg.Name)
			}
			lockAndUnlock(t, peers[0].node, key) // an entry after the Propose, had it committed
			if n := owned(); n != 0 {
				t.Fatalf("%d sessions of the forged owner opened", n)
			}
		})
	}
}
