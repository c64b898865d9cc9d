package raftnet

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/lni/dragonboat/v4"
	"github.com/lni/dragonboat/v4/config"
	sm "github.com/lni/dragonboat/v4/statemachine"
	"github.com/lni/vfs"

	"github.com/lockmesh/lockmesh/transport/transporttest"
)

// counter is a state machine that counts the entries it applies.
type counter struct{ n uint64 }

func (c *counter) Update(sm.Entry) (sm.Result, error) { c.n++; return sm.Result{Value: c.n}, nil }
func (c *counter) Lookup(any) (any, error)            { return c.n, nil }
func (c *counter) SaveSnapshot(io.Writer, sm.ISnapshotFileCollection, <-chan struct{}) error {
	return nil
}
func (c *counter) RecoverFromSnapshot(io.Reader, []sm.SnapshotFile, <-chan struct{}) error {
	return nil
}
func (c *counter) Close() error { return nil }

func loopbackAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestInteropWithDragonboatTCP runs a shard of two replicas, one on a
// NodeHost with raftnet and one on a NodeHost with dragonboat's own TCP
// transport (the previous release), plaintext and with mutual TLS from
// the same PEM files: proposals through either commit on both, so Raft
// messages cross in both directions during a rolling upgrade.
func TestInteropWithDragonboatTCP(t *testing.T) {
	for _, withTLS := range []bool{false, true} {
		name := "plaintext"
		if withTLS {
			name = "TLS"
		}
		t.Run(name, func(t *testing.T) {
			ca := transporttest.NewCA(t)
			dir := t.TempDir()
			addrs := map[uint64]string{1: loopbackAddr(t), 2: loopbackAddr(t)}
			var hosts []*dragonboat.NodeHost
			for id := uint64(1); id <= 2; id++ {
				nhc := config.NodeHostConfig{
					NodeHostDir:    "nh",
					RTTMillisecond: 10,
					RaftAddress:    addrs[id],
					Expert:         config.ExpertConfig{FS: vfs.NewMem(), LogDB: config.GetTinyMemLogDBConfig()},
				}
				f := ca.WriteFiles(dir, map[uint64]string{1: "member-1", 2: "member-2"}[id])
				if id == 1 { // this release
					cfg := Config{Authorize: members}
					if withTLS {
						tc, err := LoadTLS(f.CAFile, f.CertFile, f.KeyFile)
						if err != nil {
							t.Fatal(err)
						}
						cfg.TLS = tc
					}
					nhc.Expert.TransportFactory = Factory(cfg)
				} else if withTLS { // the previous release
					nhc.MutualTLS, nhc.CAFile, nhc.CertFile, nhc.KeyFile = true, f.CAFile, f.CertFile, f.KeyFile
				}
				nh, err := dragonboat.NewNodeHost(nhc)
				if err != nil {
					t.Fatal(err)
				}
				defer nh.Close()
				hosts = append(hosts, nh)
				rc := config.Config{ShardID: 1, ReplicaID: id, ElectionRTT: 10, HeartbeatRTT: 1}
				if err := nh.StartReplica(addrs, false, func(uint64, uint64) sm.IStateMachine { return &counter{} }, rc); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			for _, nh := range hosts {
				for {
					_, err := nh.SyncPropose(ctx, nh.GetNoOPSession(1), []byte("x"))
					if err == nil {
						break
					}
					if ctx.Err() != nil {
						t.Fatalf("no proposal through %s committed: %v", nh.RaftAddress(), err)
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
			for _, nh := range hosts {
				for {
					v, err := nh.StaleRead(1, nil)
					if err == nil && v.(uint64) >= 2 {
						break
					}
					if ctx.Err() != nil {
						t.Fatalf("%s applied %v entries, want both proposals", nh.RaftAddress(), v)
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
		})
	}
}
