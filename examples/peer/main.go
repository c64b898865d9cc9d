// Command peer runs one lockmesh peer as its own OS process, configured by
// flags, for running peers as separate processes instead of embedding them.
// Three peers on one machine that form a cluster together:
//
//	go run ./examples/peer -name p1 -data /tmp/lm/p1 -gossip 127.0.0.1:7001 -raft 127.0.0.1:7002 -rpc 127.0.0.1:7003 -expect 3 -join 127.0.0.1:7011,127.0.0.1:7021
//	go run ./examples/peer -name p2 -data /tmp/lm/p2 -gossip 127.0.0.1:7011 -raft 127.0.0.1:7012 -rpc 127.0.0.1:7013 -expect 3 -join 127.0.0.1:7001,127.0.0.1:7021
//	go run ./examples/peer -name p3 -data /tmp/lm/p3 -gossip 127.0.0.1:7021 -raft 127.0.0.1:7022 -rpc 127.0.0.1:7023 -expect 3 -join 127.0.0.1:7001,127.0.0.1:7011
//
// A peer started later with -expect 0 joins the existing cluster; it hosts
// no replicas and forwards its lock calls to peers that do. With -lock KEY
// it takes the lock once it is ready and reports on stdout, one line each:
//
//	ready NAME gossip=ADDR
//	acquired KEY token=N
//	released KEY          (after -hold, or when signalled while holding)
//	lost KEY: ERR         (the lease ended before the release)
//
// -loop N repeats lock/hold/unlock N times. After its demo actions the peer
// keeps serving until SIGINT or SIGTERM, which unlock what it holds, close
// the node (its sessions end at once, so waiters are granted without
// waiting for the session TTL) and exit 0; a second signal kills it
// outright. Logs go to stderr. Bad flags exit 2; a peer that cannot start
// exits 1.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/lockmesh/lockmesh/node"
)

// config is what the flags say: the node's configuration and the demo.
type config struct {
	node     node.Config
	lock     string        // key to lock once ready; empty for none
	hold     time.Duration // how long to hold it; 0 means until signalled
	loop     int           // lock/hold/unlock rounds
	logLevel slog.Level
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is the whole program; it returns the exit code.
func run(args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args)
	if errors.Is(err, flag.ErrHelp) {
		fs, _ := newFlagSet(&config{})
		fs.SetOutput(stderr)
		fs.Usage()
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "peer: %v\nRun 'peer -h' for the flags.\n", err)
		return 2
	}
	cfg.node.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: cfg.logLevel}))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	n, err := node.Start(ctx, cfg.node)
	if err != nil && ctx.Err() != nil {
		return 0 // signalled while joining
	}
	if err != nil {
		fmt.Fprintf(stderr, "peer: %v\n", err)
		return 1
	}
	defer n.Close()

	select {
	case <-n.Ready():
		fmt.Fprintf(stdout, "ready %s gossip=%s\n", n.Name(), n.GossipAddr())
	case <-ctx.Done():
	}
	for i := 0; i < cfg.loop && cfg.lock != "" && ctx.Err() == nil; i++ {
		if err := lockOnce(ctx, n, cfg.lock, cfg.hold, stdout); err != nil {
			fmt.Fprintf(stderr, "peer: %v\n", err)
			return 1
		}
	}
	<-ctx.Done()
	stop() // a second signal kills the process if Close hangs
	if err := n.Close(); err != nil {
		fmt.Fprintf(stderr, "peer: close: %v\n", err)
		return 1
	}
	return 0
}

// lockOnce takes key, holds it for hold (0: until ctx ends) or until its
// lease is lost, and releases it. A lock call cut short by ctx is no error.
func lockOnce(ctx context.Context, n *node.Node, key string, hold time.Duration, stdout io.Writer) error {
	l, err := n.Lock(ctx, key)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	fmt.Fprintf(stdout, "acquired %s token=%d\n", key, l.Token())

	var expired <-chan time.Time
	if hold > 0 {
		t := time.NewTimer(hold)
		defer t.Stop()
		expired = t.C
	}
	select {
	case <-l.Done():
		fmt.Fprintf(stdout, "lost %s: %v\n", key, l.Err())
		return nil
	case <-expired:
	case <-ctx.Done():
	}
	uctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	switch err := l.Unlock(uctx); {
	case err == nil:
		fmt.Fprintf(stdout, "released %s\n", key)
	case errors.Is(err, node.ErrLeaseExpired):
		fmt.Fprintf(stdout, "lost %s: %v\n", key, err)
	default:
		return err
	}
	return nil
}

// parseFlags turns the command line into a config and checks it, including
// node.Config.Validate, so that every mistake in the flags is reported
// before anything starts. -h returns flag.ErrHelp.
func parseFlags(args []string) (config, error) {
	var cfg config
	fs, finish := newFlagSet(&cfg)
	fs.SetOutput(io.Discard) // run prints the error once, its own way
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected argument %q: every setting is a flag", fs.Arg(0))
	}
	if err := finish(); err != nil {
		return config{}, err
	}
	return cfg, nil
}

// newFlagSet defines the flags over cfg. finish checks and converts what
// the flag package cannot; call it after Parse.
func newFlagSet(cfg *config) (fs *flag.FlagSet, finish func() error) {
	fs = flag.NewFlagSet("peer", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: peer -data DIR -gossip HOST:PORT -raft HOST:PORT -rpc HOST:PORT [-expect N | -join ADDRS] [flags]\n\n")
		fs.PrintDefaults()
	}
	nc := &cfg.node
	fs.StringVar(&nc.Name, "name", "", "unique, stable `name` of this peer (default: the -rpc address)")
	fs.StringVar(&nc.DataDir, "data", "", "data `dir` for Raft logs and the cluster record (required)")
	fs.StringVar(&nc.GossipAddr, "gossip", "", "gossip (memberlist) `host:port`, TCP and UDP")
	fs.StringVar(&nc.RaftAddr, "raft", "", "Raft `host:port`; needs a fixed port")
	fs.StringVar(&nc.RPCAddr, "rpc", "", "lockmesh RPC `host:port`")
	join := fs.String("join", "", "comma-separated gossip `addrs` of other peers; one live one is enough")
	fs.IntVar(&nc.BootstrapExpect, "expect", 0, "`peers` that form a new cluster together; 0 joins an existing one")
	fs.IntVar(&nc.Shards, "shards", node.DefaultShards, "lock `shards`, fixed when the cluster is created")
	fs.IntVar(&nc.ReplicationFactor, "rf", node.DefaultReplicationFactor, "`replicas` per shard")
	fs.DurationVar(&nc.SessionTTL, "ttl", node.DefaultSessionTTL, "session TTL (`duration`): how long a crashed peer's locks stay held")
	fs.DurationVar(&nc.RTT, "rtt", node.DefaultRTT, "expected round trip (`duration`) between peers")
	level := fs.String("log-level", "info", "stderr log `level`: debug, info, warn or error")
	fs.StringVar(&cfg.lock, "lock", "", "once ready, lock `key` and report on stdout")
	fs.DurationVar(&cfg.hold, "hold", 0, "hold the -lock key this `duration`; 0 holds it until signalled")
	fs.IntVar(&cfg.loop, "loop", 1, "repeat lock/hold/unlock `n` times")

	finish = func() error {
		for _, a := range strings.Split(*join, ",") {
			if a = strings.TrimSpace(a); a != "" {
				nc.Join = append(nc.Join, a)
			}
		}
		if err := cfg.logLevel.UnmarshalText([]byte(*level)); err != nil {
			return fmt.Errorf("-log-level %q: want debug, info, warn or error", *level)
		}
		switch {
		case nc.DataDir == "":
			return errors.New("-data is required")
		case nc.GossipAddr == "" || nc.RaftAddr == "" || nc.RPCAddr == "":
			return errors.New("-gossip, -raft and -rpc are required")
		case nc.BootstrapExpect == 0 && len(nc.Join) == 0:
			return errors.New("set -expect N to form a new cluster of N peers, or -join to join one")
		case cfg.hold < 0:
			return fmt.Errorf("-hold %v is negative", cfg.hold)
		case cfg.loop < 1:
			return fmt.Errorf("-loop %d must be at least 1", cfg.loop)
		case cfg.lock == "" && (cfg.loop != 1 || cfg.hold != 0):
			return errors.New("-hold and -loop need -lock KEY")
		case cfg.lock != "" && len(cfg.lock) > node.MaxKeyLen:
			return fmt.Errorf("-lock key is %d bytes; at most %d", len(cfg.lock), node.MaxKeyLen)
		}
		return nc.Validate()
	}
	return fs, finish
}
