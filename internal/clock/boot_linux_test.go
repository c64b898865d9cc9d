package clock

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func readBoottime(t testing.TB) time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		t.Fatalf("clock_gettime(CLOCK_BOOTTIME): %v", err)
	}
	return time.Duration(ts.Nano())
}

// On Linux Now counts CLOCK_BOOTTIME, not the fallback: the time it
// counts between two readings lies within what CLOCK_BOOTTIME, read
// directly around each of them, counted.
func TestNowTracksBoottime(t *testing.T) {
	if _, err := boottime(); err != nil {
		t.Skipf("CLOCK_BOOTTIME cannot be read here (%v): Now uses the fallback", err)
	}
	b0 := readBoottime(t)
	n0 := boot.Now()
	b1 := readBoottime(t)
	time.Sleep(10 * time.Millisecond)
	b2 := readBoottime(t)
	n1 := boot.Now()
	b3 := readBoottime(t)
	if d := n1.Sub(n0); d < b2-b1 || d > b3-b0 {
		t.Fatalf("Now advanced %v; CLOCK_BOOTTIME advanced between %v and %v", d, b2-b1, b3-b0)
	}
}

func BenchmarkNow(b *testing.B) {
	for b.Loop() {
		boot.Now()
	}
}

func BenchmarkTimeNow(b *testing.B) {
	for b.Loop() {
		time.Now()
	}
}
