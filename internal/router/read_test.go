package router

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lni/dragonboat/v4"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/lockerr"
	"github.com/lockmesh/lockmesh/internal/replica"
)

const readMethod = 7

// A peer hosting the shard reads through its own replica; one hosting
// none asks the leader it knows with a ReadRequest carrying its level,
// and moves on to another host when that one has no replica.
func TestReadLocalOrThroughAHost(t *testing.T) {
	q := replica.Query{Kind: replica.QueryKey, Key: "k"}
	local := &fakeHost{p: threePeers(), hosted: true, read: func(_ context.Context, s uint64, got replica.Query) (replica.Answer, error) {
		if s != shard || got != q {
			return replica.Answer{}, fmt.Errorf("read %d %+v", s, got)
		}
		return replica.Answer{KeyFound: true, Term: 4}, nil
	}}
	r := New(Config{Name: "a", RTT: time.Millisecond, Peers: &fakePeers{}, ReadMethod: readMethod}, local)
	defer r.Close()
	if a, err := r.Read(context.Background(), shard, q); err != nil || !a.KeyFound || a.Term != 4 {
		t.Fatalf("local read: %+v, %v", a, err)
	}

	p := threePeers()
	p.Peers = append(p.Peers, layout.Peer{Name: "d"}) // d, this peer here, hosts nothing
	peers := &fakePeers{f: func(addr string, body []byte) ([]byte, error) {
		var req ReadRequest
		if err := msgpack.Unmarshal(body, &req); err != nil {
			return nil, err
		}
		if req.Shard != shard || req.Query != q || req.Level != 2 {
			return nil, fmt.Errorf("%s got %+v", addr, req)
		}
		if addr == "addr-b" {
			return nil, lockerr.RPC(lockerr.CodeNotHosted, "b hosts no replica")
		}
		return msgpack.Marshal(replica.Answer{KeyFound: true, Term: 5})
	}}
	r = New(Config{Name: "d", RTT: time.Millisecond, Peers: peers, ReadMethod: readMethod}, &fakeHost{p: p})
	defer r.Close()
	r.SetLeader(shard, "b")
	a, err := r.Read(context.Background(), shard, q)
	if err != nil || !a.KeyFound || a.Term != 5 {
		t.Fatalf("remote read: %+v, %v", a, err)
	}
	if calls := peers.called(); len(calls) != 2 || calls[0] != "addr-b" || calls[1] == "addr-b" {
		t.Fatalf("calls %v, want b (the leader it knows), then another host", calls)
	}
}

// ReadRetrying tries again while the error says "not now", and stops at
// once on any other error or when ctx ends, saying what the last try hit.
func TestReadRetrying(t *testing.T) {
	var tries atomic.Int32
	h := &fakeHost{p: threePeers(), hosted: true, read: func(context.Context, uint64, replica.Query) (replica.Answer, error) {
		if tries.Add(1) < 3 {
			return replica.Answer{}, dragonboat.ErrShardNotReady
		}
		return replica.Answer{Term: 9}, nil
	}}
	r := New(Config{Name: "a", RTT: time.Millisecond, Peers: &fakePeers{}, ReadMethod: readMethod}, h)
	defer r.Close()
	if a, err := r.ReadRetrying(context.Background(), shard, replica.Query{}); err != nil || a.Term != 9 || tries.Load() != 3 {
		t.Fatalf("ReadRetrying = %+v, %v after %d tries; want the third try's answer", a, err, tries.Load())
	}

	refused := errors.New("refused")
	h.read = func(context.Context, uint64, replica.Query) (replica.Answer, error) {
		tries.Add(1)
		return replica.Answer{}, refused
	}
	tries.Store(0)
	if _, err := r.ReadRetrying(context.Background(), shard, replica.Query{}); !errors.Is(err, refused) || tries.Load() != 1 {
		t.Fatalf("ReadRetrying of a refusal = %v after %d tries; want it at once", err, tries.Load())
	}

	h.read = func(context.Context, uint64, replica.Query) (replica.Answer, error) {
		return replica.Answer{}, dragonboat.ErrShardNotReady
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err := r.ReadRetrying(ctx, shard, replica.Query{})
	if !errors.Is(err, lockerr.Unavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ReadRetrying until ctx ends = %v; want ErrUnavailable and the deadline", err)
	}
}

// ServeRead answers only for a shard this peer hosts, and turns a "not
// now" into CodeBusy so the caller retries elsewhere or later.
func TestServeRead(t *testing.T) {
	h := &fakeHost{p: threePeers(), read: func(context.Context, uint64, replica.Query) (replica.Answer, error) {
		return replica.Answer{}, dragonboat.ErrShardNotReady
	}}
	r := New(Config{Name: "a", RTT: time.Millisecond, Peers: &fakePeers{}, ReadMethod: readMethod}, h)
	defer r.Close()
	req := ReadRequest{Shard: shard, Query: replica.Query{Kind: replica.QueryKey, Key: "k"}}
	if _, err := r.ServeRead(context.Background(), req); lockerr.Code(err) != lockerr.CodeNotHosted {
		t.Fatalf("ServeRead without a replica = %v, want CodeNotHosted", err)
	}
	h.hosted = true
	if _, err := r.ServeRead(context.Background(), req); lockerr.Code(err) != lockerr.CodeBusy {
		t.Fatalf("ServeRead of a shard not ready = %v, want CodeBusy", err)
	}
	refused := errors.New("refused")
	h.read = func(context.Context, uint64, replica.Query) (replica.Answer, error) { return replica.Answer{}, refused }
	if _, err := r.ServeRead(context.Background(), req); !errors.Is(err, refused) || lockerr.Code(err) != 0 {
		t.Fatalf("ServeRead of another error = %v, want it as it is", err)
	}
	h.read = func(_ context.Context, _ uint64, q replica.Query) (replica.Answer, error) {
		return replica.Answer{KeyFound: q.Key == "k"}, nil
	}
	if a, err := r.ServeRead(context.Background(), req); err != nil || !a.KeyFound {
		t.Fatalf("ServeRead = %+v, %v", a, err)
	}
}
