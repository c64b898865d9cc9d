//go:build !linux

package clock

import (
	"errors"
	"time"
)

// boottime is Linux's; elsewhere Now uses the fallback.
func boottime() (time.Duration, error) { return 0, errors.ErrUnsupported }
