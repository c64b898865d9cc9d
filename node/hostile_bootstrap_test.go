package node

import (
	"strings"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/peer"
	"github.com/lockmesh/lockmesh/mesh"
	"github.com/lockmesh/lockmesh/transport/transporttest"
)

// Bootstrap capture (issue 27, finding 5): with GossipKey, TLS and
// RaftTLS all set, a certificate of the cluster's CA for a name that is
// no member used to learn a peer's NodeHostID from a refusal, then have
// it promise and commit a plan listing the attacker as a founder: the
// peer became Ready in the attacker's cluster and granted fencing token 1
// again. A prepare is now accepted only by a founder, and only from the
// plan's coordinator as gossip shows it; refusals name no NodeHostID.

// hardened sets all three protections on c, with ca's certificates and
// key as the gossip key.
func hardened(c *Config, ca *transporttest.CA, dir string, key []byte) {
	c.GossipKey, c.TLS, c.RaftTLS = key, ca.Issue(c.Name), raftFiles(ca, dir, c.Name)
}

// captureAttempt plays the attack on p as a: a wrong plan to learn p's
// NodeHostID, then a prepare and a commit of a plan of founders (p with
// its real NodeHostID and others). Every step must be refused and p must
// adopt nothing.
func captureAttempt(t *testing.T, a *attacker, p *testPeer, founders ...string) {
	t.Helper()
	id := p.node.peer.NodeHost().ID()
	plan := func(selfID string) []byte {
		peers := []layout.Peer{{Name: p.cfg.Name, NodeHostID: selfID}}
		for _, f := range founders {
			peers = append(peers, layout.Peer{Name: f, NodeHostID: "attacker-" + f})
		}
		raw, err := layout.Encode(layout.New(7, 2, 1, layout.KeySchemeHashTag, peers))
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	for _, method := range []uint8{peer.MethodPrepare, peer.MethodCommit} {
		_, err := a.call(p, method, plan("wrong"))
		if err == nil {
			t.Fatalf("%s: method %d of a plan with a wrong NodeHostID accepted by %s", a.name, method, p.cfg.Name)
		}
		if strings.Contains(err.Error(), id) {
			t.Errorf("%s: the refusal reveals %s's NodeHostID: %v", a.name, p.cfg.Name, err)
		}
	}
	raw := plan(id)
	_, err := a.call(p, peer.MethodPrepare, raw)
	refused(t, a.name+": prepare of a plan it coordinates, to "+p.cfg.Name, err)
	if err != nil && strings.Contains(err.Error(), id) {
		t.Errorf("%s: the refusal reveals %s's NodeHostID: %v", a.name, p.cfg.Name, err)
	}
	_, err = a.call(p, peer.MethodCommit, raw)
	refused(t, a.name+": commit of that plan to "+p.cfg.Name, err)
	if q := p.node.peer.Placement(); q != nil {
		t.Fatalf("%s adopted %s's cluster %d", p.cfg.Name, a.name, q.ClusterID)
	}
}

// A joiner founds nothing: it refuses every prepare, so no commit finds a
// promise, whoever sends it.
func TestHostileBootstrapCaptureOfJoiner(t *testing.T) {
	ca, dir, key := transporttest.NewCA(t), t.TempDir(), randomKey(t, 32)
	joiner := &testPeer{cfg: testConfig(t, "joiner", clusterOpts{shards: 2, rf: 1, ttl: time.Second})}
	joiner.cfg.Join = []string{"127.0.0.1:1"} // nobody: it waits to be admitted
	hardened(&joiner.cfg, ca, dir, key)
	joiner.start(t)
	t.Cleanup(joiner.stop)

	captureAttempt(t, newAttacker(t, "mallory", ca.Issue("mallory")), joiner, "mallory")
	// Its own certificate does not make the joiner found a cluster either.
	captureAttempt(t, newAttacker(t, "joiner", ca.Issue("joiner")), joiner)
}

// A founder accepts a prepare only from the plan's coordinator, a founder
// gossip shows alive: not from a stranger outside gossip, nor from a
// gossip member that only joins. It then forms its cluster with the real
// founder as if nothing had happened.
func TestHostileBootstrapPrepareFromNonFounder(t *testing.T) {
	ca, dir, key := transporttest.NewCA(t), t.TempDir(), randomKey(t, 32)
	o := clusterOpts{expect: 2, shards: 2, rf: 2, ttl: time.Second}
	founder := &testPeer{cfg: testConfig(t, "peer-1", o)}
	hardened(&founder.cfg, ca, dir, key)
	founder.start(t)
	t.Cleanup(founder.stop)

	// "a-joiner" sorts before "peer-1", so a plan of the two would be its
	// to coordinate; it gossips that it only joins.
	joiner := &testPeer{cfg: joinerConfig(t, "a-joiner", []*testPeer{founder})}
	hardened(&joiner.cfg, ca, dir, key)
	joiner.start(t)
	t.Cleanup(joiner.stop)
	pollUntil(t, 20*time.Second, "the joiner alive in the founder's gossip", func() bool {
		m, ok := founder.node.peer.Mesh().Member("a-joiner")
		return ok && m.State == mesh.StateAlive
	})

	captureAttempt(t, newAttacker(t, "mallory", ca.Issue("mallory")), founder, "mallory")
	captureAttempt(t, newAttacker(t, "a-joiner", ca.Issue("a-joiner")), founder, "a-joiner")

	second := &testPeer{cfg: testConfig(t, "peer-2", o)}
	second.cfg.Join = []string{founder.node.GossipAddr()}
	hardened(&second.cfg, ca, dir, key)
	second.start(t)
	t.Cleanup(second.stop)
	founder.waitReady(t)
	second.waitReady(t)
	p := founder.node.peer.Placement()
	_, withSecond := p.Peer("peer-2")
	if _, withMallory := p.Peer("mallory"); withMallory || !withSecond {
		t.Fatalf("the founder's cluster lists %+v, want peer-2 and not mallory", p.Peers)
	}
	lockAndUnlock(t, founder.node, "bootstrap/after")
}
