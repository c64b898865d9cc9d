// Package throttle rate-limits warnings about hostile or excess input, so
// that a flood of it cannot flood the log.
package throttle

import (
	"log/slog"
	"sync"
	"time"
)

// Warner lets a warning through at most once per Every, counting the ones
// it held back and reporting their number with the next one. The zero
// value lets every warning through. Safe for concurrent use.
type Warner struct {
	Every      time.Duration
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

// Warn logs msg with args on l at warn level unless one was logged less
// than Every ago.
func (t *Warner) Warn(l *slog.Logger, msg string, args ...any) {
	t.mu.Lock()
	now := time.Now()
	if !t.last.IsZero() && now.Sub(t.last) < t.Every {
		t.suppressed++
		t.mu.Unlock()
		return
	}
	n := t.suppressed
	t.last, t.suppressed = now, 0
	t.mu.Unlock()
	if n > 0 {
		args = append(args, "suppressed_since_last", n)
	}
	l.Warn(msg, args...)
}
