package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockmesh/lockmesh/bench"
)

// ZooKeeper from Debian's zookeeper package.
const (
	zkJar  = "/usr/share/java/zookeeper.jar" // its manifest names its dependencies
	zkMain = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
)

// zkSystem is a 3-server ZooKeeper ensemble on 127.0.0.1 with forceSync
// (fsync per transaction, ZooKeeper's default, set explicitly), each server
// its own JVM.
type zkSystem struct {
	dir     string
	procs   []*bench.Proc
	servers []string
	logs    []string
}

func newZooKeeper(env bench.Env) (bench.System, error) {
	if _, err := exec.LookPath("java"); err != nil {
		return nil, fmt.Errorf("%w: java not found (bash bench/install-peers.sh)", bench.ErrSkip)
	}
	if _, err := os.Stat(zkJar); err != nil {
		return nil, fmt.Errorf("%w: %s not found (bash bench/install-peers.sh)", bench.ErrSkip, zkJar)
	}
	return &zkSystem{dir: env.Dir}, nil
}

func (s *zkSystem) Name() string { return "zookeeper" }

func (s *zkSystem) PIDs() []int {
	var pids []int
	for _, p := range s.procs {
		pids = append(pids, p.PID())
	}
	return pids
}

func (s *zkSystem) Start(ctx context.Context) error {
	const n = 3
	ports := make([][3]int, n) // client, quorum, election
	var servers []string
	for i := range ports {
		for j := range 3 {
			p, err := bench.FreePort()
			if err != nil {
				return err
			}
			ports[i][j] = p
		}
		servers = append(servers, fmt.Sprintf("server.%d=127.0.0.1:%d:%d", i+1, ports[i][1], ports[i][2]))
	}
	for i := range n {
		dir := filepath.Join(s.dir, fmt.Sprintf("zk%d", i+1))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "myid"), []byte(strconv.Itoa(i+1)+"\n"), 0o644); err != nil {
			return err
		}
		cfg := strings.Join(append([]string{
			"tickTime=2000",
			"initLimit=10",
			"syncLimit=5",
			"dataDir=" + dir,
			fmt.Sprintf("clientPort=%d", ports[i][0]),
			"clientPortAddress=127.0.0.1",
			"forceSync=yes",
			"maxClientCnxns=0",
			"admin.enableServer=false",
			"4lw.commands.whitelist=ruok,srvr",
		}, servers...), "\n") + "\n"
		cfgPath := filepath.Join(dir, "zoo.cfg")
		if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
			return err
		}
		logPath := filepath.Join(s.dir, fmt.Sprintf("zk%d.log", i+1))
		p, err := bench.StartProc(dir, logPath, "java", "-Xmx512m", "-cp", zkJar, zkMain, cfgPath)
		if err != nil {
			return err
		}
		s.procs = append(s.procs, p)
		s.logs = append(s.logs, logPath)
		s.servers = append(s.servers, fmt.Sprintf("127.0.0.1:%d", ports[i][0]))
	}
	// The ensemble serves once a leader is elected: wait until a session
	// can create and delete a node.
	for {
		err := s.probe()
		if err == nil {
			return nil
		}
		for i, p := range s.procs {
			if p.Exited() {
				return fmt.Errorf("zookeeper server %d exited:\n%s", i+1, bench.LogTail(s.logs[i]))
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("zookeeper not serving: %w (last: %v)", ctx.Err(), err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (s *zkSystem) probe() error {
	c, _, err := zk.Connect(s.servers, 5*time.Second, zk.WithLogInfo(false), zk.WithLogger(quietLogger{}))
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.Create("/lockbench", nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
		return err
	}
	return nil
}

func (s *zkSystem) Stop() error {
	for _, p := range s.procs {
		p.Stop()
	}
	s.procs = nil
	return nil
}

// NewWorker gives each worker its own ZooKeeper session, connected to the
// servers round-robin.
func (s *zkSystem) NewWorker(id int) (bench.Worker, error) {
	servers := append(append([]string{}, s.servers[id%len(s.servers):]...), s.servers[:id%len(s.servers)]...)
	c, ev, err := zk.Connect(servers, 10*time.Second, zk.WithLogInfo(false), zk.WithLogger(quietLogger{}))
	if err != nil {
		return nil, err
	}
	// Wait for the session so the first op is not charged for it.
	deadline := time.After(10 * time.Second)
	for c.State() != zk.StateHasSession {
		select {
		case <-ev:
		case <-deadline:
			c.Close()
			return nil, fmt.Errorf("zookeeper session not established")
		}
	}
	return &zkWorker{c: c}, nil
}

type quietLogger struct{}

func (quietLogger) Printf(string, ...any) {}

type zkWorker struct{ c *zk.Conn }

// The lock recipe of the ZooKeeper docs, as go-zookeeper's zk.Lock does it
// (it does not export the sequence number, the fencing token): create an
// ephemeral sequential node under the key's parent, and hold the lock when
// it is the lowest; otherwise watch the next lower one. The parent is
// created on first use, as Curator does. Keys map to one znode each.

func zkPath(key string) string { return "/lockbench/" + strings.ReplaceAll(key, "/", "_") }

func (w *zkWorker) create(parent string) (string, int, error) {
	acl := zk.WorldACL(zk.PermAll)
	for attempt := 0; ; attempt++ {
		path, err := w.c.CreateProtectedEphemeralSequential(parent+"/lock-", nil, acl)
		if errors.Is(err, zk.ErrNoNode) && attempt == 0 {
			if _, err := w.c.Create(parent, nil, 0, acl); err != nil && !errors.Is(err, zk.ErrNodeExists) {
				return "", 0, err
			}
			continue
		}
		if err != nil {
			return "", 0, err
		}
		seq, err := parseSeq(path)
		return path, seq, err
	}
}

func parseSeq(path string) (int, error) {
	i := strings.LastIndex(path, "-")
	return strconv.Atoi(path[i+1:])
}

func (w *zkWorker) lock(ctx context.Context, key string, try bool) (uint64, bool, func(context.Context) error, error) {
	parent := zkPath(key)
	path, seq, err := w.create(parent)
	if err != nil {
		return 0, false, nil, err
	}
	unlock := func(context.Context) error { return w.c.Delete(path, -1) }
	for {
		children, _, err := w.c.Children(parent)
		if err != nil {
			_ = unlock(ctx)
			return 0, false, nil, err
		}
		prev, prevSeq := "", -1
		var seqs []int
		for _, ch := range children {
			s, err := parseSeq(ch)
			if err != nil {
				continue
			}
			seqs = append(seqs, s)
			if s < seq && s > prevSeq {
				prev, prevSeq = ch, s
			}
		}
		sort.Ints(seqs)
		if prev == "" {
			return uint64(seq), true, unlock, nil
		}
		if try {
			_ = unlock(ctx)
			return 0, false, nil, fmt.Errorf("%w: %d ahead", bench.ErrBusy, len(seqs)-1)
		}
		exists, _, ch, err := w.c.ExistsW(parent + "/" + prev)
		if err != nil {
			_ = unlock(ctx)
			return 0, false, nil, err
		}
		if !exists {
			continue
		}
		select {
		case <-ch:
		case <-ctx.Done():
			_ = unlock(context.Background())
			return 0, false, nil, ctx.Err()
		}
	}
}

func (w *zkWorker) Lock(ctx context.Context, key string) (uint64, bool, func(context.Context) error, error) {
	return w.lock(ctx, key, false)
}

func (w *zkWorker) TryLock(ctx context.Context, key string) (uint64, bool, func(context.Context) error, error) {
	return w.lock(ctx, key, true)
}

func (w *zkWorker) Close() error {
	w.c.Close()
	return nil
}
