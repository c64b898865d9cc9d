package mesh

import (
	"errors"
	"testing"
	"time"
)

// startIdentityMesh starts a loopback peer gossiping meta, with the given
// ReclaimAfter, that Close()s at test end.
func startIdentityMesh(t *testing.T, name string, meta Meta, reclaim time.Duration, rec *recorder) *Mesh {
	t.Helper()
	cfg := Config{Name: name, BindAddr: "127.0.0.1:0", Meta: meta, Local: true, ReclaimAfter: reclaim}
	if rec != nil {
		cfg.OnEvent = rec.add
	}
	m, err := Create(cfg)
	if err != nil {
		t.Fatalf("Create(%s): %v", name, err)
	}
	t.Cleanup(func() { m.Close() })
	return m
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
