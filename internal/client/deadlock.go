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
	session *Session
	key     string
	since   time.Time
	refuse  chan error // buffered: the first refusal is kept
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
func (w *Waits) add(o *Session, ws []WaiterKey, keys []string, since time.Time) (<-chan error, func()) {
	refuse := make(chan error, 1)
	w.mu.Lock()
	if w.m == nil {
		w.m = map[WaiterKey]*flaggedWait{}
	}
	for i, k := range ws {
		w.m[k] = &flaggedWait{session: o, key: keys[i], since: since, refuse: refuse}
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
// time.Now reading (waiting times are liveness, not lease timing), of
// Sessions that hold a lock: a Session that holds nothing is in no cycle,
// so the waiters of a busy key that hold nothing else cost the check no
// reads.
func (w *Waits) Older(t time.Time) []FlaggedWait {
	w.mu.Lock()
	var out []FlaggedWait
	var owners []*Session
	for k, f := range w.m {
		if f.since.Before(t) {
			out = append(out, FlaggedWait{WaiterKey: k, Key: f.key, Since: f.since})
			owners = append(owners, f.session)
		}
	}
	w.mu.Unlock()
	holding := map[*Session]bool{}
	kept := out[:0]
	for i, fw := range out {
		o := owners[i]
		h, ok := holding[o]
		if !ok {
			h = o.holdsAny()
			holding[o] = h
		}
		if h {
			kept = append(kept, fw)
		}
	}
	return kept
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

// holdsAny reports whether the Session holds a lock on any shard.
func (s *Session) holdsAny() bool {
	s.mu.Lock()
	var ss []*ShardSession
	for _, sl := range s.shards {
		select {
		case <-sl.done:
			if sl.s != nil {
				ss = append(ss, sl.s)
			}
		default:
		}
	}
	s.mu.Unlock()
	for _, s := range ss {
		s.mu.Lock()
		n := len(s.held)
		s.mu.Unlock()
		if n > 0 {
			return true
		}
	}
	return false
}
