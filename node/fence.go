package node

import (
	"fmt"
	"sync"
)

// Fence is the resource side of fencing: it remembers the highest token
// seen per key and rejects lower ones, so a holder that was paused past its
// lease (and whose lock was granted again meanwhile) cannot write with its
// old token. Put a Fence (or the same check in your storage) in front of
// the protected resource. The zero Fence is ready to use.
type Fence struct {
	mu      sync.Mutex
	highest map[string]uint64
}

// Check admits token for key if it is at least the highest token seen for
// key, and records it. Equal tokens are admitted: one holder may write many
// times. A lower token returns an error wrapping ErrStaleToken.
func (f *Fence) Check(key string, token uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.highest == nil {
		f.highest = map[string]uint64{}
	}
	if h := f.highest[key]; token < h {
		return fmt.Errorf("%w: key %q token %d is below %d", ErrStaleToken, key, token, h)
	}
	f.highest[key] = token
	return nil
}

// Highest returns the highest token admitted for key, 0 if none.
func (f *Fence) Highest(key string) uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.highest[key]
}
