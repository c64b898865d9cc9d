// Command statuspage runs a 3-peer lock mesh inside one process, over
// loopback TCP with data on disk, sets up a scene worth looking at (a key
// held by peer-1 while peer-2 and peer-3 wait for it, in that order) and
// serves peer-1's status page (node.Handler) until interrupted:
//
//	go run ./examples/statuspage -http 127.0.0.1:8080
//
// It mounts the page under /debug/lockmesh/, as an application would
// beside its own routes; main_test.go drives it in a headless browser.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/lockmesh/lockmesh/internal/procs"
	"github.com/lockmesh/lockmesh/node"
)

const (
	// demoKey is held by peer-1 and waited for by peer-2, then peer-3.
	demoKey = "orders/17"
	// calmKey is held by peer-2 with nobody waiting: a second long hold.
	calmKey = "inventory/sku-1"
	// mountPath is where the page is served, under a prefix, as in an
	// application that has other routes.
	mountPath = "/debug/lockmesh/"
)

func main() {
	addr := flag.String("http", "127.0.0.1:0", "`address` to serve the status page on")
	runFor := flag.Duration("for", 0, "stop after this `duration` (0: run until interrupted)")
	flag.Parse()
	// This process runs 3 peers: more Ps than cores keep their fsyncs from
	// stalling the Go scheduler (see internal/procs).
	procs.Raise()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *runFor > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *runFor)
		defer cancel()
	}
	if err := run(ctx, *addr, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "statuspage:", err)
		os.Exit(1)
	}
}

// run sets up the scene, serves the page on addr and returns when ctx
// ends.
func run(ctx context.Context, addr string, out io.Writer) error {
	dir, err := os.MkdirTemp("", "lockmesh-statuspage-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	started := time.Now()
	d, err := startDemo(ctx, dir)
	if err != nil {
		return err
	}
	defer d.Close()
	fmt.Fprintf(out, "3 peers up in %v; %s holds %q with token %d, %s and %s wait for it\n",
		time.Since(started).Round(time.Millisecond), d.Peers[0].Name(), demoKey, d.Held.Token(),
		d.Peers[1].Name(), d.Peers[2].Name())

	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("status page listener on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: d.Handler(), ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	fmt.Fprintf(out, "status page of %s: http://%s%s\n", d.Peers[0].Name(), l.Addr(), mountPath)

	select {
	case <-ctx.Done():
	case err := <-served:
		return fmt.Errorf("serving the status page: %w", err)
	}
	shutCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutCtx); err != nil {
		return err
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// demo is the scene the page shows: three peers, demoKey held by the
// first and waited for by the other two in order, calmKey held by the
// second.
type demo struct {
	Peers []*node.Node
	// Held is peer-1's hold of demoKey, until Release.
	Held *node.Lock

	cancelWaits context.CancelFunc
	waits       sync.WaitGroup
	mu          sync.Mutex
	// granted are the locks the waiters got, and calmKey's: unlocked by
	// Close.
	granted  []*node.Lock
	released bool
}

// startDemo starts the peers with their data under dir and sets up the
// scene. It returns once Inspect shows both waiters queued.
func startDemo(ctx context.Context, dir string) (*demo, error) {
	peers, err := startPeers(ctx, dir, 3)
	if err != nil {
		closeAll(peers)
		return nil, err
	}
	waitCtx, cancelWaits := context.WithCancel(context.Background())
	d := &demo{Peers: peers, cancelWaits: cancelWaits}
	ok := false
	defer func() {
		if !ok {
			d.Close()
		}
	}()

	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if d.Held, err = peers[0].Lock(ctx, demoKey); err != nil {
		return nil, fmt.Errorf("%s locking %q: %w", peers[0].Name(), demoKey, err)
	}
	calm, err := peers[1].Lock(ctx, calmKey)
	if err != nil {
		return nil, fmt.Errorf("%s locking %q: %w", peers[1].Name(), calmKey, err)
	}
	d.granted = append(d.granted, calm)

	// The waiters queue one after the other, so the page's FIFO order is
	// known: each is seen queued before the next asks.
	waitErr := make(chan error, 2)
	for i, p := range peers[1:] {
		d.waits.Add(1)
		go func() {
			defer d.waits.Done()
			l, err := p.Lock(waitCtx, demoKey)
			if err != nil {
				if waitCtx.Err() == nil {
					waitErr <- fmt.Errorf("%s waiting for %q: %w", p.Name(), demoKey, err)
				}
				return
			}
			d.mu.Lock()
			d.granted = append(d.granted, l)
			d.mu.Unlock()
		}()
		if err := waitForWaiters(ctx, peers[0], demoKey, i+1, waitErr); err != nil {
			return nil, err
		}
	}
	ok = true
	return d, nil
}

// Handler serves peer-1's status page under mountPath, and sends "/"
// there.
func (d *demo) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle(mountPath, http.StripPrefix(mountPath[:len(mountPath)-1], d.Peers[0].Handler()))
	mux.Handle("/{$}", http.RedirectHandler(mountPath, http.StatusFound))
	return mux
}

// Release unlocks peer-1's hold of demoKey, which hands it to peer-2; the
// page then shows peer-2 holding it and peer-3 waiting.
func (d *demo) Release(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.released {
		return nil
	}
	d.released = true
	return d.Held.Unlock(ctx)
}

// Close stops the waiters, releases the locks and closes the peers.
func (d *demo) Close() {
	d.cancelWaits()
	d.waits.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// Unlocking is a courtesy to the log; closing the peers ends the
	// sessions, so an error here changes nothing.
	if d.Held != nil {
		d.Release(ctx)
	}
	for _, l := range d.granted {
		l.Unlock(ctx)
	}
	closeAll(d.Peers)
}

// closeAll closes the peers together: each Close first ends its
// sessions through the shards, so closed one by one the last peers wait
// on shards that have lost their quorum (about 2 s each, measured; 0.2 s
// for all three together).
func closeAll(peers []*node.Node) {
	var wg sync.WaitGroup
	for _, p := range peers {
		wg.Go(func() { p.Close() })
	}
	wg.Wait()
}

// waitForWaiters returns once key has want waiters, as n's Inspect sees
// it, or a waiter failed.
func waitForWaiters(ctx context.Context, n *node.Node, key string, want int, failed <-chan error) error {
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
			return fmt.Errorf("%q has %d waiters, want %d: %w", key, len(info.Waiters), want, ctx.Err())
		case err := <-failed:
			return err
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// startPeers starts n peers on loopback that bootstrap a cluster together,
// each with its own data dir under dir, and waits until all are ready.
// On error it returns the peers it started, for the caller to close.
func startPeers(ctx context.Context, dir string, n int) ([]*node.Node, error) {
	var peers []*node.Node
	var seed string
	for i := 1; i <= n; i++ {
		raft, err := freeAddr()
		if err != nil {
			return peers, err
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
			return peers, err
		}
		if seed == "" {
			seed = p.GossipAddr()
		}
		peers = append(peers, p)
	}
	for _, p := range peers {
		select {
		case <-p.Ready():
		case <-ctx.Done():
			return peers, fmt.Errorf("%s not ready: %w", p.Name(), ctx.Err())
		case <-time.After(30 * time.Second):
			return peers, fmt.Errorf("%s not ready after 30s", p.Name())
		}
	}
	return peers, nil
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
