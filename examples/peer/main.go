// Command peer runs one lockmesh peer as its own OS process, configured by
// flags, for running peers as separate processes instead of embedding them.
// Three peers on one machine that form a cluster together:
//
//	go run ./examples/peer -name p1 -data /tmp/lm/p1 -gossip 127.0.0.1:7001 -raft 127.0.0.1:7002 -rpc 127.0.0.1:7003 -expect 3 -join 127.0.0.1:7011,127.0.0.1:7021
//	go run ./examples/peer -name p2 -data /tmp/lm/p2 -gossip 127.0.0.1:7011 -raft 127.0.0.1:7012 -rpc 127.0.0.1:7013 -expect 3 -join 127.0.0.1:7001,127.0.0.1:7021
//	go run ./examples/peer -name p3 -data /tmp/lm/p3 -gossip 127.0.0.1:7021 -raft 127.0.0.1:7022 -rpc 127.0.0.1:7023 -expect 3 -join 127.0.0.1:7001,127.0.0.1:7011
//
// A peer started later with -expect 0 joins the existing cluster, which
// admits it and moves replicas onto it. With -lock KEY it takes the lock
// once it is ready (with -lock-on-usr1, once it also got SIGUSR1) and
// reports on stdout, one line each:
//
//	http NAME addr=ADDR            (with -http, once it listens; before ready)
//	ready NAME gossip=ADDR
//	acquired KEY token=N at=UNIXNANO
//	held KEY token=N at=UNIXNANO   (every -report-held interval while Done is open)
//	released KEY                   (after -hold, or when signalled while holding)
//	lost KEY: ERR                  (the lease ended before the release)
//
// The at= times are the wall clock in nanoseconds since 1970, so that lines
// of peers on one machine can be ordered. An acquired line's time is read
// after Lock returned, a held line's before Done was found open: the grant
// happened no later, and the holder still relied on the lock no earlier,
// than the time printed. A test that finds a held line later than another
// holder's acquired line has seen two holders at once.
//
// -report-serving prints, once the peer is ready and Node.WaitServing has
// returned (every lock shard answers a linearizable read through this
// peer: on a peer that hosts replicas, through its own, so they have
// caught up), before any demo action:
//
//	serving NAME
//
// docs/UPGRADING.md says to wait for it before restarting the next peer.
//
// -report-leader KEY prints, whenever this peer's view of who leads KEY's
// shard changes (checked every 10ms), where "-" means no known leader:
//
//	leader KEY shard=ID NAME at=UNIXNANO
//
// -loop N repeats lock/hold/unlock N times. -print-placement N first waits
// until gossip shows N live peers and the layout has settled over them
// (every shard has its replicas, all on live peers, and replicas per peer
// differ by at most one), then prints the layout once, as this peer sees it:
//
//	placement NAME=REPLICAS/LEADERS ...           (peers sorted by name)
//	shard ID hosts=NAME,... leader=NAME key=KEY   (a line per shard; KEY is a key in it)
//	shard ID hosts=NAME,... leader=NAME meta      (the meta shard, which holds the layout)
//	key KEY shard=ID                              (with -lock: the shard of KEY)
//
// -http ADDR serves, on ADDR (port 0 picks a free one; the http line
// names the address it got):
//
//	/metrics           lockmesh's OpenTelemetry metrics (node.Config.MeterProvider)
//	                   through the OpenTelemetry Prometheus exporter, followed by
//	                   dragonboat's Raft metrics (node.WriteRaftMetrics), as one
//	                   Prometheus text exposition
//	/debug/lockmesh/   the status page and its JSON (Node.Handler); / redirects here
//	/debug/pprof/      Go's profiles (net/http/pprof): go tool pprof http://ADDR/debug/pprof/heap
//
// docs/OBSERVABILITY.md has a Prometheus scrape config and the
// Grafana dashboard for it. The status page shows key names, peer
// addresses, sessions and fencing tokens, the profiles show stacks and
// can cost CPU while they run, and no endpoint asks who
// is calling: keep ADDR on loopback or on an operators' network, never
// public. Like the peer's other addresses, an ADDR other than loopback
// needs -insecure. Every endpoint answers only requests whose Host is a
// loopback address, localhost, ADDR's own host or a name given to
// -http-host NAME,...; any other gets 421 Misdirected Request, so a web
// page the operator visits cannot read them by pointing a name of its
// own at ADDR (DNS rebinding).
//
// -version prints the release and the feature levels it speaks, and exits:
//
//	lockmesh VERSION levels=MIN-MAX
//
// After its demo actions the peer keeps serving until SIGINT or SIGTERM,
// which unlock what it holds, close the node (its sessions end at once, so
// waiters are granted without waiting for the session TTL) and exit 0; a
// second signal kills it outright. Logs go to stderr. Bad flags exit 2; a
// peer that cannot start exits 1.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	lmconfig "github.com/lockmesh/lockmesh/internal/config"
	"github.com/lockmesh/lockmesh/internal/procs"
	"github.com/lockmesh/lockmesh/internal/release"
	"github.com/lockmesh/lockmesh/node"
)

// config is what the flags say: the node's configuration and the demo.
type config struct {
	node     node.Config
	lock     string        // key to lock once ready; empty for none
	hold     time.Duration // how long to hold it; 0 means until signalled
	loop     int           // lock/hold/unlock rounds
	logLevel slog.Level

	// lockOnUSR1 delays taking the -lock key until SIGUSR1 arrives, so a
	// test can start a peer early and have it queue at a chosen moment.
	lockOnUSR1 bool
	// reportHeld is the interval of held lines; 0 prints none.
	reportHeld time.Duration
	// reportLeader is the key whose shard leader to report; empty for none.
	reportLeader string
	// probeLevel is the key the newest feature level's call is tried on
	// every 100ms, with a level line each time the outcome changes; empty
	// for none.
	probeLevel string
	// reportServing prints a serving line once Node.WaitServing returns.
	reportServing bool

	// version prints the release and its feature levels instead of
	// running a peer.
	version bool

	// printPlacement is the number of live peers to wait for before
	// printing the settled layout; 0 prints nothing.
	printPlacement int

	// httpAddr is where to serve /metrics and the status page; empty
	// serves nothing.
	httpAddr string
	// httpHostNames are the names, besides loopback, localhost and
	// httpAddr's host, that the -http listener answers to (httpHosts).
	httpHostNames []string
}

func main() {
	// A peer process: more Ps than cores keep fsyncs from stalling the
	// Go scheduler (see internal/procs). GOMAXPROCS in the
	// environment still wins.
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
		fmt.Fprintf(stderr, "peer: %v\nRun 'peer -h' for the flags.\n", err)
		return 2
	}
	if cfg.version {
		oldest, newest := node.FeatureLevels()
		fmt.Fprintf(stdout, "lockmesh %s levels=%d-%d\n", release.Version, oldest, newest)
		return 0
	}
	cfg.node.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: cfg.logLevel}))
	// Lines come from the lock loop and the leader reporter at once.
	stdout = &lineWriter{w: stdout}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Before anything starts: a SIGUSR1 that arrives early must not kill
	// the process (its default action) but count as the go-ahead.
	usr1 := make(chan os.Signal, 1)
	if cfg.lockOnUSR1 {
		signal.Notify(usr1, syscall.SIGUSR1)
		defer signal.Stop(usr1)
	}
	// The listener is opened before the node starts, so that a taken
	// -http port fails the peer before it joins or forms a cluster.
	var (
		httpLn net.Listener
		reg    *prometheus.Registry
	)
	if cfg.httpAddr != "" {
		mp, r, err := newMeterProvider()
		if err != nil {
			fmt.Fprintf(stderr, "peer: %v\n", err)
			return 1
		}
		// Deferred before the node's Close, so it runs after it: the
		// node records into it until then.
		defer mp.Shutdown(context.Background())
		reg = r
		cfg.node.MeterProvider = mp
		cfg.node.RaftMetrics = true
		if httpLn, err = net.Listen("tcp", cfg.httpAddr); err != nil {
			fmt.Fprintf(stderr, "peer: -http: %v\n", err)
			return 1
		}
		defer httpLn.Close() // when the node fails to start; Serve closes it otherwise
	}
	n, err := node.Start(ctx, cfg.node)
	if err != nil && ctx.Err() != nil {
		return 0 // signalled while joining
	}
	if err != nil {
		fmt.Fprintf(stderr, "peer: %v\n", err)
		return 1
	}
	defer n.Close()
	// Stopped before the node is closed, on every return: a status
	// request must not ask a closing node.
	var web *httpServer
	if httpLn != nil {
		web = serveHTTP(httpLn, newHTTPHandler(n, reg, httpHosts(cfg)))
		defer web.stop()
		fmt.Fprintf(stdout, "http %s addr=%s\n", n.Name(), httpLn.Addr())
	}

	select {
	case <-n.Ready():
		fmt.Fprintf(stdout, "ready %s gossip=%s\n", n.Name(), n.GossipAddr())
	case <-ctx.Done():
	}
	if cfg.reportServing && ctx.Err() == nil {
		if err := n.WaitServing(ctx); err != nil && ctx.Err() == nil {
			fmt.Fprintf(stderr, "peer: wait serving: %v\n", err)
			return 1
		} else if err == nil {
			fmt.Fprintf(stdout, "serving %s\n", n.Name())
		}
	}
	if cfg.printPlacement > 0 && ctx.Err() == nil {
		if err := printPlacement(ctx, n, cfg.printPlacement, cfg.lock, stdout); err != nil && ctx.Err() == nil {
			fmt.Fprintf(stderr, "peer: %v\n", err)
			return 1
		}
	}
	reporting := make(chan struct{})
	if cfg.reportLeader != "" && ctx.Err() == nil {
		go func() {
			defer close(reporting)
			if err := reportLeader(ctx, n, cfg.reportLeader, stdout); err != nil && ctx.Err() == nil {
				fmt.Fprintf(stderr, "peer: report leader: %v\n", err)
			}
		}()
	} else {
		close(reporting)
	}
	if cfg.probeLevel != "" && ctx.Err() == nil {
		go probeLevel(ctx, n, cfg.probeLevel, stdout)
	}
	if cfg.lockOnUSR1 {
		select {
		case <-usr1:
		case <-ctx.Done():
		}
	}
	for i := 0; i < cfg.loop && cfg.lock != "" && ctx.Err() == nil; i++ {
		if err := lockOnce(ctx, n, cfg, stdout); err != nil {
			fmt.Fprintf(stderr, "peer: %v\n", err)
			return 1
		}
	}
	<-ctx.Done()
	stop() // a second signal kills the process if Close hangs
	<-reporting
	if err := web.stop(); err != nil {
		fmt.Fprintf(stderr, "peer: %v\n", err)
	}
	if err := n.Close(); err != nil {
		fmt.Fprintf(stderr, "peer: close: %v\n", err)
		return 1
	}
	return 0
}

// printPlacement waits until gossip shows want live peers and the layout
// has settled around them, then prints it (see the package comment).
func printPlacement(ctx context.Context, n *node.Node, want int, key string, stdout io.Writer) error {
	var shards []node.ShardInfo
	for {
		var err error
		if shards, err = n.Placement(ctx); err != nil {
			return err
		}
		if settled(shards, n.Members(), want) {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	// A sample key per lock shard, found by asking where keys live.
	sample := map[uint64]string{}
	for i := 0; len(sample) < len(shards)-1 && i < 100*len(shards); i++ {
		k := fmt.Sprintf("key-%d", i)
		info, err := n.Inspect(ctx, k)
		if err != nil {
			return err
		}
		if _, ok := sample[info.Shard]; !ok {
			sample[info.Shard] = k
		}
	}
	replicas, leaders := map[string]int{}, map[string]int{}
	var names []string
	for _, m := range n.Members() {
		if m.Alive {
			names = append(names, m.Name)
		}
	}
	var b strings.Builder
	for _, s := range shards {
		for _, r := range s.Replicas {
			replicas[r]++
		}
		leaders[s.Leader]++
		fmt.Fprintf(&b, "shard %d hosts=%s leader=%s", s.Shard, strings.Join(s.Replicas, ","), s.Leader)
		if s.Meta {
			b.WriteString(" meta")
		} else if k, ok := sample[s.Shard]; ok {
			b.WriteString(" key=" + k)
		}
		b.WriteString("\n")
	}
	if key != "" {
		info, err := n.Inspect(ctx, key)
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "key %s shard=%d\n", key, info.Shard)
	}
	slices.Sort(names)
	head := "placement"
	for _, name := range names {
		head += fmt.Sprintf(" %s=%d/%d", name, replicas[name], leaders[name])
	}
	_, err := io.WriteString(stdout, head+"\n"+b.String())
	return err
}

// settled reports whether the layout has settled over exactly want live
// peers: every shard has as many replicas as the others, at least
// min(3, want), all on live peers, and replicas per peer differ by at most
// one.
func settled(shards []node.ShardInfo, members []node.Member, want int) bool {
	count := map[string]int{}
	for _, m := range members {
		if m.Alive {
			count[m.Name] = 0
		}
	}
	if len(count) != want || len(shards) == 0 {
		return false
	}
	for _, s := range shards {
		if len(s.Replicas) != len(shards[0].Replicas) || len(s.Replicas) < min(node.DefaultReplicationFactor, want) {
			return false
		}
		for _, r := range s.Replicas {
			if _, live := count[r]; !live {
				return false
			}
			count[r]++
		}
	}
	lo, hi := -1, 0
	for _, c := range count {
		if lo < 0 || c < lo {
			lo = c
		}
		hi = max(hi, c)
	}
	return hi-lo <= 1
}

// probeLevel tries what the newest feature level brings on key, a lock
// with a value (level 4), every 100ms until ctx ends, and prints "level
// ok" or "level refused: <why>" each time the outcome changes: a cluster
// below the level refuses it, and once every peer speaks the level and
// the cluster was raised, it is granted.
func probeLevel(ctx context.Context, n *node.Node, key string, stdout io.Writer) {
	s, err := n.NewSession(ctx)
	if err != nil {
		return
	}
	defer s.Close(context.Background())
	last := ""
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		tctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		l, err := s.TryLock(tctx, key, node.WithValue([]byte("probe")))
		cancel()
		line := "level ok"
		if err != nil {
			line = "level refused: " + err.Error()
		} else {
			_ = l.Unlock(ctx)
		}
		if ctx.Err() != nil {
			return
		}
		if line != last {
			fmt.Fprintln(stdout, line)
			last = line
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// reportLeader prints a leader line for key's shard each time this peer's
// view of its leader changes, until ctx ends.
func reportLeader(ctx context.Context, n *node.Node, key string, stdout io.Writer) error {
	info, err := n.Inspect(ctx, key)
	if err != nil {
		return err
	}
	last := ""
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		shards, err := n.Placement(ctx)
		if err != nil {
			return err
		}
		for _, s := range shards {
			if s.Shard != info.Shard {
				continue
			}
			leader := cmp.Or(s.Leader, "-")
			if leader != last {
				fmt.Fprintf(stdout, "leader %s shard=%d %s at=%d\n", key, s.Shard, leader, time.Now().UnixNano())
				last = leader
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// lockOnce takes the -lock key, holds it for -hold (0: until ctx ends) or
// until its lease is lost, and releases it. A lock call cut short by ctx is
// no error.
func lockOnce(ctx context.Context, n *node.Node, cfg config, stdout io.Writer) error {
	key := cfg.lock
	l, err := n.Lock(ctx, key)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	fmt.Fprintf(stdout, "acquired %s token=%d at=%d\n", key, l.Token(), time.Now().UnixNano())

	var expired, report <-chan time.Time
	if cfg.hold > 0 {
		t := time.NewTimer(cfg.hold)
		defer t.Stop()
		expired = t.C
	}
	if cfg.reportHeld > 0 {
		t := time.NewTicker(cfg.reportHeld)
		defer t.Stop()
		report = t.C
	}
wait:
	for {
		select {
		case <-l.Done():
			fmt.Fprintf(stdout, "lost %s: %v\n", key, l.Err())
			return nil
		case <-report:
			// The time first, then the check: Done was open at a moment
			// no earlier than the time printed (see the package comment).
			at := time.Now().UnixNano()
			select {
			case <-l.Done():
				continue // reported as lost on the next round
			default:
			}
			fmt.Fprintf(stdout, "held %s token=%d at=%d\n", key, l.Token(), at)
		case <-expired:
			break wait
		case <-ctx.Done():
			break wait
		}
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
	fs.BoolVar(&nc.NoReplicas, "client", false, "client-only peer: never host replicas, forward requests (needs -join)")
	fs.BoolVar(&nc.Insecure, "insecure", false, "allow addresses other than loopback; this example has no flags for gossip encryption or TLS, so any host that reaches its ports can join and lock")
	level := fs.String("log-level", "info", "stderr log `level`: debug, info, warn or error")
	fs.StringVar(&cfg.lock, "lock", "", "once ready, lock `key` and report on stdout")
	fs.DurationVar(&cfg.hold, "hold", 0, "hold the -lock key this `duration`; 0 holds it until signalled")
	fs.IntVar(&cfg.loop, "loop", 1, "repeat lock/hold/unlock `n` times")
	fs.IntVar(&cfg.printPlacement, "print-placement", 0, "before locking, wait until `n` live peers share a settled layout and print it")
	fs.BoolVar(&cfg.lockOnUSR1, "lock-on-usr1", false, "take the -lock key only once the process gets SIGUSR1")
	fs.DurationVar(&cfg.reportHeld, "report-held", 0, "while holding the -lock key, print a held line every `interval`; 0 prints none")
	fs.BoolVar(&cfg.version, "version", false, "print the release and the feature levels it speaks, and exit")
	fs.BoolVar(&cfg.reportServing, "report-serving", false, "once ready, wait until every lock shard serves through this peer (Node.WaitServing) and print a serving line")
	fs.StringVar(&cfg.reportLeader, "report-leader", "", "print a leader line whenever this peer's view of the leader of `key`'s shard changes")
	fs.StringVar(&cfg.httpAddr, "http", "", "serve /metrics (Prometheus), the status page (/debug/lockmesh/) and Go's profiles (/debug/pprof/) on `host:port`; empty serves none. The page shows key names: never expose it publicly")
	httpHostNames := fs.String("http-host", "", "comma-separated host `names` the -http listener answers to besides loopback, localhost and -http's own host: the names operators reach it by. Requests naming any other host are refused, against DNS rebinding")
	fs.StringVar(&cfg.probeLevel, "probe-level", "", "try a lock of `key` with a value (feature level 4, the newest) every 100ms and print a level line whenever the outcome changes")

	finish = func() error {
		if cfg.version {
			return nil // nothing else is needed
		}
		for _, a := range strings.Split(*join, ",") {
			if a = strings.TrimSpace(a); a != "" {
				nc.Join = append(nc.Join, a)
			}
		}
		for _, h := range strings.Split(*httpHostNames, ",") {
			if h = strings.TrimSpace(h); h != "" {
				cfg.httpHostNames = append(cfg.httpHostNames, h)
			}
		}
		if len(cfg.httpHostNames) > 0 && cfg.httpAddr == "" {
			return errors.New("-http-host needs -http")
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
		case cfg.printPlacement < 0:
			return fmt.Errorf("-print-placement %d is negative", cfg.printPlacement)
		case cfg.loop < 1:
			return fmt.Errorf("-loop %d must be at least 1", cfg.loop)
		case cfg.reportHeld < 0:
			return fmt.Errorf("-report-held %v is negative", cfg.reportHeld)
		case cfg.lock == "" && (cfg.loop != 1 || cfg.hold != 0 || cfg.lockOnUSR1 || cfg.reportHeld != 0):
			return errors.New("-hold, -loop, -lock-on-usr1 and -report-held need -lock KEY")
		case cfg.lock != "" && len(cfg.lock) > node.MaxKeyLen:
			return fmt.Errorf("-lock key is %d bytes; at most %d", len(cfg.lock), node.MaxKeyLen)
		case len(cfg.reportLeader) > node.MaxKeyLen:
			return fmt.Errorf("-report-leader key is %d bytes; at most %d", len(cfg.reportLeader), node.MaxKeyLen)
		}
		if cfg.httpAddr != "" {
			if _, _, err := net.SplitHostPort(cfg.httpAddr); err != nil {
				return fmt.Errorf("-http %q: want host:port, as 127.0.0.1:9100: %v", cfg.httpAddr, err)
			}
			// The status page shows key names and sessions to anyone
			// who reaches it: the same rule as the peer's own ports.
			if !nc.Insecure && !lmconfig.IsLoopback(cfg.httpAddr) {
				return fmt.Errorf("-http %s is not loopback: the status page shows key names to anyone who reaches it; use a loopback address, or set -insecure on a trusted network", cfg.httpAddr)
			}
		}
		return nc.Validate()
	}
	return fs, finish
}

// lineWriter serialises writes from several goroutines; each Fprintf of a
// line is one Write, so lines never interleave.
type lineWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (lw *lineWriter) Write(p []byte) (int, error) {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	return lw.w.Write(p)
}
