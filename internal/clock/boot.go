package clock

import (
	"sync"
	"time"
)

// Boot is the clock a lock holder counts its deadlines on: a clock that
// goes on counting while the machine is suspended, with Go's timers.
//
// Go's monotonic clock (the monotonic reading of time.Now, and Go's
// timers) is CLOCK_MONOTONIC on Linux and mach_absolute_time on macOS, and
// neither advances while the machine is suspended: a laptop with its lid
// shut, a VM suspended to memory. A holder that counted its lease on it
// would wake from a suspension longer than its TTL still trusting a lock
// whose session the rest of the cluster, which kept running, has expired
// and granted to someone else: two holders. CLOCK_BOOTTIME is
// CLOCK_MONOTONIC plus the time spent suspended: the same rate, the same
// indifference to steps of the wall clock, and a resume moves it forward
// by the whole suspension.
//
// Boot's Now returns the wall time at the package's first reading plus the
// CLOCK_BOOTTIME elapsed since. Its times carry no monotonic reading, so
// Sub, Before and After compare them by that count, and they are meant to
// be compared only with each other: compared with a time from time.Now
// they compare as wall-clock times, which drift apart from these with
// every step of the wall clock.
//
// Where CLOCK_BOOTTIME cannot be read (other systems, or a sandbox that
// refuses it), it counts, from each reading to the next, the larger of
// the monotonic and the wall-clock time elapsed. It never counts less than
// Go's monotonic clock, and it counts a suspension as far as the wall
// clock shows it, which the system sets from its hardware clock or the
// network on waking. A step of the wall clock forward is counted (a
// holder's deadlines pass early, which is safe); a step back is not (the
// monotonic time counts instead). Only a step back that falls between the
// same two readings as a suspension is taken off it.
//
// So the clock may run fast, never slow: right for a holder, which must
// give its lease up no later than really due. The leader's side of a
// lease needs the opposite, a clock that never runs fast (it must not
// expire a session early), and keeps Go's monotonic clock: a leader that
// was suspended only expires late. docs/SAFETY.md has the argument.
//
// Its timers are Go's, which stop during a suspension and so fire late
// after one: whoever waits on them compares the deadline with Now again.
type Boot struct{}

// Now returns the current time on the boot clock: it has advanced, since
// any earlier reading, by at least the time that really passed,
// suspensions of the machine included. Compare it only with other
// readings of Boot's Now.
func (Boot) Now() time.Time { return base.Add(since()) }

// AfterFunc is time.AfterFunc.
func (Boot) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// base is the wall time of the package's first reading, without its
// monotonic reading, and since is the time counted from then.
var base, since = start()

func start() (time.Time, func() time.Duration) {
	b := time.Now().Round(0)
	if s, err := bootSince(boottime); err == nil {
		return b, s
	}
	return b, newFallback(systemReading).since
}

// bootSince returns the time read counts from this call on; read is
// CLOCK_BOOTTIME, in tests a fake.
func bootSince(read func() (time.Duration, error)) (func() time.Duration, error) {
	first, err := read()
	if err != nil {
		return nil, err
	}
	return func() time.Duration {
		now, err := read()
		if err != nil {
			// clock_gettime fails only for a clock the kernel does
			// not know or a bad address; this clock was read above.
			panic("clock: boot clock: " + err.Error())
		}
		return now - first
	}, nil
}

// fallback counts, from each reading to the next, the larger of the
// wall-clock and the monotonic time elapsed. Safe for concurrent use.
type fallback struct {
	read func() (wall time.Time, mono time.Duration)

	mu      sync.Mutex
	wall    time.Time     // the last reading
	mono    time.Duration // the last reading
	elapsed time.Duration // counted up to the last reading
}

// systemReading is the wall-clock time, without a monotonic reading, and
// the monotonic time since the package started.
func systemReading() (time.Time, time.Duration) {
	now := time.Now()
	return now.Round(0), now.Sub(monoStart)
}

var monoStart = time.Now()

func newFallback(read func() (time.Time, time.Duration)) *fallback {
	f := &fallback{read: read}
	f.wall, f.mono = read()
	return f
}

// since returns the time counted from the first reading. It reads under
// mu, so readings are counted in the order they were taken.
func (f *fallback) since() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	wall, mono := f.read()
	f.elapsed += max(mono-f.mono, wall.Sub(f.wall), 0)
	f.wall, f.mono = wall, mono
	return f.elapsed
}
