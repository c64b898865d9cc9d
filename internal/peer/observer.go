package peer

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// Observer is told what the peer does, for metrics and traces; node's
// telemetry implements it. Its methods must not block: most run on
// dragonboat's, the router's or the client's goroutines.
type Observer interface {
	// Tracer traces the proposals of traced calls (a no-op tracer when
	// nothing is traced).
	Tracer() trace.Tracer
	// TimesSyncs reports whether OnSync is wanted: timing every synced
	// write of the Raft log costs a clock read each.
	TimesSyncs() bool
	OnSync(d time.Duration)
	// OnRaftState records the commit index shard's local replica found in
	// its Raft state when it started; StartCommit reads it back (0 for a
	// new replica), for the replica's replay.
	OnRaftState(shard, commit uint64)
	StartCommit(shard uint64) uint64
	OnLeaderChange(shard uint64)
	// OnProposed is told of each batch proposed from this peer.
	OnProposed(shard uint64, forwarded bool, d time.Duration, err error)
	// OnKeepAlive is told of each keepalive this peer sent, from start.
	OnKeepAlive(shard uint64, start time.Time, err error)
	// OnQueued is told that the acquire of ctx queued; OnLost that a
	// session of this peer was lost with locks held.
	OnQueued(ctx context.Context)
	OnLost(shard uint64, locks int, reason string)
	// Close stops collections that read the peer; the peer calls it
	// before its parts close.
	Close()
}
