package node

import (
	"slices"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/mesh"
)

// Members lists the peers gossip sees, and the layout's peers it does not
// see as not Alive, so a dead peer does not vanish from the list while the
// cluster still counts it.
func TestListMembers(t *testing.T) {
	live := func(name string, cluster uint64) mesh.Member {
		return mesh.Member{
			Name: name, Addr: name + ":1", State: mesh.StateAlive,
			Meta: mesh.Meta{RaftAddr: name + ":2", RPCAddr: name + ":3", Cluster: cluster},
		}
	}
	up := func(name string, cluster uint64) Member {
		return Member{Name: name, GossipAddr: name + ":1", RaftAddr: name + ":2", RPCAddr: name + ":3", Alive: true, Cluster: cluster}
	}
	for _, c := range []struct {
		name   string
		seen   []mesh.Member
		layout []string
		want   []Member
	}{{
		name: "no layout yet: gossip only",
		seen: []mesh.Member{live("a", 0), live("b", 0)},
		want: []Member{up("a", 0), up("b", 0)},
	}, {
		name:   "a layout peer gossip does not see is not Alive",
		seen:   []mesh.Member{live("c", 7), live("a", 7)},
		layout: []string{"a", "b", "c"},
		want:   []Member{up("a", 7), {Name: "b", Cluster: 7}, up("c", 7)},
	}, {
		name:   "a client-only or joining peer outside the layout is listed as gossip sees it",
		seen:   []mesh.Member{live("a", 7), live("client", 7), live("new", 0)},
		layout: []string{"a"},
		want:   []Member{up("a", 7), up("client", 7), up("new", 0)},
	}, {
		name:   "a member gossip reports in another state is not Alive",
		seen:   []mesh.Member{live("a", 7), {Name: "b", Addr: "b:1", State: mesh.StateSuspect, Meta: mesh.Meta{Cluster: 7}}},
		layout: []string{"a", "b"},
		want:   []Member{up("a", 7), {Name: "b", GossipAddr: "b:1", Cluster: 7}},
	}} {
		if got := listMembers(c.seen, c.layout, 7); !slices.Equal(got, c.want) {
			t.Errorf("%s:\n got %+v\nwant %+v", c.name, got, c.want)
		}
	}
}

// A crashed peer of the layout is listed not Alive by the survivors, with
// its name and cluster, instead of vanishing from Members.
func TestMembersListsCrashedPeerNotAlive(t *testing.T) {
	fc := startFaultCluster(t, faultOpts{peers: 3, shards: 2})
	victim, survivor := fc.peers[2], fc.peers[0]
	cluster := survivor.node().peer.Placement().ClusterID
	fc.kill(victim)

	var got []Member
	deadline := time.Now().Add(20 * time.Second)
	for {
		got = survivor.node().Members()
		if len(got) == 3 && got[2].Name == victim.name && !got[2].Alive {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("20s after %s crashed, %s lists %+v", victim.name, survivor.name, got)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if want := (Member{Name: victim.name, Cluster: cluster}); got[2] != want {
		t.Errorf("crashed peer listed as %+v, want %+v", got[2], want)
	}
	for _, m := range got[:2] {
		if !m.Alive || m.RPCAddr == "" || m.Cluster != cluster {
			t.Errorf("live peer listed as %+v", m)
		}
	}
}
