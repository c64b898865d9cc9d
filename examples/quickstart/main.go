// Command quickstart runs a 3-peer lock mesh inside one process, over real
// loopback TCP with data on disk (fsync on), and shows what lockmesh does:
// a lock taken, refused to a TryLock, handed to a waiter in FIFO order, and
// a paused holder's stale fencing token rejected by the resource.
//
//	go run ./examples/quickstart
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"time"

	"github.com/lockmesh/lockmesh/internal/procs"
	"github.com/lockmesh/lockmesh/node"
)

func main() {
	// This process runs 3 peers: more Ps than cores keep their fsyncs from
	// stalling the Go scheduler (see internal/procs). GOMAXPROCS in the
	// environment still wins.
	procs.Raise()
	if err := run(context.Background(), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, out io.Writer) error {
	dir, err := os.MkdirTemp("", "lockmesh-quickstart-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	started := time.Now()
	peers, err := startPeers(ctx, dir, 3)
	if err != nil {
		return err
	}
	defer func() {
		for _, p := range peers {
			p.Close()
		}
	}()
	fmt.Fprintf(out, "3 peers formed a cluster in %v (data in %s)\n", time.Since(started).Round(time.Millisecond), dir)

	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	a, b, c := peers[0], peers[1], peers[2]
	const key = "invoice/42"

	// 1. Lock and TryLock.
	la, err := a.Lock(ctx, key)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%s locked %q with fencing token %d\n", a.Name(), key, la.Token())
	if _, err := b.TryLock(ctx, key); !errors.Is(err, node.ErrLocked) {
		return fmt.Errorf("TryLock on a held key returned %v, want ErrLocked", err)
	}
	fmt.Fprintf(out, "%s TryLock %q: refused (%v)\n", b.Name(), key, node.ErrLocked)

	// 2. A waiter is handed the lock by the Raft entry that releases it.
	granted := make(chan *node.Lock, 1)
	errc := make(chan error, 1)
	go func() {
		l, err := b.Lock(ctx, key)
		if err != nil {
			errc <- err
			return
		}
		granted <- l
	}()
	if err := waitForWaiters(ctx, c, key, 1); err != nil {
		return err
	}
	fmt.Fprintf(out, "%s is queued for %q\n", b.Name(), key)

	// The resource the lock protects checks tokens.
	var storage node.Fence
	if err := storage.Check(key, la.Token()); err != nil {
		return err
	}
	fmt.Fprintf(out, "storage accepted a write from %s with token %d\n", a.Name(), la.Token())

	unlocked := time.Now()
	if err := la.Unlock(ctx); err != nil {
		return err
	}
	var lb *node.Lock
	select {
	case lb = <-granted:
	case err := <-errc:
		return err
	}
	fmt.Fprintf(out, "%s unlocked; %s was handed the lock %v later with token %d\n",
		a.Name(), b.Name(), time.Since(unlocked).Round(time.Microsecond), lb.Token())
	if err := storage.Check(key, lb.Token()); err != nil {
		return err
	}
	fmt.Fprintf(out, "storage accepted a write from %s with token %d\n", b.Name(), lb.Token())

	// 3. Fencing: a holder that was paused (GC, VM migration) past its lease
	// wakes up and writes with its old token. The resource rejects it.
	err = storage.Check(key, la.Token())
	if !errors.Is(err, node.ErrStaleToken) {
		return fmt.Errorf("stale token was not fenced: %v", err)
	}
	fmt.Fprintf(out, "storage rejected a late write from paused %s: %v\n", a.Name(), err)
	if err := lb.Unlock(ctx); err != nil {
		return err
	}

	// 4. Lock+unlock latency at concurrency 1, on an uncontended key.
	var lat []time.Duration
	for i := 0; i < 200; i++ {
		t0 := time.Now()
		l, err := c.Lock(ctx, fmt.Sprintf("latency/%d", i))
		if err != nil {
			return err
		}
		if err := l.Unlock(ctx); err != nil {
			return err
		}
		lat = append(lat, time.Since(t0))
	}
	slices.Sort(lat)
	fmt.Fprintf(out, "lock+unlock at c=1 (200 ops, fsync on): p50 %v, p99 %v\n",
		lat[len(lat)/2].Round(time.Microsecond), lat[len(lat)*99/100].Round(time.Microsecond))
	fmt.Fprintln(out, "done")
	return nil
}

// startPeers starts n peers on loopback that bootstrap a cluster together,
// each with its own data dir under dir, and waits until all are ready.
func startPeers(ctx context.Context, dir string, n int) ([]*node.Node, error) {
	var peers []*node.Node
	var seed string
	for i := 1; i <= n; i++ {
		raft, err := freeAddr()
		if err != nil {
			return nil, err
		}
		cfg := node.Config{
			Name:            fmt.Sprintf("peer-%d", i),
			DataDir:         fmt.Sprintf("%s/peer-%d", dir, i),
			GossipAddr:      "127.0.0.1:0",
			RaftAddr:        raft,
			RPCAddr:         "127.0.0.1:0",
			BootstrapExpect: n,
		}
		if seed != "" {
			cfg.Join = []string{seed}
		}
		p, err := node.Start(ctx, cfg)
		if err != nil {
			for _, q := range peers {
				q.Close()
			}
			return nil, err
		}
		if seed == "" {
			seed = p.GossipAddr()
		}
		peers = append(peers, p)
	}
	for _, p := range peers {
		select {
		case <-p.Ready():
		case <-time.After(30 * time.Second):
			return peers, fmt.Errorf("%s not ready after 30s", p.Name())
		}
	}
	return peers, nil
}

func waitForWaiters(ctx context.Context, n *node.Node, key string, want int) error {
	for {
		info, err := n.Inspect(ctx, key)
		if err != nil {
			return err
		}
		if len(info.Waiters) >= want {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// freeAddr returns a loopback address with a port nobody listens on now.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}
