package replicas

import (
	"bytes"
	"context"
	"crypto/md5"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"sync"
	"time"

	"github.com/lni/dragonboat/v4"
	"github.com/lni/dragonboat/v4/config"
	"github.com/lni/dragonboat/v4/raftio"
	pb "github.com/lni/dragonboat/v4/raftpb"
	sm "github.com/lni/dragonboat/v4/statemachine"
	"github.com/lni/vfs"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/raftauth"
	"github.com/lockmesh/lockmesh/internal/raftnet"
)

// ElectionRTT is every replica's election timeout in RTTs. The leader-side
// lease rules (internal/leader, over internal/lease) count a new leader's
// grace in election timeouts of this length, read from here.
const ElectionRTT = 10

// removeDataTimeout bounds the deletion of a removed replica's data.
const removeDataTimeout = 5 * time.Second

// Config is what a peer's NodeHost and its Table are built from.
type Config struct {
	Dir      string        // where the Raft logs and snapshots live
	RaftAddr string        // the address other NodeHosts reach this one at
	RTT      time.Duration // the network's round trip; every Raft timer is a multiple of it
	FS       vfs.FS        // the file system under Dir; nil means the operating system's
	// Registry resolves NodeHostIDs to Raft addresses (mesh's, fed from
	// gossip).
	Registry config.NodeRegistryFactory
	// Transport replaces the Raft transport (tests inject faults with
	// it); nil means raftnet's TCP transport, with the TLS files below.
	Transport config.TransportFactory
	// Listener hears of leader changes, on dragonboat's goroutine.
	Listener raftio.IRaftEventListener
	// CAFile, CertFile and KeyFile enable mutual TLS between NodeHosts
	// when any is set (all three are then required).
	CAFile, CertFile, KeyFile string
	// RaftAuthorize, with TLS, decides from a peer certificate's
	// CommonName and DNS SANs whether it is an authorized member
	// (raftnet.Config.Authorize); nil accepts any certificate of the CA.
	RaftAuthorize func(names []string) bool
	// RaftPeers, when not nil, puts internal/raftauth's filter in front
	// of the Raft transport, raftnet or Transport: every message and
	// snapshot chunk that arrives is checked against the replicas this
	// peer runs and RaftPeers before dragonboat sees it. Nil passes every
	// well-formed message (the broken variant the hostile suites catch,
	// and tests of this package).
	RaftPeers RaftPeers
	Logger    *slog.Logger // nil discards
	// OnStop is called before a replica is stopped here (removed or
	// halted), with its shard, on the goroutine stopping it; node drops
	// the shard's leases there. It must not block. Nil means nothing to do.
	OnStop func(shard uint64)
	// OnRaftState, when not nil, is told the commit index each replica's
	// stored Raft state records as the replica starts: the entries up to
	// it committed before this start, and the replica applies them late
	// (node dates observations with it; see internal/contention).
	OnRaftState func(shard, replica, commit uint64)
	// OnSync, when not nil, is told how long each write of the Raft log
	// that is synced to disk took (the write and its fsync), on the step
	// worker that made it. It must not block.
	OnSync func(time.Duration)
	// RaftMetrics switches on dragonboat's own metrics (see
	// node.WriteRaftMetrics).
	RaftMetrics bool
}

// NodeHostConfig is the dragonboat configuration of c: one shared LogDB
// shard, as many engine workers as cores (see logDBConfig and
// engineConfig for the measurements behind them), and raftnet's transport
// unless c.Transport replaces it. It fails if the TLS files cannot be
// loaded.
func NodeHostConfig(c Config) (config.NodeHostConfig, error) {
	return nodeHostConfig(c, nil)
}

// nodeHostConfig is NodeHostConfig with gate, when not nil, in front of
// the transport and told of what the LogDB writes.
func nodeHostConfig(c Config, gate *raftauth.Filter) (config.NodeHostConfig, error) {
	fs := c.FS
	if fs == nil {
		fs = vfs.Default
	}
	nhc := config.NodeHostConfig{
		NodeHostDir:       c.Dir,
		RTTMillisecond:    uint64(c.RTT / time.Millisecond),
		RaftAddress:       c.RaftAddr,
		RaftEventListener: c.Listener,
		EnableMetrics:     c.RaftMetrics,
		Expert: config.ExpertConfig{
			FS:                  c.FS,
			NodeRegistryFactory: c.Registry,
			LogDB:               logDBConfig(),
			LogDBFactory:        logDBFactory{onState: c.OnRaftState, onSync: c.OnSync, gate: gate},
			Engine:              engineConfig(recordedStepWorkers(fs, c.Dir)),
		},
	}
	nhc.Expert.TransportFactory = c.Transport
	if c.Transport != nil && gate != nil {
		nhc.Expert.TransportFactory = gatedFactory{TransportFactory: c.Transport, gate: gate}
	}
	if c.Transport == nil {
		// dragonboat's MutualTLS stays off: raftnet does the TLS, and
		// dragonboat only reads MutualTLS for its own transport.
		rc := raftnet.Config{Authorize: c.RaftAuthorize, Logger: c.Logger}
		if gate != nil {
			rc.Gate = gate
		}
		if c.CAFile != "" || c.CertFile != "" || c.KeyFile != "" {
			var err error
			if rc.TLS, err = raftnet.LoadTLS(c.CAFile, c.CertFile, c.KeyFile); err != nil {
				return config.NodeHostConfig{}, err
			}
		}
		nhc.Expert.TransportFactory = raftnet.Factory(rc)
	}
	return nhc, nil
}

// logDBConfig is dragonboat's small-memory LogDB with one storage shard
// instead of 16: every Raft group of the peer then shares one write-ahead
// log, so their writes are synced together instead of one fsync per
// storage shard. Measured with 16 lock shards, 3 peers and fsync on:
// lock+unlock at 64 callers went from about 1.0k to 2.6k ops/s.
func logDBConfig() config.LogDBConfig {
	c := config.GetTinyMemLogDBConfig()
	c.Shards = 1
	return c
}

// engineConfig sizes dragonboat's execution engine: one step, commit and
// apply worker per two cores (at least 1, at most dragonboat's 16) instead
// of 16 each, counted as cores, not GOMAXPROCS (which internal/procs
// raises above the cores). Each step worker writes and syncs the updates
// of its Raft groups on its own, so fewer workers put more groups'
// updates into each LogDB write and each fsync. Measured on 2 cores with
// 16 lock shards, 3 peers, fsync on, lock+unlock at 64 callers: 16
// workers 1021 ops/s against 1538 with 2 (five alternating runs each,
// GOMAXPROCS 2); at GOMAXPROCS 8, 1 worker 0.45 disk flushes per op and
// 6.4-10.4k ops/s (mean 8.9k) against 0.73 and 6.1-8.4k (mean 7.4k) with
// 8 (four alternating runs each).
//
// dragonboat records the step worker count in the NodeHost's data dir
// and refuses to start with another one ("hard setting changed"), so a
// data dir written before keeps the count it was written with: recorded.
func engineConfig(recorded uint64) config.EngineConfig {
	c := config.GetDefaultEngineConfig()
	w := min(uint64(max(1, runtime.NumCPU()/2)), c.ExecShards)
	if recorded > 0 {
		w = recorded
	}
	c.ExecShards, c.CommitShards, c.ApplyShards = w, w, w
	return c
}

// flagFile is the file in which dragonboat records a NodeHost's hard
// settings, in the NodeHostDir (and, for its LogDB, in
// <hostname>/<deployment id>/ under it).
const flagFile = "dragonboat.ds"

// recordedStepWorkers returns the step worker count dragonboat recorded
// under dir, or 0 when it recorded none (a new data dir) or the record
// cannot be read (dragonboat then says what is wrong with it).
func recordedStepWorkers(fs vfs.FS, dir string) uint64 {
	paths := []string{fs.PathJoin(dir, flagFile)}
	hosts, _ := fs.List(dir)
	for _, h := range hosts {
		deployments, _ := fs.List(fs.PathJoin(dir, h))
		for _, d := range deployments {
			paths = append(paths, fs.PathJoin(dir, h, d, flagFile))
		}
	}
	for _, p := range paths {
		if n := readStepWorkers(fs, p); n > 0 {
			return n
		}
	}
	return 0
}

// readStepWorkers reads the step worker count of the flag file at path:
// an 8-byte checksum (the second half of the MD5 of the rest), then a
// raftpb.RaftDataStatus. It returns 0 if there is none.
func readStepWorkers(fs vfs.FS, path string) uint64 {
	f, err := fs.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, 1<<16))
	if err != nil || len(data) < 8 {
		return 0
	}
	sum := md5.Sum(data[8:])
	var st pb.RaftDataStatus
	if !bytes.Equal(data[:8], sum[8:]) || st.Unmarshal(data[8:]) != nil {
		return 0
	}
	return st.StepWorkerCount
}

// Table owns a peer's NodeHost and the table of the replicas it runs:
// at most one per shard, each either running or halted. It is safe for
// concurrent use. Halted replicas are not started again until the process
// restarts (upgraded), because their state machines stopped at an entry
// this release cannot read.
type Table struct {
	nh     *dragonboat.NodeHost
	gate   *raftauth.Filter // in front of the Raft port; nil when none
	log    *slog.Logger
	onStop func(shard uint64)

	mu      sync.Mutex
	running map[uint64]uint64 // shard -> id of the replica this peer runs
	halted  map[uint64]error  // shard -> why its replica here fail-stopped
	closed  bool              // set by Close: no more background stops
	stops   sync.WaitGroup    // stops of halted replicas under way
}

// Open starts the NodeHost of c. The caller releases it with Close.
func Open(c Config) (*Table, error) {
	log := c.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	onStop := c.OnStop
	if onStop == nil {
		onStop = func(uint64) {}
	}
	r := &Table{
		log:     log,
		onStop:  onStop,
		running: map[uint64]uint64{},
		halted:  map[uint64]error{},
	}
	// The filter reads the replica table, which is empty until replicas
	// start: until then every message is refused.
	var gate *raftauth.Filter
	if c.RaftPeers != nil {
		gate = &raftauth.Filter{View: gateView{Table: r, RaftPeers: c.RaftPeers}, Logs: &raftauth.Logs{}}
	}
	nhc, err := nodeHostConfig(c, gate)
	if err != nil {
		return nil, fmt.Errorf("start raft on %s: %w", c.RaftAddr, err)
	}
	r.gate = gate
	if r.nh, err = dragonboat.NewNodeHost(nhc); err != nil {
		return nil, fmt.Errorf("start raft on %s: %w", c.RaftAddr, err)
	}
	return r, nil
}

// RaftRefused is the number of Raft messages and snapshot chunks the
// filter in front of the Raft port refused (0 without one).
func (r *Table) RaftRefused() uint64 {
	if r.gate == nil {
		return 0
	}
	return r.gate.Refused()
}

// NodeHost is the dragonboat NodeHost the replicas run on, for proposals
// and reads. Its replicas must be started and stopped through the Table.
func (r *Table) NodeHost() *dragonboat.NodeHost { return r.nh }

// ID is the NodeHostID: the identity under which layouts list this peer.
func (r *Table) ID() string { return r.nh.ID() }

// Close waits for the stops of halted replicas under way and closes the
// NodeHost, which stops every replica (keeping their data). Call it once,
// after every caller of Start and Remove has returned.
func (r *Table) Close() {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.stops.Wait()
	r.nh.Close()
}

// ReplicaConfig is the Raft configuration of replica id of shard, as
// every lockmesh replica runs it (the bench's Raft floor runs it too).
func ReplicaConfig(shard, id uint64) config.Config {
	return config.Config{
		ShardID:            shard,
		ReplicaID:          id,
		ElectionRTT:        ElectionRTT,
		HeartbeatRTT:       1,
		CheckQuorum:        true,
		PreVote:            true,
		SnapshotEntries:    10000,
		CompactionOverhead: 5000,
	}
}

// Start starts this peer's replica rep of shard, as p places it: from its
// data if it ran here before, else by joining the running shard (a replica
// the controller added) or as one of the shard's initial members. A replica
// already running is not an error. It returns the halt error, and starts
// nothing, if the shard's replica halted here; a replica that halts while
// replaying its log is stopped again, keeping its data, and its halt error
// returned.
func (r *Table) Start(p *layout.Placement, shard uint64, rep layout.Replica, create sm.CreateStateMachineFunc) error {
	if err := r.Halted(shard); err != nil {
		return err
	}
	rc := ReplicaConfig(shard, rep.ID)
	var err error
	switch {
	case r.nh.HasNodeInfo(shard, rep.ID): // restart from local data
		err = r.nh.StartReplica(nil, false, create, rc)
	case rep.Join:
		err = r.nh.StartReplica(nil, true, create, rc)
	default:
		err = r.nh.StartReplica(p.InitialMembers(shard), false, create, rc)
	}
	if errors.Is(err, dragonboat.ErrShardAlreadyExist) {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("start replica %d of shard %d: %w", rep.ID, shard, err)
	}
	r.mu.Lock()
	halt := r.halted[shard]
	if halt == nil {
		r.running[shard] = rep.ID
	}
	r.mu.Unlock()
	if halt != nil {
		// It halted while replaying its log, before it counted as
		// running, so Halt found nothing to stop.
		r.stopHalted(shard, rep.ID)
		return halt
	}
	return nil
}

// Remove stops this peer's replica of shard and deletes its data: the
// shard no longer lists it, and its id is never used again. Nothing
// happens if no replica of shard runs here. Failures are logged: the
// replica no longer counts as running either way.
func (r *Table) Remove(ctx context.Context, shard uint64) {
	r.mu.Lock()
	id, ok := r.running[shard]
	delete(r.running, shard)
	r.mu.Unlock()
	if !ok {
		return
	}
	r.onStop(shard)
	if err := r.nh.StopReplica(shard, id); err != nil && !errors.Is(err, dragonboat.ErrShardNotFound) {
		r.log.Warn("stop replica", "shard", shard, "replica", id, "err", err)
	}
	ctx, cancel := context.WithTimeout(ctx, removeDataTimeout)
	defer cancel()
	if err := r.nh.SyncRemoveData(ctx, shard, id); err != nil {
		r.log.Warn("remove replica data", "shard", shard, "replica", id, "err", err)
	}
	r.log.Info("replica removed", "shard", shard, "replica", id)
}

// Halt records that the replica of shard fail-stopped at an entry it
// cannot read, for the reason cause, and stops it keeping its data: the
// log still holds the entry, and an upgraded peer replays it at its next
// start. It is called on dragonboat's apply goroutine, which the stop
// would wait for, so the stop runs on another goroutine (Close waits for
// it). It does not block.
func (r *Table) Halt(shard uint64, cause error) {
	r.mu.Lock()
	r.halted[shard] = cause
	id, ok := r.running[shard]
	delete(r.running, shard)
	// Once closing, the NodeHost's Close stops the replica itself.
	ok = ok && !r.closed
	if ok {
		r.stops.Add(1)
	}
	r.mu.Unlock()
	if !ok {
		return
	}
	go func() {
		defer r.stops.Done()
		r.stopHalted(shard, id)
	}()
}

// stopHalted stops the halted replica id of shard, keeping its data.
func (r *Table) stopHalted(shard, id uint64) {
	r.onStop(shard)
	if err := r.nh.StopReplica(shard, id); err != nil && !errors.Is(err, dragonboat.ErrShardNotFound) {
		r.log.Warn("stop halted replica", "shard", shard, "replica", id, "err", err)
	}
}

// Halted returns why this peer's replica of shard halted, as given to
// Halt, or nil.
func (r *Table) Halted(shard uint64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.halted[shard]
}

// Local returns the id of the replica of shard this peer runs.
func (r *Table) Local(shard uint64) (uint64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	id, ok := r.running[shard]
	return id, ok
}

// Hosts reports whether this peer runs a replica of shard.
func (r *Table) Hosts(shard uint64) bool {
	_, ok := r.Local(shard)
	return ok
}

// Count is the number of replicas running here.
func (r *Table) Count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.running)
}

// Running returns a copy of the replicas running here, shard -> replica id.
func (r *Table) Running() map[uint64]uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[uint64]uint64, len(r.running))
	for shard, id := range r.running {
		out[shard] = id
	}
	return out
}

// Leader returns the replica id this peer's NodeHost sees leading shard;
// false when it knows of no leader or runs no replica of shard.
func (r *Table) Leader(shard uint64) (uint64, bool) {
	id, _, ok, err := r.nh.GetLeaderID(shard)
	return id, err == nil && ok
}

// Leads reports whether this peer's replica of shard is its leader.
func (r *Table) Leads(shard uint64) bool {
	id, ok := r.Local(shard)
	if !ok {
		return false
	}
	lid, ok := r.Leader(shard)
	return ok && lid == id
}
