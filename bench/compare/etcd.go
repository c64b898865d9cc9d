package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	recipe "go.etcd.io/etcd/client/v3/experimental/recipes"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/lockmesh/lockmesh/bench"
)

// etcdSystem is a 3-member etcd cluster embedded in the bench process, with
// fsync on (etcd's default), and clients using concurrency.Mutex, and
// the experimental recipes' RWMutex for read/write locks, with one session
// (lease) per worker. etcd's client has no semaphore and no multi-key
// lock, so the semaphore and lockall workloads skip it.
type etcdSystem struct {
	dir     string
	members []*embed.Etcd
	clients []string
	cli     *clientv3.Client
}

func newEtcd(env bench.Env) (bench.System, error) { return &etcdSystem{dir: env.Dir}, nil }

func (s *etcdSystem) Name() string { return "etcd" }
func (s *etcdSystem) PIDs() []int  { return nil } // in process

func (s *etcdSystem) Start(ctx context.Context) error {
	const n = 3
	peerURL := make([]string, n)
	var initial []string
	for i := range n {
		pp, err := bench.FreePort()
		if err != nil {
			return err
		}
		cp, err := bench.FreePort()
		if err != nil {
			return err
		}
		peerURL[i] = fmt.Sprintf("http://127.0.0.1:%d", pp)
		s.clients = append(s.clients, fmt.Sprintf("127.0.0.1:%d", cp))
		initial = append(initial, fmt.Sprintf("m%d=%s", i, peerURL[i]))
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		cfg := embed.NewConfig()
		cfg.Name = fmt.Sprintf("m%d", i)
		cfg.Dir = filepath.Join(s.dir, cfg.Name)
		pu, _ := url.Parse(peerURL[i])
		cu, _ := url.Parse("http://" + s.clients[i])
		cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
		cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
		cfg.InitialCluster = strings.Join(initial, ",")
		cfg.InitialClusterToken = "lockbench"
		cfg.ClusterState = embed.ClusterStateFlagNew
		cfg.LogLevel = "error"
		cfg.LogOutputs = []string{filepath.Join(s.dir, cfg.Name+".log")}
		wg.Add(1)
		go func() {
			defer wg.Done()
			e, err := embed.StartEtcd(cfg)
			if err != nil {
				errs[i] = fmt.Errorf("member %d: %w", i, err)
				return
			}
			mu.Lock()
			s.members = append(s.members, e)
			mu.Unlock()
			select {
			case <-e.Server.ReadyNotify():
			case <-ctx.Done():
				errs[i] = fmt.Errorf("member %d not ready: %w", i, ctx.Err())
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: s.clients, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	s.cli = cli
	return nil
}

func (s *etcdSystem) Stop() error {
	if s.cli != nil {
		_ = s.cli.Close()
	}
	for _, e := range s.members {
		e.Close()
	}
	s.members = nil
	return nil
}

// NewWorker opens a session (a lease kept alive in the background) for the
// worker, on a client shared by all workers, as etcd's docs suggest.
func (s *etcdSystem) NewWorker(id int) (bench.Worker, error) {
	sess, err := concurrency.NewSession(s.cli, concurrency.WithTTL(10))
	if err != nil {
		return nil, err
	}
	return &etcdWorker{sess: sess}, nil
}

type etcdWorker struct{ sess *concurrency.Session }

// The fencing token is the revision in the header of the response that
// confirmed ownership. On the uncontended path it is the create revision of
// the worker's lock key; after waiting it is the revision of the Get that
// saw the key still there, which follows the previous holder's delete. Both
// are strictly increasing across successive holders of a key, which is what
// the checker asserts. It costs no extra round trip.
func (w *etcdWorker) grant(m *concurrency.Mutex) (uint64, bool, func(context.Context) error, error) {
	return uint64(m.Header().Revision), true, func(ctx context.Context) error { return m.Unlock(ctx) }, nil
}

func (w *etcdWorker) Lock(ctx context.Context, key string) (uint64, bool, func(context.Context) error, error) {
	m := concurrency.NewMutex(w.sess, "/lockbench/"+key)
	if err := m.Lock(ctx); err != nil {
		return 0, false, nil, err
	}
	return w.grant(m)
}

func (w *etcdWorker) TryLock(ctx context.Context, key string) (uint64, bool, func(context.Context) error, error) {
	m := concurrency.NewMutex(w.sess, "/lockbench/"+key)
	if err := m.TryLock(ctx); err != nil {
		if errors.Is(err, concurrency.ErrLocked) {
			return 0, false, nil, fmt.Errorf("%w: %v", bench.ErrBusy, err)
		}
		return 0, false, nil, err
	}
	return w.grant(m)
}

// RLock and WLock use etcd's read/write lock recipe
// (experimental/recipes.RWMutex): a reader or writer puts a key under the
// lock's prefix and waits, through a watch, for the deletion of the last
// key before it that it conflicts with. The recipe keeps its key's
// revision to itself, so its grants carry no token here.
func (w *etcdWorker) RLock(ctx context.Context, key string) (uint64, bool, func(context.Context) error, error) {
	return w.rw(ctx, key, true)
}

func (w *etcdWorker) WLock(ctx context.Context, key string) (uint64, bool, func(context.Context) error, error) {
	return w.rw(ctx, key, false)
}

// rw takes the recipe's lock. The recipe takes no context, so it runs on
// a goroutine of its own and ctx bounds the wait here; a grant that comes
// after ctx ended is given back when it comes.
func (w *etcdWorker) rw(ctx context.Context, key string, read bool) (uint64, bool, func(context.Context) error, error) {
	m := recipe.NewRWMutex(w.sess, "/lockbench/"+key)
	lock, unlock := m.Lock, m.Unlock
	if read {
		lock, unlock = m.RLock, m.RUnlock
	}
	done := make(chan error, 1)
	go func() { done <- lock() }()
	select {
	case err := <-done:
		if err != nil {
			return 0, false, nil, err
		}
		return 0, false, func(context.Context) error { return unlock() }, nil
	case <-ctx.Done():
		go func() {
			if <-done == nil {
				_ = unlock()
			}
		}()
		return 0, false, nil, ctx.Err()
	}
}

func (w *etcdWorker) Close() error { return w.sess.Close() }
