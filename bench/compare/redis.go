package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"

	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/lockmesh/lockmesh/bench"
)

// redisSystem is n redis-server processes on 127.0.0.1 with appendfsync
// always (an fsync per write, the setting that makes a granted lock survive
// a crash), locked through redsync: with n=1 a single-instance lock, with
// n=3 Redlock. Redis locks carry no fencing token.
type redisSystem struct {
	name    string
	n       int
	dir     string
	procs   []*bench.Proc
	clients []*redis.Client
	rs      *redsync.Redsync
}

func newRedis(n int) bench.Factory {
	return func(env bench.Env) (bench.System, error) {
		if _, err := exec.LookPath("redis-server"); err != nil {
			return nil, fmt.Errorf("%w: redis-server not found (bash bench/install-peers.sh)", bench.ErrSkip)
		}
		name := "redis"
		if n > 1 {
			name = "redlock"
		}
		return &redisSystem{name: name, n: n, dir: env.Dir}, nil
	}
}

func (s *redisSystem) Name() string { return s.name }

func (s *redisSystem) PIDs() []int {
	var pids []int
	for _, p := range s.procs {
		pids = append(pids, p.PID())
	}
	return pids
}

func (s *redisSystem) Start(ctx context.Context) error {
	var pools []redsyncredis.Pool
	for i := range s.n {
		port, err := bench.FreePort()
		if err != nil {
			return err
		}
		dir := filepath.Join(s.dir, fmt.Sprintf("redis%d", i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		logPath := filepath.Join(s.dir, fmt.Sprintf("redis%d.log", i))
		p, err := bench.StartProc(dir, logPath, "redis-server",
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
			"--appendonly", "yes", "--appendfsync", "always", "--save", "",
			"--protected-mode", "yes", "--daemonize", "no", "--maxclients", "10000")
		if err != nil {
			return err
		}
		s.procs = append(s.procs, p)
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		for {
			err := bench.WaitTCP(ctx, addr)
			if err == nil {
				break
			}
			if p.Exited() {
				return fmt.Errorf("redis-server exited:\n%s", bench.LogTail(logPath))
			}
			return err
		}
		c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 128})
		if err := c.Ping(ctx).Err(); err != nil {
			return err
		}
		s.clients = append(s.clients, c)
		pools = append(pools, goredis.NewPool(c))
	}
	s.rs = redsync.New(pools...)
	return nil
}

func (s *redisSystem) Stop() error {
	for _, c := range s.clients {
		_ = c.Close()
	}
	for _, p := range s.procs {
		p.Stop()
	}
	s.procs = nil
	return nil
}

// NewWorker shares the connection pools: redsync mutexes are cheap objects
// over them.
func (s *redisSystem) NewWorker(id int) (bench.Worker, error) {
	return redisWorker{rs: s.rs}, nil
}

type redisWorker struct{ rs *redsync.Redsync }

// mutex uses redsync's defaults (8 s expiry, retries 50-250 ms apart) with
// enough tries that Lock waits as long as the op's context allows, as a
// blocking lock should.
func (w redisWorker) mutex(key string) *redsync.Mutex {
	return w.rs.NewMutex("lockbench:"+key, redsync.WithTries(1<<20))
}

func grant(m *redsync.Mutex) (uint64, bool, func(context.Context) error, error) {
	return 0, false, func(ctx context.Context) error {
		ok, err := m.UnlockContext(ctx)
		if err == nil && !ok {
			err = errors.New("redsync: unlock found the lock no longer ours")
		}
		return err
	}, nil
}

func (w redisWorker) Lock(ctx context.Context, key string) (uint64, bool, func(context.Context) error, error) {
	m := w.mutex(key)
	if err := m.LockContext(ctx); err != nil {
		return 0, false, nil, err
	}
	return grant(m)
}

func (w redisWorker) TryLock(ctx context.Context, key string) (uint64, bool, func(context.Context) error, error) {
	m := w.mutex(key)
	if err := m.TryLockContext(ctx); err != nil {
		var taken *redsync.ErrTaken
		if errors.Is(err, redsync.ErrFailed) || errors.As(err, &taken) {
			return 0, false, nil, fmt.Errorf("%w: %v", bench.ErrBusy, err)
		}
		return 0, false, nil, err
	}
	return grant(m)
}

func (w redisWorker) Close() error { return nil }
