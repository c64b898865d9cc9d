package node_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/lockmesh/lockmesh/node"
)

// Run work under a lock and stop it the moment the lock can no longer be
// relied on: the lock's Context ends before anybody else can be granted
// the key.
func ExampleLock_Context() {
	n, stop := startExamplePeer()
	defer stop()
	ctx := context.Background()

	l, err := n.Lock(ctx, "reindex")
	if err != nil {
		log.Fatal(err)
	}
	work := l.Context(ctx) // pass it to the work the lock protects
	l.Unlock(ctx)
	<-work.Done()
	fmt.Println(context.Cause(work))
	// Output: lockmesh: lock released
}

// WithLock takes the lock, runs the function with the lock's context and
// releases the lock when it returns, panics or the lease is lost.
func ExampleWithLock() {
	n, stop := startExamplePeer()
	defer stop()

	err := node.WithLock(context.Background(), n, "nightly-report", func(ctx context.Context) error {
		fmt.Println("generating the report")
		return nil
	})
	if errors.Is(err, node.ErrLeaseExpired) {
		fmt.Println("the lock was lost while the report ran; it may be incomplete")
	}
	fmt.Println("done:", err)
	// Output:
	// generating the report
	// done: <nil>
}

// NewSyncLocker adapts a key to sync.Locker, for code written against it.
// It panics where the ctx API returns an error: prefer Lock where a lost
// lease must be handled.
func ExampleNewSyncLocker() {
	n, stop := startExamplePeer()
	defer stop()

	mu := node.NewSyncLocker(n, "config-file")
	mu.Lock()
	fmt.Println("editing the config file")
	mu.Unlock()
	// Output: editing the config file
}

// A long holder learns that somebody waits for its key, and lets go.
func ExampleLock_Contended() {
	n, stop := startExamplePeer()
	defer stop()
	ctx := context.Background()

	l, err := n.Lock(ctx, "batch-import")
	if err != nil {
		log.Fatal(err)
	}
	go func() {
		other, err := n.NewSession(ctx)
		if err != nil {
			log.Fatal(err)
		}
		next, err := other.Lock(ctx, "batch-import")
		if err == nil {
			next.Unlock(ctx)
		}
		other.Close(ctx)
	}()
	<-l.Contended() // between two batches, say
	fmt.Println("somebody waits: letting go")
	l.Unlock(ctx)
	// Output: somebody waits: letting go
}
