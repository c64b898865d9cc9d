package clock

import (
	"strings"
	"testing"
	"time"
)

// Now never goes back, and advances by at least the time that passed:
// a sleep is counted in full.
// boot is the clock under test.
var boot Boot

func TestNowIsMonotoneAndAdvances(t *testing.T) {
	prev := boot.Now()
	for range 10000 {
		now := boot.Now()
		if now.Before(prev) {
			t.Fatalf("Now went back by %v", prev.Sub(now))
		}
		prev = now
	}
	before := boot.Now()
	time.Sleep(20 * time.Millisecond)
	if d := boot.Now().Sub(before); d < 20*time.Millisecond {
		t.Fatalf("a 20ms sleep advanced Now by %v", d)
	}
}

// Now's times carry no monotonic reading: two of them compare by the boot
// clock's count, never by Go's monotonic clock, which stops in a
// suspension (a time with both readings compares on the monotonic one).
func TestNowHasNoMonotonicReading(t *testing.T) {
	if s := boot.Now().String(); strings.Contains(s, "m=") {
		t.Fatalf("boot.Now() = %s: it carries a monotonic reading", s)
	}
	if s := time.Now().String(); !strings.Contains(s, "m=") {
		t.Fatalf("test broken: time.Now() = %s shows no monotonic reading", s)
	}
}

// A suspension, as the boot clock shows it: the clock jumps by the whole
// suspension at the next reading, though (in Go's monotonic terms)
// nothing passed.
func TestBootSinceCountsASuspension(t *testing.T) {
	boot := 5 * time.Hour // CLOCK_BOOTTIME at the first reading
	since, err := bootSince(func() (time.Duration, error) { return boot, nil })
	if err != nil {
		t.Fatal(err)
	}
	if d := since(); d != 0 {
		t.Fatalf("since() = %v at the first reading, want 0", d)
	}
	boot += time.Second
	if d := since(); d != time.Second {
		t.Fatalf("since() = %v after a second, want 1s", d)
	}
	boot += time.Hour // suspended for an hour
	if d := since(); d != time.Hour+time.Second {
		t.Fatalf("since() = %v after an hour's suspension, want 1h0m1s", d)
	}
}

// The fallback counts, from each reading to the next, the larger of the
// wall-clock and the monotonic time elapsed: a suspension the wall clock
// shows is counted, a wall step back is not, a step forward is (early is
// safe for a holder), and the count never goes back.
func TestFallback(t *testing.T) {
	wall := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	var mono time.Duration
	f := newFallback(func() (time.Time, time.Duration) { return wall, mono })
	step := func(name string, dwall, dmono, want time.Duration) {
		t.Helper()
		before := f.since()
		wall, mono = wall.Add(dwall), mono+dmono
		if got := f.since() - before; got != want {
			t.Fatalf("%s: counted %v, want %v", name, got, want)
		}
	}
	step("running", time.Second, time.Second, time.Second)
	step("suspended an hour", time.Hour, 0, time.Hour)
	step("wall stepped back an hour", -time.Hour+time.Second, time.Second, time.Second)
	step("wall stepped forward a minute", time.Minute+time.Second, time.Second, time.Minute+time.Second)
	step("wall slewed slow", 900*time.Millisecond, time.Second, time.Second)
	step("nothing passed", 0, 0, 0)
	// After the step back, a suspension is counted in full: the fallback
	// remembers no high-water mark that the wall clock must first pass.
	step("suspended a minute", time.Minute, 0, time.Minute)
}
