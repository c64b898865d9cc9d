package router

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/transport"
)

// keepAlivePeers answers keepalives by address: each peer's answer, or an
// unreachable peer.
func keepAlivePeers(t *testing.T, answers map[string]KeepAliveResponse) *fakePeers {
	return &fakePeers{f: func(addr string, body []byte) ([]byte, error) {
		var req KeepAliveRequest
		if err := msgpack.Unmarshal(body, &req); err != nil {
			return nil, err
		}
		if req.Shard != shard || !slices.Equal(req.Sessions, []uint64{1, 2}) {
			t.Errorf("%s got keepalive %+v, want shard %d sessions [1 2]", addr, req, shard)
		}
		resp, ok := answers[addr]
		if !ok {
			return nil, fmt.Errorf("dial %s: %w", addr, transport.ErrUnavailable)
		}
		return msgpack.Marshal(resp)
	}}
}

// A peer hosting no replica sends its keepalive to the leader it knows,
// follows a not-leader hint, and learns the leader from the peer that
// acknowledges.
func TestKeepAliveFollowsTheLeaderHint(t *testing.T) {
	p := threePeers()
	p.Peers = append(p.Peers, layout.Peer{Name: "d"}) // d, this peer here, hosts nothing
	peers := keepAlivePeers(t, map[string]KeepAliveResponse{
		"addr-b": {Leader: "c"},
		"addr-c": {Expired: []uint64{2}},
	})
	r := New(Config{Name: "d", RTT: time.Millisecond, Peers: peers, KeepAliveMethod: 3}, &fakeHost{p: p})
	defer r.Close()
	r.SetLeader(shard, "b")
	expired, err := r.KeepAlive(context.Background(), shard, []uint64{1, 2})
	if err != nil || !slices.Equal(expired, []uint64{2}) {
		t.Fatalf("KeepAlive = %v, %v; want session 2 expired", expired, err)
	}
	if calls := peers.called(); !slices.Equal(calls, []string{"addr-b", "addr-c"}) {
		t.Fatalf("calls %v, want b, then c as b's hint", calls)
	}
	if got := r.Leader(shard); got != "c" {
		t.Fatalf("leader after the acknowledgement = %q, want c", got)
	}
}

// A leader that does not answer is forgotten, and the next round goes to
// another replica: a crashed leader must not keep keepalives from the new
// one.
func TestKeepAliveMovesOnFromAnUnreachableLeader(t *testing.T) {
	p := threePeers()
	p.Peers = append(p.Peers, layout.Peer{Name: "d"})
	peers := keepAlivePeers(t, map[string]KeepAliveResponse{
		"addr-a": {Expired: nil},
		"addr-c": {Expired: nil},
	})
	r := New(Config{Name: "d", RTT: time.Millisecond, Peers: peers, KeepAliveMethod: 3}, &fakeHost{p: p})
	defer r.Close()
	r.SetLeader(shard, "b")
	if _, err := r.KeepAlive(context.Background(), shard, []uint64{1, 2}); err != nil {
		t.Fatal(err)
	}
	calls := peers.called()
	if len(calls) != 2 || calls[0] != "addr-b" || calls[1] == "addr-b" {
		t.Fatalf("calls %v, want b, then another replica", calls)
	}
	if got, want := r.Leader(shard), calls[1][len("addr-"):]; got != want {
		t.Fatalf("leader = %q, want %q, the replica that acknowledged", got, want)
	}
}

// A keepalive to this peer itself is served by its host, without an RPC.
func TestKeepAliveToItselfIsServedLocally(t *testing.T) {
	p := threePeers()
	a, _ := p.ReplicaID(shard, "a")
	var served []KeepAliveRequest
	h := &fakeHost{p: p, hosted: true, leader: a, keepAlive: func(_ context.Context, req KeepAliveRequest) (KeepAliveResponse, error) {
		served = append(served, req)
		return KeepAliveResponse{Expired: []uint64{1}}, nil
	}}
	peers := keepAlivePeers(t, nil)
	r := newTestRouter(t, h, peers)
	expired, err := r.KeepAlive(context.Background(), shard, []uint64{1, 2})
	if err != nil || !slices.Equal(expired, []uint64{1}) {
		t.Fatalf("KeepAlive = %v, %v; want session 1 expired", expired, err)
	}
	if len(served) != 1 || len(peers.called()) != 0 {
		t.Fatalf("served locally %d times, RPCs %v; want one local keepalive and no RPC", len(served), peers.called())
	}
}

func TestOtherReplica(t *testing.T) {
	p := threePeers() // a, b and c host every shard
	solo := layout.New(1, 2, 1, layout.KeySchemeHashTag, []layout.Peer{{Name: "a"}})
	for _, c := range []struct {
		name    string
		p       *layout.Placement
		avoid   string
		attempt int
		want    string
	}{
		{"no layout", nil, "", 0, ""},
		{"first host", p, "", 0, "a"},
		{"rotates with the attempt", p, "", 1, "b"},
		{"wraps around", p, "", 3, "a"},
		{"skips the avoided host", p, "a", 0, "b"},
		{"rotates past the avoided host", p, "b", 1, "c"},
		{"only the avoided host is left", solo, "a", 2, "a"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newTestRouter(t, &fakeHost{p: c.p}, nil)
			if got := r.otherReplica(shard, c.avoid, c.attempt); got != c.want {
				t.Fatalf("otherReplica(avoid %q, attempt %d) = %q, want %q", c.avoid, c.attempt, got, c.want)
			}
		})
	}
}
