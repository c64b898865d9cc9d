package replica

import (
	"fmt"
	"slices"

	sm "github.com/lni/dragonboat/v4/statemachine"

	"github.com/lockmesh/lockmesh/internal/lockerr"
)

// Halter makes a replica fail-stop at the first entry or snapshot it
// cannot decode or does not understand. Skipping the entry would diverge
// from replicas that apply it; so the state machine applies nothing from
// there on, answers no reads, saves no snapshot (so the entry stays in the
// log), loads no later snapshot, and OnStop stops the replica. A peer that
// can read the entry (an upgraded one) replays it from the log when it
// restarts; a snapshot it could not load stays in its data dir and is
// loaded at that start. dragonboat serialises Update, Lookup,
// SaveSnapshot and RecoverFromSnapshot with the state machine's lock, so
// err needs no lock of its own.
//
// node fills in OnStop and SnapshotIndex; each state machine gets its own
// copy, not yet halted. The zero Halter is valid: it halts and calls
// nothing.
type Halter struct {
	err *lockerr.HaltError
	// Skip names the log indexes of entries this replica skips instead
	// of halting, if it cannot read them: the operator's recovery of a
	// shard whose log holds entries no release reads (node's
	// Config.UnsafeSkipEntries). An entry it reads is applied as usual.
	// OnSkip, when set, is told of each entry skipped.
	Skip   []uint64
	OnSkip func(shard, index uint64, cause error)
	// OnStop is called once, on dragonboat's apply or snapshot goroutine:
	// it must not block.
	OnStop func(*lockerr.HaltError)
	// SnapshotIndex returns the log index of the snapshot being loaded,
	// for the halt error; nil, or 0, when it is not known.
	SnapshotIndex func() uint64
}

// skips reports whether the entry e, which the replica of shard cannot
// read (cause), is the one it was told to skip, telling OnSkip if so.
// Every replica that skips it leaves its state as it was, so replicas
// told alike stay alike.
func (h *Halter) skips(shard uint64, e sm.Entry, cause error) bool {
	if !slices.Contains(h.Skip, e.Index) {
		return false
	}
	if h.OnSkip != nil {
		h.OnSkip(shard, e.Index, cause)
	}
	return true
}

func (h *Halter) stop(shard uint64, e sm.Entry, cause error) *lockerr.HaltError {
	h.err = &lockerr.HaltError{Shard: shard, Index: e.Index, Err: cause}
	if len(e.Cmd) > 0 {
		h.err.Version = e.Cmd[0]
	}
	if h.OnStop != nil {
		h.OnStop(h.err)
	}
	return h.err
}

// stopSnapshot halts at a snapshot the replica cannot load: version is its
// first byte, cause why it does not load.
func (h *Halter) stopSnapshot(shard uint64, version byte, cause error) *lockerr.HaltError {
	h.err = &lockerr.HaltError{Shard: shard, Version: version, Snapshot: true, Err: cause}
	if h.SnapshotIndex != nil {
		h.err.Index = h.SnapshotIndex()
	}
	if h.OnStop != nil {
		h.OnStop(h.err)
	}
	return h.err
}

// check returns, after a halt, the error that aborts a snapshot. It wraps
// sm.ErrSnapshotAborted alone: dragonboat tells an aborted save from a
// failed one (which panics the process) with cockroachdb/errors, whose Is
// follows only a single Unwrap chain, so the halt error is only text here.
func (h *Halter) check() error {
	if h.err == nil {
		return nil
	}
	return fmt.Errorf("%w: %v", sm.ErrSnapshotAborted, h.err)
}
