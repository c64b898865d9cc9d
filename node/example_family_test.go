package node_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/lockmesh/lockmesh/node"
)

// A read/write lock: readers share the key, a writer has it alone, and
// every grant carries a fencing token.
func ExampleSession_RWMutex() {
	n, stop := startExamplePeer()
	defer stop()
	ctx := context.Background()
	s, err := n.NewSession(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(ctx)
	other, err := n.NewSession(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer other.Close(ctx)
	writer, err := n.NewSession(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer writer.Close(ctx)

	r1, err := s.RWMutex("catalog").RLock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	r2, err := other.RWMutex("catalog").RLock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("two readers:", r1.Token() != r2.Token())
	if _, err := writer.RWMutex("catalog").TryLock(ctx); errors.Is(err, node.ErrLocked) {
		fmt.Println("the writer waits for the readers")
	}
	r1.Unlock(ctx)
	r2.Unlock(ctx)
	w, err := writer.RWMutex("catalog").Lock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("writer token above the readers':", w.Token() > r2.Token())
	w.Unlock(ctx)
	// Output:
	// two readers: true
	// the writer waits for the readers
	// writer token above the readers': true
}

// A counting semaphore: at most 3 permits are held at once; a dead
// holder's come back after its session's TTL.
func ExampleSession_Semaphore() {
	n, stop := startExamplePeer()
	defer stop()
	ctx := context.Background()
	s, err := n.NewSession(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(ctx)

	two, err := s.Semaphore("render-slots", 3).Acquire(ctx, 2)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("holding", two.Permits(), "permits")
	if _, err := s.Semaphore("render-slots", 3).TryAcquire(ctx, 2); errors.Is(err, node.ErrLocked) {
		fmt.Println("only one is free")
	}
	two.Unlock(ctx)
	// Output:
	// holding 2 permits
	// only one is free
}

// LockAll takes several keys together: those with one hash tag in one
// Raft entry, all or none.
func ExampleSession_LockAll() {
	n, stop := startExamplePeer()
	defer stop()
	ctx := context.Background()
	s, err := n.NewSession(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(ctx)

	m, err := s.LockAll(ctx, "{order-42}/items", "{order-42}/invoice", "{order-42}/stock")
	if err != nil {
		log.Fatal(err)
	}
	for _, l := range m.Locks() {
		fmt.Println(l.Key(), l.Token() > 0)
	}
	m.Unlock(ctx)
	// Output:
	// {order-42}/items true
	// {order-42}/invoice true
	// {order-42}/stock true
}

// A refused try says who holds the key, without a second call.
func ExampleLockedError() {
	n, stop := startExamplePeer()
	defer stop()
	ctx := context.Background()
	holder, err := n.NewSession(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer holder.Close(ctx)
	l, err := holder.Lock(ctx, "report")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Unlock(ctx)

	_, err = n.TryLock(ctx, "report")
	var le *node.LockedError
	if errors.As(err, &le) {
		h := le.Holders[0]
		fmt.Println(h.Peer, h.Session == holder.ID(), h.Token == l.Token())
	}
	// Output: example true true
}

// A reentrant session may lock a key it holds again; the key is released
// when every hold is unlocked.
func ExampleWithReentrant() {
	n, stop := startExamplePeer()
	defer stop()
	ctx := context.Background()
	s, err := n.NewSession(ctx, node.WithReentrant())
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(ctx)

	outer, err := s.Lock(ctx, "ledger")
	if err != nil {
		log.Fatal(err)
	}
	inner, err := s.Lock(ctx, "ledger")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("same grant:", inner.Token() == outer.Token())
	inner.Unlock(ctx)
	info, _ := n.Inspect(ctx, "ledger")
	fmt.Println("still held:", len(info.Holders) == 1)
	outer.Unlock(ctx)
	info, _ = n.Inspect(ctx, "ledger")
	fmt.Println("released:", len(info.Holders) == 0)
	// Output:
	// same grant: true
	// still held: true
	// released: true
}

// A lock with a maximum hold: the cluster takes it back after d even
// while the session lives, and the holder's Done closes first.
func ExampleWithMaxHold() {
	n, stop := startExamplePeer()
	defer stop()
	ctx := context.Background()
	s, err := n.NewSession(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(ctx)

	l, err := s.Lock(ctx, "nightly-job", node.WithMaxHold(4*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	<-l.Done() // a wedged job would never get here on its own
	fmt.Println(errors.Is(l.Err(), node.ErrLeaseExpired), s.Err() == nil)
	// Output: true true
}

// TryLockAll takes every key if all are free now, and otherwise none.
func ExampleSession_TryLockAll() {
	n, stop := startExamplePeer()
	defer stop()
	ctx := context.Background()
	s, err := n.NewSession(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(ctx)
	busy, err := n.Lock(ctx, "{cart-9}/payment")
	if err != nil {
		log.Fatal(err)
	}

	_, err = s.TryLockAll(ctx, "{cart-9}/items", "{cart-9}/payment")
	fmt.Println(errors.Is(err, node.ErrLocked))
	info, _ := n.Inspect(ctx, "{cart-9}/items")
	fmt.Println("items held:", len(info.Holders) > 0)
	busy.Unlock(ctx)
	// Output:
	// true
	// items held: false
}

// A wait that would close a cycle of sessions is refused with
// ErrDeadlock, naming it, instead of hanging until ctx ends.
func ExampleErrDeadlock() {
	n, stop := startExamplePeer()
	defer stop()
	ctx := context.Background()
	a, _ := n.NewSession(ctx)
	b, _ := n.NewSession(ctx)
	defer a.Close(ctx)
	defer b.Close(ctx)
	x, _ := a.Lock(ctx, "{acct}/x")
	y, _ := b.Lock(ctx, "{acct}/y")

	go func() {
		if l, err := a.Lock(ctx, "{acct}/y"); err == nil { // waits for b
			l.Unlock(ctx)
		}
	}()
	for info, _ := n.Inspect(ctx, "{acct}/y"); len(info.Waiters) == 0; info, _ = n.Inspect(ctx, "{acct}/y") {
		time.Sleep(10 * time.Millisecond)
	}
	_, err := b.Lock(ctx, "{acct}/x") // would wait for a, which waits for b
	fmt.Println(errors.Is(err, node.ErrDeadlock))
	y.Unlock(ctx)
	x.Unlock(ctx)
	// Output: true
}
