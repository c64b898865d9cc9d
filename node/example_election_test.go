package node_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/lockmesh/lockmesh/node"
)

// Campaign until elected, act as leader while the leadership holds, and
// resign: the next candidate is elected in the same Raft entry.
func ExampleElection_Campaign() {
	n, stop := startExamplePeer()
	defer stop()
	ctx := context.Background()
	s, err := n.NewSession(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(ctx)

	ld, err := s.Election("election/ingest").Campaign(ctx, []byte("ingest-7:9090"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("leading, proclaiming %s\n", ld.Value())
	// Pass ld.Term() to what the leader writes to (node.Fence), and stop
	// at ld.Done().
	if err := ld.Resign(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("resigned:", ld.Err() != nil)
	// Output:
	// leading, proclaiming ingest-7:9090
	// resigned: true
}

// Leader reads who leads an election, linearizably; nobody needs a
// Session to ask.
func ExampleNode_Leader() {
	n, stop := startExamplePeer()
	defer stop()
	ctx := context.Background()

	if _, err := n.Leader(ctx, "election/ingest"); errors.Is(err, node.ErrNoLeader) {
		fmt.Println("vacant")
	}
	s, err := n.NewSession(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(ctx)
	ld, err := s.Election("election/ingest").Campaign(ctx, []byte("ingest-7:9090"))
	if err != nil {
		log.Fatal(err)
	}
	info, err := n.Leader(ctx, "election/ingest")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s leads on %s, in term %v\n", info.Value, info.Peer, info.Term == ld.Term())
	// Output:
	// vacant
	// ingest-7:9090 leads on example, in term true
}

// Proclaim changes what the leader says without an election; it is
// fenced on the term, so a deposed leader cannot overwrite its
// successor's.
func ExampleLeadership_Proclaim() {
	n, stop := startExamplePeer()
	defer stop()
	ctx := context.Background()
	s, err := n.NewSession(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(ctx)
	e := s.Election("election/ingest")
	ld, err := e.Campaign(ctx, []byte("starting"))
	if err != nil {
		log.Fatal(err)
	}
	if err := ld.Proclaim(ctx, []byte("serving on :9090")); err != nil {
		log.Fatal(err)
	}
	info, _ := e.Leader(ctx)
	fmt.Printf("%s\n", info.Value)
	ld.Resign(ctx)
	err = ld.Proclaim(ctx, []byte("too late"))
	fmt.Println(errors.Is(err, node.ErrNotHeld))
	// Output:
	// serving on :9090
	// true
}

// RunElected runs a job on one instance at a time: it campaigns, runs the
// function while leading, with a context that ends with the leadership,
// and campaigns again when the leadership is lost.
func ExampleRunElected() {
	n, stop := startExamplePeer()
	defer stop()
	ctx := context.Background()
	s, err := n.NewSession(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(ctx)

	err = node.RunElected(ctx, s.Election("election/compactor"), []byte("compactor-2"), func(ctx context.Context, ld *node.Leadership) error {
		fmt.Println("compacting as the only compactor")
		return nil // done: resign, and let the next candidate lead
	})
	fmt.Println("done:", err)
	// Output:
	// compacting as the only compactor
	// done: <nil>
}

// A value says who holds a lock and for what: Inspect shows it with the
// holder, and SetValue replaces it while the lock is held.
func ExampleWithValue() {
	n, stop := startExamplePeer()
	defer stop()
	ctx := context.Background()

	l, err := n.Lock(ctx, "migration", node.WithValue([]byte("step 1 of 3")))
	if err != nil {
		log.Fatal(err)
	}
	defer l.Unlock(ctx)
	if err := l.SetValue(ctx, []byte("step 2 of 3")); err != nil {
		log.Fatal(err)
	}
	info, err := n.Inspect(ctx, "migration")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s\n", info.Holders[0].Value)
	// Output: step 2 of 3
}
