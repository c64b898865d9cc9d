// Command election shows lockmesh's leader election with real processes:
// a leader that resigns, a leader that crashes, and an observer that sees
// every change of leader.
//
// Run with no flags, it is a demo that needs nothing else:
//
//	go run ./examples/election
//
// It starts three peer processes of itself and an observer process on
// 127.0.0.1 (temporary data dirs), waits for a leader, has it resign
// (SIGUSR1: the next candidate is elected in the same Raft entry), then
// crashes the new leader (SIGKILL: the next candidate is elected once the
// crashed leader's session TTL has run out), prints how long each
// hand-over took, and stops every child. -measure N repeats that N times,
// each on a fresh cluster, and prints the median and worst times:
//
//	go run ./examples/election -measure 5
//
// -ttl sets the children's session TTL (at least 40 RTT, -rtt), -timeout
// bounds the demo or each round (60s), and -keep keeps the temporary dir
// with the children's data dirs and logs (NAME.log).
//
// With -role it is one of those children, for running by hand.
// -role peer embeds a lockmesh node and campaigns with node.RunElected in
// the election (-election, "election/demo"), proclaiming its -name;
// -role observer embeds a client-only node (no replicas; it needs -join)
// and prints every change of leader (Node.Observe). Three candidates and
// an observer on one machine, built first so that signals reach them
// (go run would stand between):
//
//	go build -o election ./examples/election
//	./election -role peer -name p1 -data /tmp/el/p1 -gossip 127.0.0.1:7001 -raft 127.0.0.1:7002 -rpc 127.0.0.1:7003 -expect 3 -join 127.0.0.1:7011,127.0.0.1:7021
//	./election -role peer -name p2 -data /tmp/el/p2 -gossip 127.0.0.1:7011 -raft 127.0.0.1:7012 -rpc 127.0.0.1:7013 -expect 3 -join 127.0.0.1:7001,127.0.0.1:7021
//	./election -role peer -name p3 -data /tmp/el/p3 -gossip 127.0.0.1:7021 -raft 127.0.0.1:7022 -rpc 127.0.0.1:7023 -expect 3 -join 127.0.0.1:7001,127.0.0.1:7011
//	./election -role observer -name obs -data /tmp/el/obs -gossip 127.0.0.1:7031 -raft 127.0.0.1:7032 -rpc 127.0.0.1:7033 -join 127.0.0.1:7001
//
// Each child prints one line per event on stdout; at= is the wall clock in
// nanoseconds since 1970, so that lines of processes on one machine can be
// ordered. A peer prints:
//
//	ready NAME gossip=ADDR
//	candidate peer=NAME session=ID           (it campaigns, with a new Session)
//	queued peer=NAME place=P at=NS           (its Session waits in the queue, P-th; 1 is next)
//	elected term=T peer=NAME at=NS           (read after Campaign returned)
//	leading term=T peer=NAME at=NS           (every -report-leading while Done is open)
//	lost term=T peer=NAME at=NS err=ERR      (Done closed: the leadership ended)
//	resigning term=T peer=NAME at=NS         (SIGUSR1, SIGINT or SIGTERM while leading)
//	resigned term=T peer=NAME at=NS          (after SIGUSR1: the resignation committed)
//	resign-failed term=T peer=NAME err=ERR   (after SIGUSR1: not known to have committed)
//	session-lost peer=NAME err=ERR           (it campaigns again with a new Session)
//	campaign-failed peer=NAME err=ERR        (refused; it tries again a second later)
//	shardleader shard=S peer=P at=NS         (every -report-shard-leader, when it changed: P
//	                                          leads Raft shard S, which holds the election, as
//	                                          this peer's replica sees it; none when unknown)
//
// A leading line's time is read before Done was found open, so the peer
// relied on its leadership no earlier than that time; an elected line's is
// read after the election. A leader that printed a leading line later
// than another peer's elected line of a higher term would have overlapped
// its successor. The observer prints:
//
//	ready NAME gossip=ADDR
//	leader term=T value=V index=I at=NS      (V is what the leader proclaims: its name)
//	vacant index=I at=NS                     (nobody leads)
//	resync leader ... / resync vacant ...    (read again: changes in between may be missed)
//	observe-ended index=I err=ERR            (it observes again, from a fresh read)
//
// A peer resigns on SIGUSR1 and campaigns again, at the back of the queue.
// SIGINT or SIGTERM resigns, closes the node and exits 0. Logs go to
// stderr (-log-level, warn by default). Bad flags exit 2; a child that
// cannot start, or a demo that fails, exits 1.
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

	"github.com/lockmesh/lockmesh/internal/procs"
	"github.com/lockmesh/lockmesh/node"
)

// Roles: what the process does.
const (
	roleDemo     = "demo"
	rolePeer     = "peer"
	roleObserver = "observer"
)

// defaultElection is the election the peers campaign in.
const defaultElection = "election/demo"

// config is what the flags say.
type config struct {
	role     string
	node     node.Config
	election string
	logLevel slog.Level
	// reportLeading is the interval of a leader's leading lines; 0 prints
	// none.
	reportLeading time.Duration
	// reportShardLeader is the interval at which a peer looks up who
	// leads the election's Raft shard, printing a shardleader line when
	// it changed; 0 prints none.
	reportShardLeader time.Duration

	// The demo's: rounds of the scenario (-measure; 0 runs it once, with
	// every child's lines shown) and the bound on each.
	measure int
	timeout time.Duration
	keep    bool // keep the data dirs and the children's logs
}

func main() {
	// Peers are processes of their own here, one node each; more Ps than
	// cores keep fsyncs from stalling the Go scheduler (internal/procs).
	procs.Raise()
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
		fmt.Fprintf(stderr, "election: %v\nRun 'election -h' for the flags.\n", err)
		return 2
	}
	if cfg.role == roleDemo {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		bin, err := os.Executable()
		if err != nil {
			bin = os.Args[0]
		}
		if err := runDemo(ctx, bin, cfg, stdout); err != nil {
			fmt.Fprintf(stderr, "election: %v\n", err)
			return 1
		}
		return 0
	}
	cfg.node.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: cfg.logLevel}))
	return runChild(cfg, &lineWriter{w: stdout}, stderr)
}

// parseFlags turns the command line into a config and checks it, including
// node.Config.Validate for the children, so that every mistake is reported
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
	if err := finish(fs); err != nil {
		return config{}, err
	}
	return cfg, nil
}

// Which flags each role takes: the demo sets the rest for its children.
var (
	sharedFlags = map[string]bool{"role": true, "election": true, "ttl": true, "rtt": true}
	demoFlags   = map[string]bool{"measure": true, "timeout": true, "keep": true}
)

// newFlagSet defines the flags over cfg. finish checks and converts what
// the flag package cannot; call it after Parse.
func newFlagSet(cfg *config) (fs *flag.FlagSet, finish func(*flag.FlagSet) error) {
	fs = flag.NewFlagSet("election", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage:\n  election [-measure N] [-timeout D] [-ttl D]   (the demo)\n"+
			"  election -role peer -name NAME -data DIR -gossip HOST:PORT -raft HOST:PORT -rpc HOST:PORT [-expect N] [-join ADDRS]\n"+
			"  election -role observer -name NAME -data DIR -gossip HOST:PORT -raft HOST:PORT -rpc HOST:PORT -join ADDRS\n\n")
		fs.PrintDefaults()
	}
	nc := &cfg.node
	fs.StringVar(&cfg.role, "role", roleDemo, "what to run: demo (3 peers and an observer as child processes), peer (a candidate) or observer")
	fs.StringVar(&cfg.election, "election", defaultElection, "`name` of the election")
	fs.StringVar(&nc.Name, "name", "", "unique, stable `name` of this peer, which it proclaims when elected (default: the -rpc address)")
	fs.StringVar(&nc.DataDir, "data", "", "data `dir` of the node (required with -role)")
	fs.StringVar(&nc.GossipAddr, "gossip", "", "gossip (memberlist) `host:port`, TCP and UDP")
	fs.StringVar(&nc.RaftAddr, "raft", "", "Raft `host:port`; needs a fixed port")
	fs.StringVar(&nc.RPCAddr, "rpc", "", "lockmesh RPC `host:port`")
	join := fs.String("join", "", "comma-separated gossip `addrs` of other peers; one live one is enough")
	fs.IntVar(&nc.BootstrapExpect, "expect", 0, "`peers` that form a new cluster together; 0 joins an existing one")
	fs.IntVar(&nc.Shards, "shards", node.DefaultShards, "lock `shards`, fixed when the cluster is created")
	fs.DurationVar(&nc.SessionTTL, "ttl", node.DefaultSessionTTL, "session TTL (`duration`): how long a crashed leader's leadership stays held")
	fs.DurationVar(&nc.RTT, "rtt", node.DefaultRTT, "expected round trip (`duration`) between peers")
	level := fs.String("log-level", "warn", "stderr log `level`: debug, info, warn or error")
	fs.DurationVar(&cfg.reportLeading, "report-leading", 0, "while leading, print a leading line every `interval`; 0 prints none")
	fs.DurationVar(&cfg.reportShardLeader, "report-shard-leader", 0, "look up who leads the election's Raft shard every `interval`, and print a shardleader line when it changed; 0 prints none")
	fs.IntVar(&cfg.measure, "measure", 0, "demo: run the crash scenario `n` times, each on a fresh cluster, and print the median and worst failover")
	fs.DurationVar(&cfg.timeout, "timeout", 60*time.Second, "demo: bound on the demo, or on each round of -measure")
	fs.BoolVar(&cfg.keep, "keep", false, "demo: keep the temporary dir with the children's data dirs and logs (NAME.log, at -log-level info)")

	finish = func(fs *flag.FlagSet) error {
		var bad []string
		fs.Visit(func(f *flag.Flag) {
			if !sharedFlags[f.Name] && demoFlags[f.Name] != (cfg.role == roleDemo) {
				bad = append(bad, "-"+f.Name)
			}
		})
		if len(bad) > 0 {
			if cfg.role == roleDemo {
				return fmt.Errorf("%s: not a flag of the demo; a peer or observer needs -role", strings.Join(bad, ", "))
			}
			return fmt.Errorf("%s: a flag of the demo only, not of -role %s", strings.Join(bad, ", "), cfg.role)
		}
		if len(cfg.election) == 0 || len(cfg.election) > node.MaxKeyLen {
			return fmt.Errorf("-election name is %d bytes; want 1 to %d", len(cfg.election), node.MaxKeyLen)
		}
		switch cfg.role {
		case roleDemo:
			switch {
			case cfg.measure < 0:
				return fmt.Errorf("-measure %d is negative", cfg.measure)
			case cfg.timeout <= 0:
				return fmt.Errorf("-timeout %v must be positive", cfg.timeout)
			}
			// The children check the rest, but a TTL they refuse is
			// better refused here.
			c := node.Config{SessionTTL: nc.SessionTTL, RTT: nc.RTT, DataDir: "/x",
				GossipAddr: "127.0.0.1:1", RaftAddr: "127.0.0.1:2", RPCAddr: "127.0.0.1:3", BootstrapExpect: 3}
			return c.Validate()
		case rolePeer, roleObserver:
		default:
			return fmt.Errorf("-role %q: want demo, peer or observer", cfg.role)
		}
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
		case cfg.role == roleObserver && nc.BootstrapExpect != 0:
			return errors.New("-role observer hosts no replicas: it joins with -join, and takes no -expect")
		case cfg.role == roleObserver && len(nc.Join) == 0:
			return errors.New("-role observer needs -join: it hosts no replicas, so it joins a cluster of peers")
		case nc.BootstrapExpect == 0 && len(nc.Join) == 0:
			return errors.New("set -expect N to form a new cluster of N peers, or -join to join one")
		case cfg.reportLeading < 0:
			return fmt.Errorf("-report-leading %v is negative", cfg.reportLeading)
		case cfg.role == roleObserver && cfg.reportLeading != 0:
			return errors.New("-report-leading is for -role peer: an observer never leads")
		case cfg.reportShardLeader < 0:
			return fmt.Errorf("-report-shard-leader %v is negative", cfg.reportShardLeader)
		case cfg.role == roleObserver && cfg.reportShardLeader != 0:
			return errors.New("-report-shard-leader is for -role peer: an observer hosts no replica to ask")
		}
		nc.NoReplicas = cfg.role == roleObserver
		return nc.Validate()
	}
	return fs, finish
}
