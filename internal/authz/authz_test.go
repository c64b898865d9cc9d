package authz

import (
	"errors"
	"testing"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/lockfsm"
)

var (
	anon    = Caller{}
	api1    = Caller{Names: []string{"api-1", "localhost"}}
	api2    = Caller{Names: []string{"api-2"}}
	api3    = Caller{Names: []string{"api-3"}}
	mallory = Caller{Names: []string{"mallory"}}
)

// table is a fake Sessions: session id -> owner.
type table map[uint64]string

func (t table) Owner(id uint64) (string, bool) { o, ok := t[id]; return o, ok }
func (t table) Capped() bool                   { return false }
func (t table) Count(owner string) (total, owned int) {
	for _, o := range t {
		if o == owner {
			owned++
		}
	}
	return len(t), owned
}

// full claims total sessions, owned of them the asked owner's; capped
// says OpenSessions must be marked Capped.
type full struct {
	total, owned int
	capped       bool
}

func (f full) Owner(uint64) (string, bool)     { return "", false }
func (f full) Count(string) (total, owned int) { return f.total, f.owned }
func (f full) Capped() bool                    { return f.capped }

func check(t *testing.T, what string, err error, allowed bool) {
	t.Helper()
	switch {
	case allowed && err != nil:
		t.Errorf("%s: refused: %v", what, err)
	case !allowed && err == nil:
		t.Errorf("%s: allowed, want ErrForbidden", what)
	case !allowed && !errors.Is(err, ErrForbidden):
		t.Errorf("%s: %v does not wrap ErrForbidden", what, err)
	}
}

// Rules 1, 2 and 4 on proposed commands.
func TestCommands(t *testing.T) {
	sessions := table{7: "api-1", 8: "api-2"}
	open := func(owner string, ttlMillis uint64) lockfsm.Command {
		return lockfsm.Command{Op: lockfsm.OpOpenSession, Owner: owner, TTLMillis: ttlMillis}
	}
	capped := func(c lockfsm.Command) lockfsm.Command { c.Capped = true; return c }
	on := func(op lockfsm.Op, session uint64) lockfsm.Command {
		return lockfsm.Command{Op: op, Session: session, Key: "k", Req: 1, Target: 1}
	}
	for _, tc := range []struct {
		name    string
		caller  Caller
		cmds    []lockfsm.Command
		s       Sessions
		allowed bool
	}{
		{"leader term from a member", api1, []lockfsm.Command{{Op: lockfsm.OpLeaderTerm, Term: 1 << 62}}, sessions, false},
		{"leader term, anonymous", anon, []lockfsm.Command{{Op: lockfsm.OpLeaderTerm, Term: 2}}, sessions, false},
		{"expire, anonymous", anon, []lockfsm.Command{on(lockfsm.OpExpireSession, 7)}, sessions, false},
		{"hold expiry, even of its own session", api1, []lockfsm.Command{on(lockfsm.OpExpireHold, 7)}, sessions, false},
		{"hold expiry, anonymous", anon, []lockfsm.Command{on(lockfsm.OpExpireHold, 7)}, sessions, false},
		{"expire after a valid acquire", api1, []lockfsm.Command{on(lockfsm.OpAcquire, 7), on(lockfsm.OpExpireSession, 8)}, sessions, false},
		{"open for itself", api1, []lockfsm.Command{open("api-1", 10_000)}, sessions, true},
		{"open at the TTL limit", api1, []lockfsm.Command{open("api-1", 3_600_000)}, sessions, true},
		{"open above the TTL limit", api1, []lockfsm.Command{open("api-1", 3_600_001)}, sessions, false},
		{"open with TTL 2^50 ms, anonymous", anon, []lockfsm.Command{open("api-1", 1<<50)}, sessions, false},
		{"open for another", api1, []lockfsm.Command{open("api-2", 10_000)}, sessions, false},
		{"open, anonymous", anon, []lockfsm.Command{open("anyone", 10_000)}, sessions, true},
		{"open on a full shard", api1, []lockfsm.Command{open("api-1", 10_000)}, full{total: MaxSessions}, false},
		{"open the last slot", api1, []lockfsm.Command{open("api-1", 10_000)}, full{total: MaxSessions - 1}, true},
		{"two opens for the last slot", api1, []lockfsm.Command{open("api-1", 10_000), open("api-1", 10_000)}, full{total: MaxSessions - 1}, false},
		{"open over the owner's limit", api1, []lockfsm.Command{open("api-1", 10_000)}, full{total: MaxSessionsPerOwner, owned: MaxSessionsPerOwner}, false},
		{"open over the owner's limit, anonymous", anon, []lockfsm.Command{open("x", 10_000)}, full{total: 5000, owned: MaxSessionsPerOwner}, false},
		{"two opens for the owner's last slot", api1, []lockfsm.Command{open("api-1", 10_000), open("api-1", 10_000)}, full{total: 5000, owned: MaxSessionsPerOwner - 1}, false},
		{"unmarked open where the level marks them", api1, []lockfsm.Command{open("api-1", 10_000)}, full{capped: true}, false},
		{"unmarked open where the level marks them, anonymous", anon, []lockfsm.Command{open("x", 10_000)}, full{capped: true}, false},
		{"marked open where the level marks them", api1, []lockfsm.Command{capped(open("api-1", 10_000))}, full{capped: true}, true},
		{"marked open below that level", api1, []lockfsm.Command{capped(open("api-1", 10_000))}, full{}, true},
		{"acquire in own session", api1, []lockfsm.Command{on(lockfsm.OpAcquire, 7)}, sessions, true},
		{"release own", api1, []lockfsm.Command{on(lockfsm.OpRelease, 7)}, sessions, true},
		{"release another's", api1, []lockfsm.Command{on(lockfsm.OpRelease, 8)}, sessions, false},
		{"cancel another's", api1, []lockfsm.Command{on(lockfsm.OpCancel, 8)}, sessions, false},
		{"close another's", api2, []lockfsm.Command{on(lockfsm.OpCloseSession, 7)}, sessions, false},
		{"acquire in another's", mallory, []lockfsm.Command{on(lockfsm.OpAcquire, 7)}, sessions, false},
		{"release another's, anonymous", anon, []lockfsm.Command{on(lockfsm.OpRelease, 8)}, sessions, true},
		{"unknown session: the state machine answers", api1, []lockfsm.Command{on(lockfsm.OpRelease, 99)}, sessions, true},
		{"own release batched with another's", api1, []lockfsm.Command{on(lockfsm.OpRelease, 7), on(lockfsm.OpRelease, 8)}, sessions, false},
	} {
		check(t, tc.name, Commands(tc.caller, tc.cmds, tc.s), tc.allowed)
	}
}

// counting claims owned sessions of each owner, and counts the reads.
type counting struct{ owned, reads int }

func (c *counting) Owner(uint64) (string, bool) { return "", false }
func (c *counting) Count(string) (total, owned int) {
	c.reads++
	return 100, c.owned
}
func (c *counting) Capped() bool { return false }

// A proposal's opens are counted against one read per owner, not one
// per open: the flood of the review (4,096 opens in one RPC) costs as
// many reads as it names owners, and is refused at the owner's limit.
func TestCommandsReadCountsOncePerOwner(t *testing.T) {
	var cmds []lockfsm.Command
	for i := range lockfsm.MaxBatch {
		cmds = append(cmds, lockfsm.Command{Op: lockfsm.OpOpenSession, Owner: []string{"x", "y"}[i%2], TTLMillis: 1000})
	}
	perOwner := lockfsm.MaxBatch / 2
	c := &counting{owned: MaxSessionsPerOwner - perOwner}
	check(t, "opens up to the owners' limits", Commands(anon, cmds, c), true)
	if c.reads != 2 {
		t.Fatalf("%d reads of the counts for two owners, want 2", c.reads)
	}
	c = &counting{owned: MaxSessionsPerOwner - perOwner + 1}
	check(t, "an open past the owner's limit", Commands(anon, cmds, c), false)
	if c.reads != 2 {
		t.Fatalf("%d reads of the counts for two owners, want 2", c.reads)
	}
}

func TestKeepAlive(t *testing.T) {
	sessions := table{7: "api-1", 8: "api-2"}
	check(t, "own sessions", KeepAlive(api1, []uint64{7, 99}, sessions), true)
	check(t, "another's session", KeepAlive(api1, []uint64{7, 8}, sessions), false)
	check(t, "anonymous", KeepAlive(anon, []uint64{7, 8}, sessions), true)
}

func TestKnown(t *testing.T) {
	v := View{Peers: []string{"api-1", "api-2"}, Gossip: func(n string) bool { return n == "joiner" }}
	check(t, "layout peer", Known(api1, v), true)
	check(t, "gossip member", Known(Caller{Names: []string{"x", "joiner"}}, v), true)
	check(t, "a certificate of the CA for another name", Known(mallory, v), false)
	check(t, "anonymous", Known(anon, v), true)
	check(t, "no gossip view", Known(mallory, View{Peers: v.Peers}), false)
	check(t, "empty name never matches", Known(Caller{Names: []string{""}}, View{Peers: []string{""}}), false)
}

func testLayout() *layout.Placement {
	return layout.New(9, 4, 2, layout.KeySchemeHashTag, []layout.Peer{
		{Name: "api-1", NodeHostID: "h1"}, {Name: "api-2", NodeHostID: "h2"}, {Name: "api-3", NodeHostID: "h3"},
	})
}

func TestMetaMemberAndShardHost(t *testing.T) {
	p := testLayout()
	hosts := p.HostNames(layout.MetaShard)
	var outside Caller
	for _, pe := range p.Peers {
		if !p.Hosts(layout.MetaShard, pe.Name) {
			outside = Caller{Names: []string{pe.Name}}
		}
	}
	inside := Caller{Names: []string{hosts[0]}}
	check(t, "meta host", MetaMember(inside, hosts, "config change"), true)
	check(t, "member without a meta replica", MetaMember(outside, hosts, "config change"), false)
	check(t, "non-member", MetaMember(mallory, hosts, "config change"), false)
	check(t, "anonymous", MetaMember(anon, hosts, "config change"), true)
	check(t, "shard host notice", ShardHost(inside, layout.MetaShard, hosts, "grant notice"), true)
	check(t, "notice from a non-host", ShardHost(outside, layout.MetaShard, hosts, "grant notice"), false)
}

func TestLayoutChange(t *testing.T) {
	cur := testLayout()
	var nonMeta string
	for _, pe := range cur.Peers {
		if !cur.Hosts(layout.MetaShard, pe.Name) {
			nonMeta = pe.Name
		}
	}
	metaHost := cur.HostNames(layout.MetaShard)[0]
	drain := func(name string) *layout.Placement {
		q := cur.Next()
		for i := range q.Peers {
			if q.Peers[i].Name == name {
				q.Peers[i].Draining = true
			}
		}
		return q
	}
	shrunk := cur.Next()
	shrunk.Peers = shrunk.Peers[:1] // the forged layout that deleted replicas
	drainAndMore := drain(nonMeta)
	drainAndMore.NextReplicaID += 5
	drainTwo := drain(nonMeta)
	for i := range drainTwo.Peers {
		drainTwo.Peers[i].Draining = true
	}

	for _, tc := range []struct {
		name    string
		caller  Caller
		next    *layout.Placement
		allowed bool
	}{
		{"meta host writes any successor", Caller{Names: []string{metaHost}}, shrunk, true},
		{"member shrinks the layout", Caller{Names: []string{nonMeta}}, shrunk, false},
		{"non-member shrinks the layout", mallory, shrunk, false},
		{"member marks itself draining", Caller{Names: []string{nonMeta}}, drain(nonMeta), true},
		{"member marks another draining", Caller{Names: []string{nonMeta}}, drain(metaHost), false},
		{"member marks itself draining and changes more", Caller{Names: []string{nonMeta}}, drainAndMore, false},
		{"member marks every peer draining", Caller{Names: []string{nonMeta}}, drainTwo, false},
		{"anonymous", anon, shrunk, true},
	} {
		check(t, tc.name, LayoutChange(tc.caller, cur, tc.next), tc.allowed)
	}
}

func TestBootstrap(t *testing.T) {
	plan := testLayout()
	check(t, "founder", BootstrapCall(api1, plan, "commit"), true)
	check(t, "stranger", BootstrapCall(mallory, plan, "commit"), false)
	check(t, "anonymous", BootstrapCall(anon, plan, "abort"), true)

	raw, err := layout.Encode(plan)
	if err != nil {
		t.Fatal(err)
	}
	other := testLayout()
	other.ClusterID++
	rawOther, _ := layout.Encode(other)
	check(t, "commit of the promised plan", BootstrapCommit(raw, raw), true)
	check(t, "commit without a promise (a joiner)", BootstrapCommit(nil, raw), false)
	check(t, "commit of another plan", BootstrapCommit(raw, rawOther), false)
}

// Rule 7 on a prepare: who may make a peer promise a plan. plan's
// coordinator is api-1 (first by name); gossip is what the accepting peer
// sees, the founders free to found a cluster.
func TestBootstrapPrepare(t *testing.T) {
	plan := testLayout()
	captured := layout.New(9, 4, 2, layout.KeySchemeHashTag, []layout.Peer{
		{Name: "api-1", NodeHostID: "h1"}, {Name: "mallory", NodeHostID: "hm"},
	})
	unsorted := testLayout()
	unsorted.Peers[0], unsorted.Peers[2] = unsorted.Peers[2], unsorted.Peers[0]
	all := map[string]string{"api-1": "h1", "api-2": "h2", "api-3": "h3"}
	gossip := func(free map[string]string) func(layout.Peer) bool {
		return func(pe layout.Peer) bool { id, ok := free[pe.Name]; return ok && id == pe.NodeHostID }
	}
	for _, tc := range []struct {
		what    string
		c       Caller
		founder bool
		plan    *layout.Placement
		free    map[string]string
		allowed bool
	}{
		{"the coordinator to a founder", api1, true, plan, all, true},
		{"anonymous, the coordinator alive", anon, true, plan, all, true},
		{"anything to a joiner", api1, false, plan, all, false},
		{"anonymous to a joiner", anon, false, plan, all, false},
		{"a founder that does not coordinate", api2, true, plan, all, false},
		{"a stranger listing itself as a founder", mallory, true, captured, all, false},
		{"a stranger listing itself as the coordinator", mallory, true, layout.New(9, 4, 2, layout.KeySchemeHashTag, []layout.Peer{{Name: "api-9"}, {Name: "mallory"}}), all, false},
		{"the coordinator not alive in gossip", api1, true, plan, map[string]string{"api-2": "h2", "api-3": "h3"}, false},
		{"anonymous, the coordinator not alive in gossip", anon, true, plan, map[string]string{"api-2": "h2"}, false},
		{"the coordinator gossiping another NodeHostID", api1, true, plan, map[string]string{"api-1": "h9"}, false},
		{"anonymous, a stranger coordinating", anon, true, layout.New(9, 4, 2, layout.KeySchemeHashTag, []layout.Peer{{Name: "api-2", NodeHostID: "h2"}, {Name: "a-mallory", NodeHostID: "hm"}}), all, false},
		{"peers out of order: the first by name coordinates", api1, true, unsorted, all, true},
		{"peers out of order: not the first listed", api3, true, unsorted, all, false},
		{"no gossip", api1, true, plan, nil, false},
		{"a plan of no founders", anon, true, &layout.Placement{ClusterID: 9}, all, false},
	} {
		var free func(layout.Peer) bool
		if tc.free != nil {
			free = gossip(tc.free)
		}
		check(t, tc.what, BootstrapPrepare(tc.c, tc.founder, tc.plan, free), tc.allowed)
	}
}
