package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/lni/dragonboat/v4"
	"github.com/lni/dragonboat/v4/config"
	sm "github.com/lni/dragonboat/v4/statemachine"

	"github.com/lockmesh/lockmesh/internal/replicas"
	"github.com/lockmesh/lockmesh/node"
)

// RaftFloor is the latency of one replicated commit on this machine: one
// proposal at a time to a 3-replica Raft group of dragonboat NodeHosts
// configured as lockmesh's peers are (its LogDB, its transport, loopback
// TCP, fsync on), with a state machine that does nothing. A hand-off on a
// hot key is one such commit, so 1/P50 is the floor of hand-offs per
// second that lockmesh's contended workload is measured against.
type RaftFloor struct {
	Seconds          float64 `json:"seconds"`
	Proposals        int     `json:"proposals"`
	ProposalsPerSec  float64 `json:"proposals_per_sec"`
	P50ms            float64 `json:"p50_ms"`
	P99ms            float64 `json:"p99_ms"`
	FloorHandoffsSec float64 `json:"floor_handoffs_per_sec"` // 1 / P50
}

// measureFloor is MeasureRaftFloor in a temporary directory it removes.
func measureFloor(ctx context.Context, d time.Duration) (RaftFloor, error) {
	dir, err := os.MkdirTemp("", "lockbench-raft-floor-")
	if err != nil {
		return RaftFloor{}, err
	}
	defer os.RemoveAll(dir)
	return MeasureRaftFloor(ctx, dir, d)
}

// MeasureRaftFloor starts 3 NodeHosts with their data under dir, proposes
// on the leader's one proposal at a time for d and stops them.
func MeasureRaftFloor(ctx context.Context, dir string, d time.Duration) (RaftFloor, error) {
	const shard = 1
	var hosts []*dragonboat.NodeHost
	defer func() {
		for _, nh := range hosts {
			nh.Close()
		}
	}()
	members := map[uint64]string{}
	var cfgs []config.NodeHostConfig
	for i := uint64(1); i <= 3; i++ {
		addr, err := freeAddr()
		if err != nil {
			return RaftFloor{}, err
		}
		c, err := replicas.NodeHostConfig(replicas.Config{
			Dir: filepath.Join(dir, fmt.Sprintf("host-%d", i)), RaftAddr: addr, RTT: node.DefaultRTT,
		})
		if err != nil {
			return RaftFloor{}, err
		}
		members[i] = addr
		cfgs = append(cfgs, c)
	}
	for i, c := range cfgs {
		nh, err := dragonboat.NewNodeHost(c)
		if err != nil {
			return RaftFloor{}, err
		}
		hosts = append(hosts, nh)
		rc := replicas.ReplicaConfig(shard, uint64(i+1))
		if err := nh.StartReplica(members, false, func(uint64, uint64) sm.IStateMachine { return &nopSM{} }, rc); err != nil {
			return RaftFloor{}, err
		}
	}
	leader, err := waitLeader(ctx, hosts, shard)
	if err != nil {
		return RaftFloor{}, err
	}
	session := leader.GetNoOPSession(shard)
	cmd := make([]byte, 64) // about a lock command's size
	var lat []time.Duration
	start := time.Now()
	for time.Since(start) < d {
		binary.LittleEndian.PutUint64(cmd, uint64(len(lat)))
		t := time.Now()
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := leader.SyncPropose(pctx, session, cmd)
		cancel()
		if err != nil {
			return RaftFloor{}, fmt.Errorf("raft floor: proposal %d: %w", len(lat), err)
		}
		lat = append(lat, time.Since(t))
	}
	el := time.Since(start).Seconds()
	q := quantiles(lat, 0.5, 0.99)
	f := RaftFloor{Seconds: el, Proposals: len(lat), ProposalsPerSec: float64(len(lat)) / el, P50ms: ms(q[0]), P99ms: ms(q[1])}
	if q[0] > 0 {
		f.FloorHandoffsSec = float64(time.Second) / float64(q[0])
	}
	return f, nil
}

// waitLeader returns the NodeHost whose replica leads shard once one does.
func waitLeader(ctx context.Context, hosts []*dragonboat.NodeHost, shard uint64) (*dragonboat.NodeHost, error) {
	for {
		for _, nh := range hosts {
			id, _, ok, err := nh.GetLeaderID(shard)
			if err != nil || !ok {
				continue
			}
			// The leader is the host whose replica has that id.
			for _, h := range hosts {
				for _, si := range h.GetNodeHostInfo(dragonboat.NodeHostInfoOption{SkipLogInfo: true}).ShardInfoList {
					if si.ShardID == shard && si.ReplicaID == id {
						return h, nil
					}
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("raft floor: no leader: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// nopSM is a state machine that applies nothing: what is measured is the
// replication and the commit.
type nopSM struct{ n uint64 }

func (s *nopSM) Update(e sm.Entry) (sm.Result, error) { s.n++; return sm.Result{Value: s.n}, nil }
func (s *nopSM) Lookup(any) (any, error)              { return s.n, nil }
func (s *nopSM) SaveSnapshot(w io.Writer, _ sm.ISnapshotFileCollection, _ <-chan struct{}) error {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], s.n)
	_, err := w.Write(b[:])
	return err
}
func (s *nopSM) RecoverFromSnapshot(r io.Reader, _ []sm.SnapshotFile, _ <-chan struct{}) error {
	var b [8]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return err
	}
	s.n = binary.LittleEndian.Uint64(b[:])
	return nil
}
func (s *nopSM) Close() error { return nil }
