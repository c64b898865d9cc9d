package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/lockmesh/lockmesh/node"
)

func init() {
	Register("lockmesh-3proc", newLockmesh3Proc)
}

// lockmesh3Proc is lockmesh as 3 server processes (examples/peer, built
// once per system from this module's source) on fixed loopback ports with
// their data on disk (fsync on) and the default RTT and TTL, plus one
// client-only node (Config.NoReplicas) in the bench process through which
// every worker locks. The client hosts no replica, so every op crosses a
// process boundary over loopback TCP, as it does for an application that
// embeds a client-only peer next to a separate lockmesh cluster.
type lockmesh3Proc struct {
	dir    string
	bin    string // the built examples/peer
	procs  []*Proc
	logs   []string
	client *node.Node
	// http makes each server serve -http on a free loopback port
	// (HTTPAddrs), for the footprint's heap profiles.
	http bool
}

// peerModule is the module whose examples/peer is built.
const peerModule = "github.com/lockmesh/lockmesh"

// newLockmesh3Proc builds examples/peer into env.Dir, outside the timed
// start-up. Without a go command or the module's source it skips.
func newLockmesh3Proc(env Env) (System, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return nil, fmt.Errorf("%w: lockmesh-3proc builds examples/peer and needs the go command: %v", ErrSkip, err)
	}
	root, err := moduleRoot(goBin)
	if err != nil {
		return nil, fmt.Errorf("%w: lockmesh-3proc: %v", ErrSkip, err)
	}
	bin := filepath.Join(env.Dir, "peer")
	cmd := exec.Command(goBin, "build", "-o", bin, "./examples/peer")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build ./examples/peer in %s: %v\n%s", root, err, out)
	}
	return &lockmesh3Proc{dir: env.Dir, bin: bin}, nil
}

// moduleRoot finds the source of the lockmesh module: the directory above
// this file when the build kept its path (go run, go test), else what the
// go command in the working directory resolves the module to (bench/compare
// replaces it with ../..).
func moduleRoot(goBin string) (string, error) {
	isRoot := func(dir string) bool {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err != nil {
			return false
		}
		first, _, _ := strings.Cut(string(b), "\n")
		return strings.TrimSpace(first) == "module "+peerModule
	}
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		if dir := filepath.Dir(filepath.Dir(file)); isRoot(dir) {
			return dir, nil
		}
	}
	out, err := exec.Command(goBin, "list", "-m", "-f", "{{.Dir}}", peerModule).Output()
	if dir := strings.TrimSpace(string(out)); err == nil && dir != "" && isRoot(dir) {
		return dir, nil
	}
	return "", fmt.Errorf("cannot find the source of %s (run from its checkout): %v", peerModule, err)
}

func (s *lockmesh3Proc) Name() string { return "lockmesh-3proc" }

// PIDs are the 3 server processes; the client node is in the bench
// process, which the harness always counts.
func (s *lockmesh3Proc) PIDs() []int {
	var pids []int
	for _, p := range s.procs {
		pids = append(pids, p.PID())
	}
	return pids
}

func (s *lockmesh3Proc) Start(ctx context.Context) error {
	const n = 3
	type addrs struct{ gossip, raft, rpc string }
	peers := make([]addrs, n)
	for i := range peers {
		for _, a := range []*string{&peers[i].gossip, &peers[i].raft, &peers[i].rpc} {
			var err error
			if *a, err = freeAddr(); err != nil {
				return err
			}
		}
	}
	var gossips []string
	for _, p := range peers {
		gossips = append(gossips, p.gossip)
	}
	for i, p := range peers {
		name := fmt.Sprintf("peer-%d", i+1)
		var others []string
		for j, g := range gossips {
			if j != i {
				others = append(others, g)
			}
		}
		logPath := filepath.Join(s.dir, name+".log")
		args := []string{"-name", name,
			"-data", filepath.Join(s.dir, name),
			"-gossip", p.gossip, "-raft", p.raft, "-rpc", p.rpc,
			"-expect", fmt.Sprint(n),
			"-join", strings.Join(others, ",")}
		if s.http {
			args = append(args, "-http", "127.0.0.1:0")
		}
		proc, err := StartProc(s.dir, logPath, s.bin, args...)
		if err != nil {
			return err
		}
		s.procs = append(s.procs, proc)
		s.logs = append(s.logs, logPath)
	}
	// Each peer prints "ready NAME gossip=ADDR" once the layout is known.
	for i, proc := range s.procs {
		want := []byte(fmt.Sprintf("ready peer-%d gossip=", i+1))
		for {
			b, _ := os.ReadFile(s.logs[i])
			if bytes.Contains(b, want) {
				break
			}
			if proc.Exited() {
				return fmt.Errorf("peer-%d exited before it was ready:\n%s", i+1, LogTail(s.logs[i]))
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("peer-%d not ready: %w\n%s", i+1, ctx.Err(), LogTail(s.logs[i]))
			case <-time.After(50 * time.Millisecond):
			}
		}
	}

	raft, err := freeAddr()
	if err != nil {
		return err
	}
	c, err := node.Start(ctx, node.Config{
		Name:       "bench-client",
		DataDir:    filepath.Join(s.dir, "bench-client"),
		GossipAddr: "127.0.0.1:0",
		RaftAddr:   raft,
		RPCAddr:    "127.0.0.1:0",
		Join:       gossips,
		NoReplicas: true,
	})
	if err != nil {
		return fmt.Errorf("start client-only node: %w", err)
	}
	s.client = c
	select {
	case <-c.Ready():
	case <-ctx.Done():
		return fmt.Errorf("client-only node not ready: %w", ctx.Err())
	}
	// As for in-process lockmesh, start-up includes serving: one lock on
	// keys that land on several shards, so the first elections are over.
	for i := range 2 * node.DefaultShards {
		l, err := c.Lock(ctx, fmt.Sprintf("bench/start/%d", i))
		if err != nil {
			return fmt.Errorf("first lock through the client-only node: %w", err)
		}
		if err := l.Unlock(ctx); err != nil {
			return fmt.Errorf("first unlock through the client-only node: %w", err)
		}
	}
	return nil
}

// HTTPAddrs returns the servers' -http addresses, from the "http NAME
// addr=ADDR" lines they printed; empty without http.
func (s *lockmesh3Proc) HTTPAddrs() []string {
	var addrs []string
	for i, log := range s.logs {
		b, _ := os.ReadFile(log)
		prefix := fmt.Sprintf("http peer-%d addr=", i+1)
		for line := range strings.Lines(string(b)) {
			if a, ok := strings.CutPrefix(strings.TrimSpace(line), prefix); ok {
				addrs = append(addrs, a)
			}
		}
	}
	return addrs
}

// Settle waits until the servers' controller has evened out shard
// leadership, as for in-process lockmesh: the client-only node learns who
// leads each shard by asking the servers (Node.Placement).
func (s *lockmesh3Proc) Settle(ctx context.Context) error {
	if s.client == nil {
		return errors.New("lockmesh-3proc is not started")
	}
	return WaitSettled(ctx, s.client, 2*time.Second)
}

// Stop closes the client node (ending its session at once), then stops the
// servers by pid together: SIGTERM, SIGKILL after 5 s.
func (s *lockmesh3Proc) Stop() error {
	var err error
	if s.client != nil {
		err = s.client.Close()
		s.client = nil
	}
	var wg sync.WaitGroup
	for _, p := range s.procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.Stop()
		}()
	}
	wg.Wait()
	s.procs = nil
	return err
}

// NewWorker hands every worker the one client-only node.
func (s *lockmesh3Proc) NewWorker(int) (Worker, error) {
	if s.client == nil {
		return nil, errors.New("lockmesh-3proc is not started")
	}
	return &lockmeshWorker{n: s.client}, nil
}
