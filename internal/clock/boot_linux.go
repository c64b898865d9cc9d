package clock

import (
	"time"

	"golang.org/x/sys/unix"
)

// boottime reads CLOCK_BOOTTIME: CLOCK_MONOTONIC plus the time the
// machine spent suspended.
func boottime() (time.Duration, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0, err
	}
	return time.Duration(ts.Nano()), nil
}
