// Package clock is lockmesh's time: the Clock every lease deadline and
// expiry is counted on, and the two a real peer runs on.
//
// A Clock's readings are compared only with each other, and the time
// between two must never count less than really passed on the holder's
// side (whatever the wall clock did and however long the machine was
// suspended meanwhile), or a holder would rely on a lease the cluster has
// expired; on the leader's side it must never count more, or a leader
// would expire a session early. So the two sides run on different clocks,
// each erring the safe way for its side (docs/SAFETY.md): the holder on
// Boot, the leader on System. Tests inject their own Clock, with skew,
// jumps and suspensions.
package clock

import "time"

// Clock is a time source with timers. AfterFunc runs f once d has passed,
// on a goroutine of its own, as time.AfterFunc does; f may block briefly
// on its caller's locks.
type Clock interface {
	Now() time.Time
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a timer started by Clock.AfterFunc; *time.Timer is one.
type Timer interface {
	Reset(d time.Duration) bool
	Stop() bool
}

// System is Go's monotonic clock and Go's timers. Neither advances while
// the machine is suspended, so a leader on it expires late after a
// suspension, never early; the keepalive rounds are timed on it too.
type System struct{}

// Now returns time.Now().
func (System) Now() time.Time { return time.Now() }

// AfterFunc is time.AfterFunc.
func (System) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }
