package mesh_test

import (
	"context"
	"fmt"
	"time"

	"github.com/lockmesh/lockmesh/mesh"
)

// Two peers on loopback: b joins through a's gossip address and both see
// each other's metadata.
func ExampleCreate() {
	a, err := mesh.Create(mesh.Config{
		Name:     "a",
		BindAddr: "127.0.0.1:0",
		Local:    true,
		Meta:     mesh.Meta{NodeHostID: "nh-a", RaftAddr: "127.0.0.1:7001", MaxLevel: 1},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer a.Close()
	b, err := mesh.Create(mesh.Config{
		Name:     "b",
		BindAddr: "127.0.0.1:0",
		Local:    true,
		Meta:     mesh.Meta{NodeHostID: "nh-b", RaftAddr: "127.0.0.1:7002", MaxLevel: 1},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := b.Join(ctx, []string{a.Addr()}); err != nil {
		fmt.Println(err)
		return
	}
	// The join exchanged full state, so b already knows a.
	for _, m := range b.Members() {
		fmt.Println(m.Name, m.Meta.RaftAddr, m.State)
	}
	// Output:
	// a 127.0.0.1:7001 alive
	// b 127.0.0.1:7002 alive
}

func ExampleReplicas() {
	peers := []string{"api-1", "api-2", "api-3", "api-4", "api-5"}
	for shard := uint64(1); shard <= 3; shard++ {
		fmt.Println(shard, mesh.Replicas(shard, peers, 3))
	}
	// Output:
	// 1 [api-3 api-1 api-2]
	// 2 [api-4 api-5 api-3]
	// 3 [api-1 api-3 api-5]
}

func ExampleEncodeMeta() {
	b, err := mesh.EncodeMeta(mesh.Meta{NodeHostID: "nh-1", RaftAddr: "10.0.0.5:7947", RPCAddr: "10.0.0.5:7948", MaxLevel: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	m, err := mesh.DecodeMeta(b)
	fmt.Println(len(b) <= mesh.MaxMetaSize, m.RaftAddr, err)
	// Output: true 10.0.0.5:7947 <nil>
}

func ExampleNewRegistry() {
	addrs := map[string]string{"nh-1": "10.0.0.5:7947"}
	r := mesh.NewRegistry(func(id string) (string, bool) {
		a, ok := addrs[id]
		return a, ok
	})
	r.Add(1, 1, "nh-1")
	addr, _, err := r.Resolve(1, 1)
	fmt.Println(addr, err)
	_, _, err = r.Resolve(1, 2)
	fmt.Println(err)
	// Output:
	// 10.0.0.5:7947 <nil>
	// mesh: unknown raft target: shard 1 replica 2 is not registered
}
