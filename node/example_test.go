package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"time"

	"github.com/lockmesh/lockmesh/node"
)

// A single-peer cluster, for the examples to run. Production clusters have
// three or more peers with a replication factor of three.
func startExamplePeer() (*node.Node, func()) {
	dir, err := os.MkdirTemp("", "lockmesh-example-")
	if err != nil {
		log.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	raft := l.Addr().String()
	l.Close()
	n, err := node.Start(context.Background(), node.Config{
		Name:              "example",
		DataDir:           dir,
		GossipAddr:        "127.0.0.1:0",
		RaftAddr:          raft,
		RPCAddr:           "127.0.0.1:0",
		BootstrapExpect:   1,
		ReplicationFactor: 1,
		Shards:            2,
		RTT:               10 * time.Millisecond, // one machine: elect in ~0.1s, not ~1s
	})
	if err != nil {
		log.Fatal(err)
	}
	<-n.Ready()
	return n, func() { n.Close(); os.RemoveAll(dir) }
}

func ExampleNode_Lock() {
	n, stop := startExamplePeer()
	defer stop()
	ctx := context.Background()

	l, err := n.Lock(ctx, "invoice/42")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Unlock(ctx)
	select {
	case <-l.Done():
		fmt.Println("lease lost:", l.Err())
	default:
		fmt.Println("holding", l.Key(), "with token", l.Token())
	}
	// Output: holding invoice/42 with token 1
}

func ExampleNode_TryLock() {
	n, stop := startExamplePeer()
	defer stop()
	ctx := context.Background()

	l, err := n.TryLock(ctx, "report")
	if err != nil {
		log.Fatal(err)
	}
	_, err = n.TryLock(ctx, "report")
	fmt.Println(errors.Is(err, node.ErrLocked))
	l.Unlock(ctx)
	// Output: true
}

func ExampleLock_Unlock() {
	n, stop := startExamplePeer()
	defer stop()
	ctx := context.Background()

	l, _ := n.Lock(ctx, "job")
	fmt.Println(l.Unlock(ctx))
	err := l.Unlock(ctx)
	fmt.Println(errors.Is(err, node.ErrNotHeld))
	// Output:
	// <nil>
	// true
}

func ExampleLock_Release() {
	n, stop := startExamplePeer()
	defer stop()
	ctx := context.Background()

	l, _ := n.Lock(ctx, "job")
	fmt.Println(l.Release()) // returns without waiting for the commit
	<-l.Done()               // already closed
	fmt.Println(errors.Is(l.Err(), node.ErrNotHeld))
	l, _ = n.TryLock(ctx, "job") // waits for this node's release, then takes the key
	fmt.Println(l.Token() > 0)
	// Output:
	// <nil>
	// true
	// true
}

func ExampleFence() {
	var storage node.Fence
	fmt.Println(storage.Check("invoice/42", 7)) // the current holder writes
	fmt.Println(storage.Check("invoice/42", 9)) // the next holder writes
	err := storage.Check("invoice/42", 7)       // the old holder wakes up from a pause
	fmt.Println(errors.Is(err, node.ErrStaleToken))
	// Output:
	// <nil>
	// <nil>
	// true
}

func ExampleNode_Inspect() {
	n, stop := startExamplePeer()
	defer stop()
	ctx := context.Background()

	l, _ := n.Lock(ctx, "orders")
	info, err := n.Inspect(ctx, "orders")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(info.Holders), info.Holders[0].Token == l.Token(), len(info.Waiters))
	l.Unlock(ctx)
	// Output: 1 true 0
}

func ExampleNode_Placement() {
	n, stop := startExamplePeer()
	defer stop()

	shards, err := n.Placement(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	for _, s := range shards {
		fmt.Println(s.Shard, s.Meta, s.Replicas)
	}
	fmt.Println(len(n.Members()), n.Members()[0].Alive)
	// Output:
	// 1 true [example]
	// 2 false [example]
	// 3 false [example]
	// 1 true
}

// Keys with one hash tag share a shard; ShardOf says which.
func ExampleNode_ShardOf() {
	n, stop := startExamplePeer()
	defer stop()
	ctx := context.Background()

	items, _ := n.ShardOf(ctx, "{order-42}/items")
	invoice, _ := n.ShardOf(ctx, "{order-42}/invoice")
	fmt.Println(items == invoice)
	// Output: true
}

// Top lists the most contended keys and the longest current holds across
// the cluster; the status page (Handler) shows them too.
func ExampleNode_Top() {
	n, stop := startExamplePeer()
	defer stop()
	ctx := context.Background()

	l, _ := n.Lock(ctx, "reports/daily")
	top, err := n.Top(ctx, 5)
	if err != nil {
		log.Fatal(err)
	}
	h := top.LongestHolds[0]
	fmt.Println(h.Key, h.Peer, h.Token == l.Token())
	l.Unlock(ctx)
	// Output: reports/daily example true
}

// Handler is the status page, mounted like net/http/pprof; its JSON is
// Status, Top and Inspect.
func ExampleNode_Handler() {
	n, stop := startExamplePeer()
	defer stop()

	mux := http.NewServeMux()
	mux.Handle("/debug/lockmesh/", http.StripPrefix("/debug/lockmesh", n.Handler()))
	srv := httptest.NewServer(mux) // serve it on loopback or behind authentication: it shows key names
	defer srv.Close()

	resp, err := http.Get(srv.URL + "/debug/lockmesh/status.json")
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	var status struct {
		Peer   string `json:"peer"`
		Shards []any  `json:"shards"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&status); err != nil {
		log.Fatal(err)
	}
	fmt.Println(resp.StatusCode, status.Peer, len(status.Shards))
	// Output: 200 example 2
}

// An application serving the status page under its own name allows that
// name; the page refuses any other Host that is not loopback, as a web
// page using DNS rebinding would send.
func ExampleWithAllowedHosts() {
	n, stop := startExamplePeer()
	defer stop()

	mux := http.NewServeMux()
	mux.Handle("/debug/lockmesh/", http.StripPrefix("/debug/lockmesh", n.Handler(node.WithAllowedHosts("app-7.ops.example"))))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	for _, host := range []string{"app-7.ops.example", "127.0.0.1", "rebound.evil.example"} {
		req, err := http.NewRequest("GET", srv.URL+"/debug/lockmesh/status.json", nil)
		if err != nil {
			log.Fatal(err)
		}
		req.Host = host // what a browser sends for http://HOST:PORT/
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Println(host, resp.StatusCode)
	}
	// Output:
	// app-7.ops.example 200
	// 127.0.0.1 200
	// rebound.evil.example 421
}

// A Session owns the locks taken through it, on every shard, with a TTL of
// its own; closing it releases them all at once.
func ExampleNode_NewSession() {
	n, stop := startExamplePeer()
	defer stop()
	ctx := context.Background()

	s, err := n.NewSession(ctx, node.WithTTL(30*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	orders, err := s.Lock(ctx, "orders/7")
	if err != nil {
		log.Fatal(err)
	}
	stock, err := s.Lock(ctx, "stock/7")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("holding", orders.Key(), "and", stock.Key(), "for", s.TTL())

	if err := s.Close(ctx); err != nil {
		log.Fatal(err)
	}
	<-s.Done()
	fmt.Println(errors.Is(orders.Err(), node.ErrSessionClosed), errors.Is(stock.Err(), node.ErrSessionClosed))
	if l, err := n.TryLock(ctx, "orders/7"); err == nil {
		fmt.Println("orders/7 is free again")
		l.Unlock(ctx)
	}
	// Output:
	// holding orders/7 and stock/7 for 30s
	// true true
	// orders/7 is free again
}

// Keys with the same hash tag, the part between the first '{' and the
// first '}' after it, are in the same shard: "{order-42}/items" and
// "{order-42}/invoice" hash as "order-42" (hashed whole, they would land
// in different shards of this 2-shard cluster).
func ExampleNode_hashTags() {
	n, stop := startExamplePeer()
	defer stop()
	ctx := context.Background()

	items, err := n.Inspect(ctx, "{order-42}/items")
	if err != nil {
		log.Fatal(err)
	}
	invoice, err := n.Inspect(ctx, "{order-42}/invoice")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(items.Shard == invoice.Shard)
	// Output: true
}
