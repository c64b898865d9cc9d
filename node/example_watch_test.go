package node_test

import (
	"context"
	"fmt"
	"log"

	"github.com/lockmesh/lockmesh/node"
)

// A watch starts from a snapshot of the key, then delivers every entry
// that touched it, in order: here a grant, then the release that hands the
// key on and the grant it makes, as one response.
func ExampleNode_Watch() {
	n, stop := startExamplePeer()
	defer stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	watch, err := n.Watch(ctx, "config")
	if err != nil {
		log.Fatal(err)
	}
	first := <-watch
	fmt.Println("snapshot:", first.Snapshot, len(first.Keys), "keys held")

	l, err := n.Lock(ctx, "config", node.WithValue([]byte("editor-1")))
	if err != nil {
		log.Fatal(err)
	}
	l.Unlock(ctx)
	for seen := 0; seen < 2; {
		r := <-watch
		for _, e := range r.Events {
			fmt.Printf("%v %s by %s\n", e.Kind, e.Key, e.Holder.Value)
			seen++
		}
	}
	// Output:
	// snapshot: true 0 keys held
	// granted config by editor-1
	// released config by
}

// Observe reports an election's leader, then every change.
func ExampleElection_Observe() {
	n, stop := startExamplePeer()
	defer stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := n.NewSession(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(ctx)
	e := s.Election("election/ingest")

	changes, err := e.Observe(ctx)
	if err != nil {
		log.Fatal(err)
	}
	show := func(ev node.LeaderEvent) {
		if ev.Leader == nil {
			fmt.Println("vacant")
			return
		}
		fmt.Printf("%s leads\n", ev.Leader.Value)
	}
	show(<-changes)
	ld, err := e.Campaign(ctx, []byte("ingest-7"))
	if err != nil {
		log.Fatal(err)
	}
	show(<-changes)
	ld.Resign(ctx)
	show(<-changes)
	// Output:
	// vacant
	// ingest-7 leads
	// vacant
}

// InspectPrefix pages through the keys of one hash tag.
func ExampleNode_InspectPrefix() {
	n, stop := startExamplePeer()
	defer stop()
	ctx := context.Background()
	for _, item := range []string{"a", "b", "c"} {
		if _, err := n.Lock(ctx, "{order-42}/"+item); err != nil {
			log.Fatal(err)
		}
	}
	for cursor := ""; ; {
		keys, next, err := n.InspectPrefix(ctx, "{order-42}/", cursor, 2)
		if err != nil {
			log.Fatal(err)
		}
		for _, k := range keys {
			fmt.Println(k.Key, "held by", k.Holders[0].Peer)
		}
		if next == "" {
			break
		}
		cursor = next
	}
	// Output:
	// {order-42}/a held by example
	// {order-42}/b held by example
	// {order-42}/c held by example
}

// A candidate of higher priority is elected before those that waited
// longer: here the standby that should lead when it can.
func ExampleWithPriority() {
	n, stop := startExamplePeer()
	defer stop()
	ctx := context.Background()
	s, err := n.NewSession(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(ctx)
	ld, err := s.Election("election/db").Campaign(ctx, []byte("primary-site"), node.WithPriority(10))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s leads in term %v\n", ld.Value(), ld.Term() > 0)
	// Output: primary-site leads in term true
}
