package client

import (
	"sync"
	"time"
)

// Waits are this peer's queued attempts that wait with lockfsm.FlagDeadlock,
// each with the channel a refusal reaches it on. A shard's own check sees
// the cycles within the shard; a cycle across shards is found by a
// checker that reads every shard's wait graph (node) and refuses the
// victim's wait through Refuse. Safe for concurrent use.
type Waits struct {
	mu sync.Mutex
	m  map[WaiterKey]*flaggedWait
}

type flaggedWait struct {
	key    string
	since  time.Time
	refuse chan error // buffered: the first refusal is kept
}

// FlaggedWait is one queued attempt of this peer that waits with the
// flag: where (shard, session, request), for which key, and since when.
type FlaggedWait struct {
	WaiterKey
	Key   string
	Since time.Time
}

// add registers the queued attempts of one acquire (one attempt, or a
// group's) on keys, and returns the channel a refusal of any of them
// arrives on and the function that unregisters them.
func (w *Waits) add(ws []WaiterKey, keys []string, since time.Time) (<-chan error, func()) {
	refuse := make(chan error, 1)
	w.mu.Lock()
	if w.m == nil {
		w.m = map[WaiterKey]*flaggedWait{}
	}
	for i, k := range ws {
		w.m[k] = &flaggedWait{key: keys[i], since: since, refuse: refuse}
	}
	w.mu.Unlock()
	return refuse, func() {
		w.mu.Lock()
		for _, k := range ws {
			delete(w.m, k)
		}
		w.mu.Unlock()
	}
}

// Older returns the flagged waits that have waited since before t, a
// time.Now reading: waiting times are liveness, not lease timing.
func (w *Waits) Older(t time.Time) []FlaggedWait {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []FlaggedWait
	for k, f := range w.m {
		if f.since.Before(t) {
			out = append(out, FlaggedWait{WaiterKey: k, Key: f.key, Since: f.since})
		}
	}
	return out
}

// Refuse ends the flagged wait k with err, which its acquire returns
// after withdrawing the attempt; it reports whether k was still waiting.
func (w *Waits) Refuse(k WaiterKey, err error) bool {
	w.mu.Lock()
	f := w.m[k]
	w.mu.Unlock()
	if f == nil {
		return false
	}
	select {
	case f.refuse <- err:
	default:
	}
	return true
}
