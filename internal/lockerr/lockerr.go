// Package lockerr is the error vocabulary node shares with its internal
// packages: the sentinel errors users check with errors.Is and the
// HaltError they match with errors.As (node exports each under its public
// name and documents it there), and the codes a peer puts in a
// transport.Error so the caller can tell "retry elsewhere" from
// "refused".
package lockerr

import (
	"errors"
	"fmt"
	"strings"

	"github.com/lockmesh/lockmesh/lockfsm"

	"github.com/lockmesh/lockmesh/transport"
)

// Sentinel errors; node.ErrClosed and the others are these values.
var (
	Locked        = errors.New("lockmesh: key is locked")
	LeaseExpired  = errors.New("lockmesh: lease expired")
	NotHeld       = errors.New("lockmesh: lock not held")
	SessionClosed = errors.New("lockmesh: session closed")
	AlreadyHeld   = errors.New("lockmesh: key already held by this session")
	Closed        = errors.New("lockmesh: node closed")
	Unavailable   = errors.New("lockmesh: shard unavailable")
	// InvalidKey is a key no lock can have (lockfsm.ValidateKey): empty
	// or longer than lockfsm.MaxKeyLen.
	InvalidKey    = errors.New("lockmesh: invalid key")
	ReplicaHalted = errors.New("lockmesh: replica halted")
	// NotReady means this peer does not know the cluster's layout yet.
	NotReady = errors.New("lockmesh: not ready: the cluster layout is not known yet")
	// The lock family's refusals.
	Deadlock      = errors.New("lockmesh: deadlock")
	LimitMismatch = errors.New("lockmesh: semaphore limit mismatch")
	KindMismatch  = errors.New("lockmesh: key is in use as another kind of lock")

	// InvalidConfig and Incompatible are node.ErrInvalidConfig and
	// node.ErrIncompatible: the running peer (internal/peer) returns them.
	InvalidConfig = errors.New("lockmesh: invalid config")
	Incompatible  = errors.New("lockmesh: incompatible version")
)

// LockedError is a refused try (TryLock, TryRLock, TryAcquire): it wraps
// Locked and names the key's holders when the cluster said who they are
// (from feature level 3). node exports its own form, with node.Holder.
type LockedError struct {
	Key     string
	Holders []lockfsm.Holder
}

func (e *LockedError) Error() string {
	if len(e.Holders) == 0 {
		return fmt.Sprintf("lock %q: %v", e.Key, Locked)
	}
	var b strings.Builder
	for i, h := range e.Holders {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s (token %d)", h.Owner, h.Token)
	}
	return fmt.Sprintf("lock %q: %v: held by %s", e.Key, Locked, b.String())
}

// Unwrap returns Locked.
func (e *LockedError) Unwrap() error { return Locked }

// Application error codes carried in transport.Error.
const (
	CodeNotHosted    uint16 = 100 + iota // this peer has no replica of the shard
	CodeBusy                             // retryable: shard not ready, timeout, system busy
	CodeRejected                         // bootstrap plan refused
	CodeNoCluster                        // this peer is not part of a cluster yet
	CodeClosed                           // the peer is shutting down
	CodeIncompatible                     // the caller does not speak the cluster's feature level
	CodeForbidden                        // the caller may not do this (internal/authz)
)

// RPC builds a transport error the caller can classify by code.
func RPC(code uint16, format string, args ...any) error {
	return &transport.Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Code returns the application code of a transport error in err's chain,
// or 0.
func Code(err error) uint16 {
	var te *transport.Error
	if errors.As(err, &te) {
		return te.Code
	}
	return 0
}

// HaltError says where and why a replica stopped applying its shard's log:
// at an entry, or at a snapshot, it could not read. It wraps ReplicaHalted
// and the decoding error. node exports it as node.HaltError, where its use
// is documented.
type HaltError struct {
	Shard uint64 // the shard (1 is the meta shard)
	// Index is the log index of the entry it could not apply, or of the
	// snapshot it could not load (0 if dragonboat did not say).
	Index    uint64
	Version  byte  // the entry's or snapshot's format version byte
	Snapshot bool  // it halted at a snapshot, not at an entry
	Err      error // why it could not be decoded
}

func (e *HaltError) Error() string {
	if e.Snapshot {
		return fmt.Sprintf("lockmesh: replica halted: shard %d could not load the snapshot at log index %d (snapshot format version %d): %v; "+
			"upgrade this peer: its replica loads the snapshot from its data dir once it can read it", e.Shard, e.Index, e.Version, e.Err)
	}
	return fmt.Sprintf("lockmesh: replica halted: shard %d stopped applying at log index %d (entry format version %d): %v; "+
		"upgrade this peer: its replica replays the entry from its log once it can read it", e.Shard, e.Index, e.Version, e.Err)
}

// Unwrap returns ReplicaHalted and the decoding error.
func (e *HaltError) Unwrap() []error { return []error{ReplicaHalted, e.Err} }
