package lockfsm

import (
	"fmt"
)

// What an Acquire asks of its key: its kind (and so the key's role), its
// flags, and the lock family's limits. The family — read/write locks,
// counting semaphores and all-or-nothing groups of acquires (group.go),
// refusals that name the holders, and waits refused when they could never
// be granted (deadlock.go) — follows rules (acquire.go) each of which is
// decided by the entry alone (its commands' Kind, Group and Flags, written
// only from feature level 3 on), never by the release applying it, so
// replicas of different releases that can read an entry apply it alike.

// Kind is what an Acquire asks of its key (Command.Kind).
type Kind uint8

// Acquire kinds.
const (
	// KindMutex holds a mutex key, with up to Limit holders (0 means 1):
	// the only kind before feature level 3.
	KindMutex Kind = iota
	// KindRead holds a read/write key shared with other readers.
	KindRead
	// KindWrite holds a read/write key alone.
	KindWrite
	// KindSemaphore holds Permits of a semaphore key's Limit permits.
	KindSemaphore

	maxKind = KindSemaphore
)

// String returns the kind's name.
func (k Kind) String() string {
	switch k {
	case KindMutex:
		return "mutex"
	case KindRead:
		return "read"
	case KindWrite:
		return "write"
	case KindSemaphore:
		return "semaphore"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// role is what a key is while anybody holds or waits for it.
type role uint8

const (
	roleMutex role = iota
	roleRW
	roleSemaphore
)

func roleOf(k Kind) role {
	switch k {
	case KindRead, KindWrite:
		return roleRW
	case KindSemaphore:
		return roleSemaphore
	}
	return roleMutex
}

// kindName is the kind that names the role in KeyInfo.Role.
func (r role) kindName() Kind {
	switch r {
	case roleRW:
		return KindWrite
	case roleSemaphore:
		return KindSemaphore
	}
	return KindMutex
}

func (r role) String() string {
	switch r {
	case roleRW:
		return "read/write lock"
	case roleSemaphore:
		return "semaphore"
	}
	return "mutex"
}

// Flags ask more of an Acquire (Command.Flags).
type Flags uint8

const (
	// FlagDetail answers a refused Acquire (StatusLocked) with the key's
	// holders (Result.Holders), so the caller needs no second read.
	FlagDetail Flags = 1 << iota
	// FlagDeadlock refuses, with StatusDeadlock, an Acquire that would
	// wait for ever: its session counts as one thread of control, which
	// releases nothing while it waits, and so does every session waiting
	// with the flag; every other session is taken to release what it
	// holds, some time. The check plays the queues forward under those
	// rules (see deadlock.go), so a cycle through a holder, a waiter
	// queued ahead, a group or a semaphore's permits — the session's own
	// included — is refused, and a wait that some release would end is
	// not. Err names the cycle by Session label.
	FlagDeadlock

	knownFlags = FlagDetail | FlagDeadlock
)

// Limits of the lock family.
const (
	// MaxGroup is the most Acquires one all-or-nothing group may hold.
	MaxGroup = 64
	// maxDetailHolders is the most holders a refusal names.
	maxDetailHolders = 16
	// maxCycleSearch bounds the keys and sessions a deadlock check
	// plays; a check that would need more refuses nothing.
	maxCycleSearch = 4096
	// maxPlayAttempts bounds the holders and waiters a deadlock check
	// plays; a check that would need more refuses nothing.
	maxPlayAttempts = 16384
)
