package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/lockmesh/lockmesh/transport"
)

// Two methods of lockmesh's peer-to-peer RPC (node/rpc.go), asked from
// outside the peers: the controller's own catch-up check, which answers
// once the peer's replica of a shard serves a linearizable read
// (dragonboat's ReadIndex through that replica: it is a member and has
// applied everything the leader had committed when asked), and the status
// call that lists the replicas a peer runs. Their numbers and bodies are
// wire protocol that a mixed cluster relies on, the same at
// release.Previous (fc10b2a) as in this tree: `git show
// fc10b2a:node/rpc.go` and node/membership.go (shardReq, statusResp),
// which are internal/membership's ShardRequest and PeerStatus in this tree.
const (
	rpcMethodStatus   uint8 = 9  // node.methodStatus: -> statusResp
	rpcMethodCaughtUp uint8 = 12 // node.methodCaughtUp: shardReq -> nothing, or an error
)

// rpcShardReq and rpcStatusResp are membership.ShardRequest and
// membership.PeerStatus (node's shardReq and statusResp at fc10b2a).
type rpcShardReq struct {
	Shard uint64 `msgpack:"s"`
}

type rpcStatusResp struct {
	Replicas map[uint64]uint64 `msgpack:"r"` // shard -> local replica id
}

// replicaProbe asks peers, over lockmesh's RPC, whether their replicas are
// caught up.
type replicaProbe struct {
	client *transport.Client
}

func newReplicaProbe(t *testing.T) *replicaProbe {
	t.Helper()
	cl, err := transport.NewClient(transport.Config{DialTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	return &replicaProbe{client: cl}
}

// running returns the shards the peer at addr runs a replica of.
func (r *replicaProbe) running(ctx context.Context, addr string) ([]uint64, error) {
	raw, err := r.client.Call(ctx, addr, rpcMethodStatus, nil)
	if err != nil {
		return nil, err
	}
	var st rpcStatusResp
	if err := msgpack.Unmarshal(raw, &st); err != nil {
		return nil, fmt.Errorf("status of %s: %w", addr, err)
	}
	var shards []uint64
	for s := range st.Replicas {
		shards = append(shards, s)
	}
	slices.Sort(shards)
	return shards, nil
}

// caughtUp returns nil once the peer at addr says its replica of shard
// serves a linearizable read, or what it said instead.
func (r *replicaProbe) caughtUp(ctx context.Context, addr string, shard uint64) error {
	body, err := msgpack.Marshal(rpcShardReq{Shard: shard})
	if err != nil {
		return err
	}
	_, err = r.client.Call(ctx, addr, rpcMethodCaughtUp, body)
	return err
}

// replicaState is what one round of asking a peer found: per shard of
// want, nil if its replica there is caught up, else why not.
type replicaState map[uint64]error

func (s replicaState) ok() bool {
	for _, err := range s {
		if err != nil {
			return false
		}
	}
	return len(s) > 0
}

func (s replicaState) String() string {
	var shards []uint64
	for sh := range s {
		shards = append(shards, sh)
	}
	sort.Slice(shards, func(i, j int) bool { return shards[i] < shards[j] })
	var parts []string
	for _, sh := range shards {
		if err := s[sh]; err != nil {
			parts = append(parts, fmt.Sprintf("%d:%v", sh, err))
		} else {
			parts = append(parts, fmt.Sprintf("%d:ok", sh))
		}
	}
	return strings.Join(parts, " ")
}

// state asks the peer at addr, each within timeout and all at once,
// whether its replicas of want are caught up; a shard it does not run is
// reported so.
func (r *replicaProbe) state(addr string, want []uint64, timeout time.Duration) replicaState {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	st := replicaState{}
	runs, err := r.running(ctx, addr)
	if err != nil {
		for _, sh := range want {
			st[sh] = fmt.Errorf("status: %w", err)
		}
		return st
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, sh := range want {
		if !slices.Contains(runs, sh) {
			st[sh] = errors.New("no replica running")
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := r.caughtUp(ctx, addr, sh)
			mu.Lock()
			st[sh] = err
			mu.Unlock()
		}()
	}
	wg.Wait()
	return st
}
