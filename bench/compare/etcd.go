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
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/lockmesh/lockmesh/bench"
)

// etcdSystem is a 3-member etcd cluster embedded in the bench process, with
// fsync on (etcd's default), and clients using concurrency.Mutex with one
// session (lease) per worker.
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

func (w *etcdWorker) Close() error { return w.sess.Close() }
