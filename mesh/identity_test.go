package mesh

import (
	"errors"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// startIdentityMesh starts a loopback peer gossiping meta, with the given
// ReclaimAfter, that Close()s at test end.
func startIdentityMesh(t *testing.T, name string, meta Meta, reclaim time.Duration, rec *recorder) *Mesh {
	t.Helper()
	return startMeshWith(t, Config{Name: name, BindAddr: "127.0.0.1:0", Meta: meta, Local: true, ReclaimAfter: reclaim}, rec)
}

// conflicting reports whether m refuses the member called name, and the
// holder it names.
func conflicting(m *Mesh, name string) (holder string, ok bool) {
	for _, c := range m.Conflicts() {
		if c.Member.Name == name {
			return c.Holder, true
		}
	}
	return "", false
}

// resolveOn resolves NodeHostID id through m's registry, as dragonboat
// does: "" when it does not resolve.
func resolveOn(t *testing.T, m *Mesh, id string) string {
	t.Helper()
	r, err := m.NodeRegistryFactory().Create("self", 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.Add(1, 1, id)
	addr, _, err := r.Resolve(1, 1)
	if err != nil && !errors.Is(err, ErrUnknownTarget) {
		t.Fatalf("Resolve: %v", err)
	}
	return addr
}

// A member announcing another live member's NodeHostID with its own raft
// address must not take it over: every peer keeps resolving it to the
// holder, and lists the impostor as a conflict instead of a member. The
// holder restarting under its name with a new address keeps it; once the
// holder has left for good, the impostor takes it after ReclaimAfter.
func TestNodeHostIDTakeover(t *testing.T) {
	const reclaim = 5 * time.Second
	rec := &recorder{} // m2's events
	peers := make([]*Mesh, 3)
	for i, name := range []string{"m1", "m2", "m3"} {
		var r *recorder
		if name == "m2" {
			r = rec
		}
		peers[i] = startIdentityMesh(t, name, testMeta(name), reclaim, r)
		if i > 0 {
			joinCtx(t, peers[i], peers[0].Addr())
		}
	}
	for _, p := range peers {
		waitFor(t, 20*time.Second, p.LocalName()+" sees 3 members", func() bool { return len(p.Members()) == 3 })
	}
	m1, observers := peers[0], peers[1:]
	id := testMeta("m1").NodeHostID
	const blackHole = "127.0.0.1:1"

	impostorMeta := testMeta("evil")
	impostorMeta.NodeHostID, impostorMeta.RaftAddr = id, blackHole
	evil := startIdentityMesh(t, "evil", impostorMeta, reclaim, nil)
	joinCtx(t, evil, peers[2].Addr())

	// 1. The impostor is refused by every peer; the holder still resolves.
	for _, p := range append([]*Mesh{m1}, observers...) {
		waitFor(t, 20*time.Second, p.LocalName()+" refuses evil", func() bool {
			_, ok := conflicting(p, "evil")
			return ok
		})
		if holder, _ := conflicting(p, "evil"); holder != "m1" {
			t.Errorf("%s: evil conflicts with %q, want m1", p.LocalName(), holder)
		}
		if _, ok := p.Member("evil"); ok {
			t.Errorf("%s lists evil as a member", p.LocalName())
		}
		if got := resolveOn(t, p, id); got != testMeta("m1").RaftAddr {
			t.Errorf("%s resolves %s to %q, want m1's %q", p.LocalName(), id, got, testMeta("m1").RaftAddr)
		}
	}
	if _, ok := rec.find(EventJoin, "evil"); ok {
		t.Errorf("m2's OnEvent reported evil joining")
	}

	// 2. m1 restarts under its name with a new raft address (and gossip
	// port) within ReclaimAfter: it keeps its NodeHostID.
	if err := m1.Leave(time.Second); err != nil {
		t.Fatal(err)
	}
	m1.Close()
	for _, p := range observers {
		waitFor(t, 20*time.Second, p.LocalName()+" sees m1 go", func() bool { _, ok := p.Member("m1"); return !ok })
	}
	restarted := testMeta("m1")
	restarted.RaftAddr = "raft-m1-restarted:1"
	m1 = startIdentityMesh(t, "m1", restarted, reclaim, nil)
	joinCtx(t, m1, peers[1].Addr())
	for _, p := range observers {
		waitFor(t, 20*time.Second, p.LocalName()+" resolves m1's NodeHostID to its new address", func() bool {
			return checkedResolve(t, p, id, "evil", blackHole) == restarted.RaftAddr
		})
		if _, ok := conflicting(p, "evil"); !ok {
			t.Errorf("%s no longer refuses evil after m1 restarted", p.LocalName())
		}
	}

	// 3. m1 leaves for good: its NodeHostID resolves to nothing until
	// ReclaimAfter has passed, then to the impostor, which joins.
	if err := m1.Leave(time.Second); err != nil {
		t.Fatal(err)
	}
	m1.Close()
	for _, p := range observers {
		waitFor(t, 20*time.Second, p.LocalName()+" hands m1's NodeHostID to evil", func() bool {
			return checkedResolve(t, p, id, "evil", blackHole) == blackHole
		})
		if _, ok := p.Member("evil"); !ok {
			t.Errorf("%s resolves to evil but does not list it", p.LocalName())
		}
	}
	waitFor(t, 10*time.Second, "m2's OnEvent reports evil joining", func() bool { _, ok := rec.find(EventJoin, "evil"); return ok })
}

// checkedResolve resolves id on p, failing the test if it resolved to
// the refused member's address while p refused it before and after.
func checkedResolve(t *testing.T, p *Mesh, id, refused, refusedAddr string) string {
	t.Helper()
	_, before := conflicting(p, refused)
	got := resolveOn(t, p, id)
	if _, after := conflicting(p, refused); before && after && got == refusedAddr {
		t.Fatalf("%s resolves %s to %s, the address of %s, which it refuses", p.LocalName(), id, got, refused)
	}
	return got
}

// newViewMesh returns a Mesh with only its view, fed by observe as
// memberlist's callbacks would feed it, for testing the NodeHostID rules
// without a network.
func newViewMesh(self string, reclaim time.Duration) *Mesh {
	m := &Mesh{
		cfg:      Config{Name: self, ReclaimAfter: reclaim},
		log:      slog.New(slog.DiscardHandler),
		view:     make(map[string]Member),
		byHostID: make(map[string]string),
		refused:  make(map[string]refusal),
		reserved: make(map[string]*reservation),
		leaving:  make(map[string]struct{}),
	}
	return m
}

// gossips returns the memberlist node name, gossiping NodeHostID id and
// raft address raft.
func gossips(t *testing.T, name, id, raft string) *memberlist.Node {
	t.Helper()
	meta := testMeta(name)
	meta.NodeHostID, meta.RaftAddr = id, raft
	b, err := EncodeMeta(meta)
	if err != nil {
		t.Fatal(err)
	}
	return &memberlist.Node{Name: name, Addr: net.IPv4(127, 0, 0, 1), Port: 1, Meta: b}
}

// The NodeHostID rules of identity.go, one by one.
func TestNodeHostIDRules(t *testing.T) {
	lookup := func(m *Mesh, id string) string { addr, _ := m.lookupRaftAddr(id); return addr }
	refusedBy := func(m *Mesh, name string) string { h, _ := conflicting(m, name); return h }

	t.Run("first live holder keeps it", func(t *testing.T) {
		m := newViewMesh("me", time.Hour)
		defer m.closeView()
		m.observe(gossips(t, "a", "X", "a:1"), false)
		m.observe(gossips(t, "b", "X", "b:1"), false)
		m.observe(gossips(t, "b", "X", "b:2"), false) // b updates: still refused
		if got := lookup(m, "X"); got != "a:1" {
			t.Fatalf("X resolves to %q, want a:1", got)
		}
		if h := refusedBy(m, "b"); h != "a" {
			t.Fatalf("b refused for holder %q, want a", h)
		}
		if c := m.Conflicts(); c[0].Member.Meta.RaftAddr != "b:2" {
			t.Fatalf("Conflicts shows b as %+v, want its update", c[0].Member)
		}
		if _, ok := m.Member("b"); ok {
			t.Fatal("b is a member")
		}
		m.observe(gossips(t, "b", "X", "b:2"), true) // the refused member goes
		if len(m.Conflicts()) != 0 {
			t.Fatalf("Conflicts = %v after b went", m.Conflicts())
		}
	})
	t.Run("holder updates apply", func(t *testing.T) {
		m := newViewMesh("me", time.Hour)
		defer m.closeView()
		m.observe(gossips(t, "a", "X", "a:1"), false)
		m.observe(gossips(t, "b", "X", "b:1"), false)
		m.observe(gossips(t, "a", "X", "a:2"), false)
		if got := lookup(m, "X"); got != "a:2" {
			t.Fatalf("X resolves to %q, want a's new a:2", got)
		}
	})
	t.Run("a holder back within ReclaimAfter keeps it", func(t *testing.T) {
		m := newViewMesh("me", time.Hour)
		defer m.closeView()
		m.observe(gossips(t, "a", "X", "a:1"), false)
		m.observe(gossips(t, "b", "X", "b:1"), false)
		m.observe(gossips(t, "a", "X", "a:1"), true) // declared dead, maybe forged
		if got := lookup(m, "X"); got != "" {
			t.Fatalf("X resolves to %q while reserved for a, want nothing", got)
		}
		m.observe(gossips(t, "a", "X", "a:1"), false) // a refutes
		if got := lookup(m, "X"); got != "a:1" || refusedBy(m, "b") != "a" {
			t.Fatalf("X resolves to %q, b refused for %q; want a:1 and a", got, refusedBy(m, "b"))
		}
	})
	t.Run("after ReclaimAfter the longest refused takes it", func(t *testing.T) {
		m := newViewMesh("me", 20*time.Millisecond)
		defer m.closeView()
		m.observe(gossips(t, "a", "X", "a:1"), false)
		m.observe(gossips(t, "c", "X", "c:1"), false)
		m.observe(gossips(t, "b", "X", "b:1"), false)
		m.observe(gossips(t, "a", "X", "a:1"), true)
		waitFor(t, 5*time.Second, "c takes X", func() bool {
			m.viewMu.RLock()
			defer m.viewMu.RUnlock()
			return m.byHostID["X"] == "c"
		})
		if got := lookup(m, "X"); got != "c:1" || refusedBy(m, "b") != "c" {
			t.Fatalf("X resolves to %q, b refused for %q; want c:1 and c", got, refusedBy(m, "b"))
		}
	})
	t.Run("a holder changing its NodeHostID gives it up at once", func(t *testing.T) {
		m := newViewMesh("me", time.Hour)
		defer m.closeView()
		m.observe(gossips(t, "a", "X", "a:1"), false)
		m.observe(gossips(t, "b", "X", "b:1"), false)
		m.observe(gossips(t, "a", "Y", "a:1"), false)
		if got := lookup(m, "X"); got != "b:1" {
			t.Fatalf("X resolves to %q, want b:1", got)
		}
		if got := lookup(m, "Y"); got != "a:1" {
			t.Fatalf("Y resolves to %q, want a:1", got)
		}
	})
	t.Run("a member moving onto a held NodeHostID leaves the view", func(t *testing.T) {
		m := newViewMesh("me", time.Hour)
		defer m.closeView()
		m.observe(gossips(t, "a", "X", "a:1"), false)
		m.observe(gossips(t, "b", "Y", "b:1"), false)
		m.observe(gossips(t, "b", "X", "b:1"), false)
		if _, ok := m.Member("b"); ok || refusedBy(m, "b") != "a" || lookup(m, "Y") != "" {
			t.Fatalf("b still a member or not refused, or Y still resolves: %v %q", m.Conflicts(), lookup(m, "Y"))
		}
	})
	t.Run("this peer always holds its own", func(t *testing.T) {
		m := newViewMesh("me", time.Hour)
		defer m.closeView()
		m.observe(gossips(t, "me", "", "me:1"), false) // before it knows its NodeHostID
		m.observe(gossips(t, "evil", "Z", "evil:1"), false)
		m.observe(gossips(t, "me", "Z", "me:1"), false)
		if got := lookup(m, "Z"); got != "me:1" || refusedBy(m, "evil") != "me" {
			t.Fatalf("Z resolves to %q, evil refused for %q; want me:1 and me", got, refusedBy(m, "evil"))
		}
	})
	t.Run("a bound NodeHostID resolves only to its owner", func(t *testing.T) {
		// The impostor gossips X first (or after its owner is gone past
		// ReclaimAfter): gossip lets it hold X, the binding does not.
		m := newViewMesh("me", time.Hour)
		defer m.closeView()
		m.cfg.Bound = func(id string) (string, bool) {
			if id == "X" {
				return "a", true
			}
			return "", false
		}
		m.observe(gossips(t, "evil", "X", "evil:1"), false)
		m.observe(gossips(t, "a", "X", "a:1"), false)
		if got := lookup(m, "X"); got != "" {
			t.Fatalf("X resolves to %q while the impostor holds it in gossip; want nothing", got)
		}
		m.observe(gossips(t, "evil", "X", "evil:1"), true)
		m.observe(gossips(t, "b", "Y", "b:1"), false)
		if got := lookup(m, "Y"); got != "b:1" {
			t.Fatalf("unbound Y resolves to %q, want b:1 by the gossip rules", got)
		}
	})
}
