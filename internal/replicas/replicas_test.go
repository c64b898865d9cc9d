package replicas

import (
	"context"
	"errors"
	"io"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/lni/dragonboat/v4"
	sm "github.com/lni/dragonboat/v4/statemachine"
	"github.com/lni/vfs"
	"go.uber.org/goleak"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/raftnet"
	"github.com/lockmesh/lockmesh/transport/transporttest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestNodeHostConfig(t *testing.T) {
	c, err := NodeHostConfig(Config{Dir: "d", RaftAddr: "a:1", RTT: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if c.RTTMillisecond != 50 || c.NodeHostDir != "d" || c.RaftAddress != "a:1" {
		t.Fatalf("basic fields not carried: %+v", c)
	}
	// raftnet's transport, never dragonboat's, whose reader a 20-byte
	// header crashes; dragonboat's TLS stays off (raftnet does it).
	if c.MutualTLS || c.Expert.TransportFactory == nil {
		t.Fatalf("MutualTLS %v, transport %T: want raftnet's and no dragonboat TLS", c.MutualTLS, c.Expert.TransportFactory)
	}
	if tr := c.Expert.TransportFactory.Create(c, nil, nil); tr.Name() != raftnet.Name {
		t.Fatalf("transport %q, want %q", tr.Name(), raftnet.Name)
	}
	if c.Expert.LogDB.Shards != 1 {
		t.Fatalf("LogDB has %d shards, want 1 (one shared fsync)", c.Expert.LogDB.Shards)
	}
	want := uint64(min(16, max(1, runtime.NumCPU()/2)))
	if w := c.Expert.Engine.ExecShards; w != want || w != c.Expert.Engine.ApplyShards || w != c.Expert.Engine.CommitShards {
		t.Fatalf("engine workers %+v, want %d of each (one per two cores)", c.Expert.Engine, want)
	}
	// Any one file asks for mutual TLS: a half-configured set is refused
	// instead of running in plaintext.
	if _, err := NodeHostConfig(Config{CertFile: "cert.pem"}); err == nil || !strings.Contains(err.Error(), "CAFile") {
		t.Fatalf("a cert file alone: %v, want an error naming the missing CAFile", err)
	}
	ca := transporttest.NewCA(t)
	f := ca.WriteFiles(t.TempDir(), "peer-1")
	if _, err := NodeHostConfig(Config{CAFile: f.CAFile, CertFile: f.CertFile, KeyFile: f.KeyFile}); err != nil {
		t.Fatalf("good TLS files: %v", err)
	}
	// A transport the caller gives is used as is.
	fake := raftnet.Factory(raftnet.Config{})
	if c, _ := NodeHostConfig(Config{Transport: fake}); c.Expert.TransportFactory != fake {
		t.Fatal("Config.Transport not used")
	}
}

// haltingSM fails-stops at any entry whose command is "bad", as node's
// state machines do at an entry they cannot read.
type haltingSM struct {
	shard uint64
	halt  func(shard uint64, cause error)
}

var errUnreadable = errors.New("unreadable entry")

func (s *haltingSM) Update(e sm.Entry) (sm.Result, error) {
	if string(e.Cmd) == "bad" {
		s.halt(s.shard, errUnreadable)
	}
	return sm.Result{Value: 1}, nil
}
func (s *haltingSM) Lookup(any) (any, error) { return nil, nil }
func (s *haltingSM) SaveSnapshot(io.Writer, sm.ISnapshotFileCollection, <-chan struct{}) error {
	return nil
}
func (s *haltingSM) RecoverFromSnapshot(io.Reader, []sm.SnapshotFile, <-chan struct{}) error {
	return nil
}
func (s *haltingSM) Close() error { return nil }

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestReplicaLifecycle runs one replica on one NodeHost: started, it is
// listed; halted, it is stopped, no longer listed and not started again;
// removed, it is gone.
func TestReplicaLifecycle(t *testing.T) {
	stopped := make(chan uint64, 4)
	addr := freeAddr(t)
	r, err := Open(Config{Dir: "raft", RaftAddr: addr, RTT: 10 * time.Millisecond, FS: vfs.NewMem(),
		OnStop: func(shard uint64) { stopped <- shard }})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// Without a node registry dragonboat finds members by Raft address,
	// so the layout lists the peer under its address.
	p := layout.New(1, 2, 1, layout.KeySchemeHashTag, []layout.Peer{{Name: "a", NodeHostID: addr}})
	create := func(shard uint64) sm.CreateStateMachineFunc {
		return func(uint64, uint64) sm.IStateMachine { return &haltingSM{shard: shard, halt: r.Halt} }
	}
	for _, shard := range p.ShardIDs() {
		rep, ok := p.Replica(shard, "a")
		if !ok {
			t.Fatalf("layout places no replica of shard %d", shard)
		}
		if err := r.Start(p, shard, rep, create(shard)); err != nil {
			t.Fatal(err)
		}
		// Starting a running replica again is not an error.
		if err := r.Start(p, shard, rep, create(shard)); err != nil {
			t.Fatalf("second start of shard %d: %v", shard, err)
		}
	}
	if got, want := r.Count(), len(p.ShardIDs()); got != want {
		t.Fatalf("Count = %d, want %d", got, want)
	}
	lock := p.ShardIDs()[1]
	id, ok := r.Local(lock)
	if want, _ := p.ReplicaID(lock, "a"); !ok || id != want {
		t.Fatalf("Local(%d) = %d, %v; want %d", lock, id, ok, want)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for !r.Leads(lock) {
		if ctx.Err() != nil {
			t.Fatal("the one replica never led its shard")
		}
		time.Sleep(10 * time.Millisecond)
	}
	nh := r.NodeHost()
	// The entry halts the replica as it applies, and the halt stops the
	// replica in the background: the answer may come first, or the stop
	// may close the shard under the waiting proposal (seen under -race).
	// Either way the entry was applied, which the checks below show.
	if _, err := nh.SyncPropose(ctx, nh.GetNoOPSession(lock), []byte("bad")); err != nil && !errors.Is(err, dragonboat.ErrShardClosed) {
		t.Fatal(err)
	}
	if !errors.Is(r.Halted(lock), errUnreadable) || r.Hosts(lock) {
		t.Fatalf("after the halt: Halted = %v, Hosts = %v", r.Halted(lock), r.Hosts(lock))
	}
	if got := <-stopped; got != lock {
		t.Fatalf("OnStop for shard %d, want %d", got, lock)
	}
	rep, _ := p.Replica(lock, "a")
	if err := r.Start(p, lock, rep, create(lock)); !errors.Is(err, errUnreadable) {
		t.Fatalf("a halted replica was started again: %v", err)
	}

	for _, shard := range p.ShardIDs() {
		if shard == lock {
			continue
		}
		r.Remove(ctx, shard)
		if r.Hosts(shard) {
			t.Fatalf("shard %d still hosted after Remove", shard)
		}
		if got := <-stopped; got != shard {
			t.Fatalf("OnStop for shard %d, want %d", got, shard)
		}
	}
	if got := r.Running(); len(got) != 0 {
		t.Fatalf("Running = %v after every replica stopped", got)
	}
}

// A data dir keeps the step worker count dragonboat recorded in it, which
// it refuses to start with another of: one written by a release that
// sized the engine by GOMAXPROCS, or on a machine with other cores,
// opens, and a new one gets the machine's count.
func TestDataDirKeepsItsStepWorkerCount(t *testing.T) {
	dir := t.TempDir()
	hc := Config{Dir: dir, RaftAddr: freeAddr(t), RTT: 10 * time.Millisecond}
	c, err := NodeHostConfig(hc)
	if err != nil {
		t.Fatal(err)
	}
	if fresh := uint64(min(16, max(1, runtime.NumCPU()/2))); c.Expert.Engine.ExecShards != fresh {
		t.Fatalf("new data dir: %d step workers, want %d", c.Expert.Engine.ExecShards, fresh)
	}
	other := c.Expert.Engine.ExecShards + 7
	c.Expert.Engine.ExecShards, c.Expert.Engine.CommitShards, c.Expert.Engine.ApplyShards = other, other, other
	nh, err := dragonboat.NewNodeHost(c)
	if err != nil {
		t.Fatal(err)
	}
	nh.Close()

	c, err = NodeHostConfig(hc)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Expert.Engine.ExecShards; got != other {
		t.Fatalf("data dir written with %d step workers: configured %d", other, got)
	}
	nh, err = dragonboat.NewNodeHost(c)
	if err != nil {
		t.Fatalf("reopen the data dir: %v", err)
	}
	nh.Close()
}
