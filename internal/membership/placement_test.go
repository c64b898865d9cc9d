package membership

import (
	"bytes"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/lockmesh/lockmesh/internal/layout"
)

// twoShards is a layout of the meta shard and one lock shard (2) over
// peers a and b, with RF 2 and replica ids 1-4.
func twoShards() *layout.Placement {
	return &layout.Placement{
		Epoch: 3, ClusterID: 7, Shards: 1, RF: 2,
		Peers: []layout.Peer{{Name: "a", NodeHostID: "nh-a"}, {Name: "b", NodeHostID: "nh-b"}},
		Replicas: map[uint64][]layout.Replica{
			layout.MetaShard: {{ID: 1, Peer: "a"}, {ID: 2, Peer: "b"}},
			2:                {{ID: 3, Peer: "a"}, {ID: 4, Peer: "b"}},
		},
		NextReplicaID: 5,
	}
}

func TestSupersedes(t *testing.T) {
	cur := twoShards()
	for _, tc := range []struct {
		name       string
		epoch, cid uint64
		want       bool
	}{
		{"the next epoch", 4, 7, true},
		{"a later epoch", 9, 7, true},
		{"the same epoch", 3, 7, false},
		{"an older epoch", 2, 7, false},
		{"another cluster's later epoch", 4, 8, false},
	} {
		q := cur.Clone()
		q.Epoch, q.ClusterID = tc.epoch, tc.cid
		if got := supersedes(q, cur); got != tc.want {
			t.Errorf("%s: supersedes %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestReplicaSteps(t *testing.T) {
	start := func(shard, id uint64) replicaStep {
		return replicaStep{shard: shard, start: true, replica: layout.Replica{ID: id, Peer: "a"}}
	}
	stop := func(shard uint64) replicaStep { return replicaStep{shard: shard} }
	for _, tc := range []struct {
		name    string
		running map[uint64]uint64 // shard -> id a runs
		edit    func(q *layout.Placement)
		want    []replicaStep
	}{
		{name: "in line", running: map[uint64]uint64{1: 1, 2: 3}},
		{name: "a new peer starts every replica listed, in shard order", running: map[uint64]uint64{},
			want: []replicaStep{start(1, 1), start(2, 3)}},
		{name: "a replica moved away stops", running: map[uint64]uint64{1: 1, 2: 3},
			edit: func(q *layout.Placement) { q.Replicas[2] = []layout.Replica{{ID: 4, Peer: "b"}, {ID: 5, Peer: "c"}} },
			want: []replicaStep{stop(2)}},
		{name: "a replica listed under a new id stops; the next layout starts it",
			running: map[uint64]uint64{1: 1, 2: 3},
			edit:    func(q *layout.Placement) { q.Replicas[2] = []layout.Replica{{ID: 6, Peer: "a"}, {ID: 4, Peer: "b"}} },
			want:    []replicaStep{stop(2)}},
		{name: "a peer no longer listed stops everything", running: map[uint64]uint64{1: 1, 2: 3},
			edit: func(q *layout.Placement) {
				q.Peers = q.Peers[1:]
				q.Replicas[1] = q.Replicas[1][1:]
				q.Replicas[2] = q.Replicas[2][1:]
			},
			want: []replicaStep{stop(1), stop(2)}},
		{name: "a replica of a shard the layout does not have stays", running: map[uint64]uint64{1: 1, 2: 3, 9: 8}},
	} {
		q := twoShards()
		if tc.edit != nil {
			tc.edit(q)
		}
		local := func(shard uint64) (uint64, bool) {
			id, ok := tc.running[shard]
			return id, ok
		}
		if got := replicaSteps(q, "a", local); !slices.Equal(got, tc.want) {
			t.Errorf("%s: steps %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

func TestDrainStep(t *testing.T) {
	p := twoShards()
	done, mark := drainStep(p, "a")
	if done || mark == nil {
		t.Fatalf("a peer with replicas, not draining: done %v, mark %v; want a layout marking it", done, mark)
	}
	if mark.Epoch != p.Epoch+1 {
		t.Errorf("mark has epoch %d, want the successor %d", mark.Epoch, p.Epoch+1)
	}
	for _, pe := range mark.Peers {
		if pe.Draining != (pe.Name == "a") {
			t.Errorf("mark: peer %s draining %v", pe.Name, pe.Draining)
		}
	}
	if pe, _ := p.Peer("a"); pe.Draining {
		t.Error("drainStep changed the layout it was given")
	}

	done, mark = drainStep(mark, "a")
	if done || mark != nil {
		t.Errorf("a draining peer with replicas: done %v, mark %v; want to wait", done, mark)
	}

	moved := p.Clone()
	moved.Replicas[1] = moved.Replicas[1][1:]
	moved.Replicas[2] = moved.Replicas[2][1:]
	if done, mark = drainStep(moved, "a"); !done || mark != nil {
		t.Errorf("a listed peer without replicas: done %v, mark %v; want done", done, mark)
	}
	if done, mark = drainStep(p, "z"); !done || mark != nil {
		t.Errorf("a peer the layout does not list: done %v, mark %v; want done", done, mark)
	}
}

func TestNoteShortfall(t *testing.T) {
	full := twoShards()
	short := func(shards ...uint64) *layout.Placement {
		q := full.Clone()
		for _, s := range shards {
			q.Replicas[s] = q.Replicas[s][:1]
		}
		return q
	}
	const warn, info = "fewer replicas than the replication factor", "has its replication factor again"
	for _, tc := range []struct {
		name   string
		old, q *layout.Placement
		want   string // a substring of the one line logged; "" for none
	}{
		{"first layout, full", nil, full, ""},
		{"first layout, short", nil, short(2), warn},
		{"still full", full, full, ""},
		{"becomes short", full, short(2), warn},
		{"as short as before", short(2), short(1), ""},
		{"shorter", short(2), short(1, 2), warn},
		{"less short", short(1, 2), short(2), warn},
		{"full again", short(2), full, info},
	} {
		var buf bytes.Buffer
		NoteShortfall(slog.New(slog.NewTextHandler(&buf, nil)), tc.old, tc.q)
		out := buf.String()
		switch {
		case tc.want == "" && out != "":
			t.Errorf("%s: logged %q, want nothing", tc.name, out)
		case tc.want != "" && (!strings.Contains(out, tc.want) || strings.Count(out, "\n") != 1):
			t.Errorf("%s: logged %q, want one line saying %q", tc.name, out, tc.want)
		}
	}
}
