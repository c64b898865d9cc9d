// Package contention keeps, for one replica of a lock shard, what an
// operator asks of a slow or stuck lock and the replicated state does not
// record: when each grant was made and each waiter queued, and which keys
// were waited for the most. The state machine is deterministic and has no
// clock, so these are the replica's own observations, made with its local
// clock as it applies entries; every replica keeps its own, and the shard
// leader's answer.
//
// An observation is exact to within SampleGap when the replica applied the
// entry as it committed. Entries a replica applies late (replayed from its
// log after a restart, or caught up after a snapshot) and state it loaded
// from a snapshot are dated when applied and flagged "at least": the grant
// or wait began at least that long ago.
//
// Memory is bounded per shard whatever the number of keys:
//
//   - grant times are at most MaxSamples (token, time) samples: fencing
//     tokens grow with every grant of a shard, so the first sample whose
//     token reaches a grant's token dates it. Samples are merged as they
//     age, the newest kept densest, so an age is placed to within a few
//     percent of itself below the truth (a merged sample dates its
//     grants later) and SampleGap above it (grants closer than that
//     share the earlier one's time);
//   - queue times are kept for at most MaxQueued waiters; a waiter beyond
//     that has no known age;
//   - the most waited-for keys are a space-saving summary of MaxKeys
//     entries (Metwally, Agrawal and El Abbadi, 2005): a key that enters a
//     full summary takes the place of the least waited-for one and
//     inherits its count as an over-count.
//
// A Tracker is safe for concurrent use: the replica records under the
// state machine's write lock and answers queries under its read lock,
// which several queries share.
package contention

import (
	"cmp"
	"slices"
	"sync"
	"time"
)

// Bounds of a Tracker.
const (
	// MaxSamples bounds the (token, time) samples of grant times.
	MaxSamples = 256
	// SampleGap is the closest two samples get: grants less than this
	// apart share the earlier one's time.
	SampleGap = 10 * time.Millisecond
	// MaxQueued bounds the waiters whose queue time is kept.
	MaxQueued = 4096
	// MaxKeys bounds the summary of the most waited-for keys.
	MaxKeys = 64
)

// Attempt names a lock attempt of a shard: a session's request.
type Attempt struct{ Session, Req uint64 }

// Age is how long ago something began. AtLeast is true when it began
// before the replica observed it: at least Dur ago. Known is false when
// the Tracker has no record of it.
type Age struct {
	Dur     time.Duration
	AtLeast bool
	Known   bool
}

// KeyStat is one key of the summary of the most waited-for keys.
type KeyStat struct {
	Key string
	// Handoffs counts the grants to waiters recorded since the key entered
	// the summary. Wait is the summed waits of the key's hand-offs since
	// the Tracker started, Overcount included: the true sum lies between
	// Wait-Overcount and Wait.
	Handoffs  uint64
	Wait      time.Duration
	Overcount time.Duration
}

// Tracker is one replica's observations of its shard.
type Tracker struct {
	mu      sync.Mutex
	start   time.Time
	samples []sample // ascending in token and time
	queued  map[Attempt]queuedAt
	keys    []*KeyStat // the space-saving summary, unordered
	index   map[string]*KeyStat
}

type sample struct {
	token   uint64 // the shard's last token after the grants it dates
	at      time.Time
	atLeast bool // dates grants applied late, or loaded from a snapshot
}

type queuedAt struct {
	at      time.Time
	atLeast bool
}

// New returns a Tracker whose observations start at now.
func New(now time.Time) *Tracker {
	return &Tracker{start: now, queued: make(map[Attempt]queuedAt), index: make(map[string]*KeyStat)}
}

// Since is when the Tracker started observing.
func (t *Tracker) Since() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.start
}

// Loaded records that the replica loaded its state from a snapshot at
// now, with lastToken the shard's last token: the grants and waits in it
// began at least now, and what the Tracker knew before no longer applies.
// The summary of waited-for keys is kept: it counts waits that happened.
func (t *Tracker) Loaded(now time.Time, lastToken uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.samples = append(t.samples[:0], sample{token: lastToken, at: now, atLeast: true})
	clear(t.queued)
}

// Granted records that the grants up to lastToken, the shard's last
// token, were applied at now; late is true when the replica applied them
// after they committed (see the package comment).
func (t *Tracker) Granted(now time.Time, lastToken uint64, late bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if n := len(t.samples); n > 0 {
		last := &t.samples[n-1]
		if lastToken <= last.token {
			return
		}
		if now.Sub(last.at) < SampleGap && last.atLeast == late {
			last.token = lastToken
			return
		}
	}
	t.samples = append(t.samples, sample{token: lastToken, at: now, atLeast: late})
	if len(t.samples) > MaxSamples {
		t.merge(now)
	}
}

// merge drops the sample whose loss widens an age's uncertainty the
// least relative to that age: the time span between its neighbours over
// its own age. Its grants are then dated by the next sample, later, so
// ages stay lower bounds. The newest sample is never dropped.
func (t *Tracker) merge(now time.Time) {
	best, bestCost := 0, -1.0
	for i := 0; i < len(t.samples)-1; i++ {
		from := t.start
		if i > 0 {
			from = t.samples[i-1].at
		}
		span := t.samples[i+1].at.Sub(from)
		age := now.Sub(t.samples[i].at) + SampleGap
		if cost := float64(span) / float64(age); bestCost < 0 || cost < bestCost {
			best, bestCost = i, cost
		}
	}
	if t.samples[best].atLeast {
		t.samples[best+1].atLeast = true
	}
	t.samples = slices.Delete(t.samples, best, best+1)
}

// GrantAge returns how long before now the grant with token was made.
// A token the Tracker never saw granted (a grant newer than its last
// record, or a replica that has applied nothing) is not Known.
func (t *Tracker) GrantAge(now time.Time, token uint64) Age {
	t.mu.Lock()
	defer t.mu.Unlock()
	i, _ := slices.BinarySearchFunc(t.samples, token, func(s sample, tok uint64) int { return cmp.Compare(s.token, tok) })
	if i == len(t.samples) {
		return Age{}
	}
	s := t.samples[i]
	return Age{Dur: max(0, now.Sub(s.at)), AtLeast: s.atLeast, Known: true}
}

// Queued records that attempt a queued at now (late as in Granted). The
// Tracker keeps at most MaxQueued queue times: when full, it first
// forgets those of attempts waiting reports are no longer waiting, and
// then, if still full, does not keep a's.
func (t *Tracker) Queued(now time.Time, a Attempt, late bool, waiting func(Attempt) bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.queued) >= MaxQueued {
		for q := range t.queued {
			if !waiting(q) {
				delete(t.queued, q)
			}
		}
		if len(t.queued) >= MaxQueued {
			return
		}
	}
	t.queued[a] = queuedAt{at: now, atLeast: late}
}

// WaitAge returns how long before now attempt a queued.
func (t *Tracker) WaitAge(now time.Time, a Attempt) Age {
	t.mu.Lock()
	defer t.mu.Unlock()
	q, ok := t.queued[a]
	if !ok {
		return Age{}
	}
	return Age{Dur: max(0, now.Sub(q.at)), AtLeast: q.atLeast, Known: true}
}

// HandedOff records that waiting attempt a was granted key at now, and
// adds its wait to the key's count in the summary. A wait the Tracker did
// not see begin counts as a hand-off with no wait.
func (t *Tracker) HandedOff(now time.Time, a Attempt, key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var wait time.Duration
	if q, ok := t.queued[a]; ok {
		wait = max(0, now.Sub(q.at))
		delete(t.queued, a)
	}
	t.count(key, wait)
}

// Left records that waiting attempt a left the queue without a grant.
func (t *Tracker) Left(a Attempt) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.queued, a)
}

// count adds one hand-off that waited wait to key's entry of the
// space-saving summary.
func (t *Tracker) count(key string, wait time.Duration) {
	if s, ok := t.index[key]; ok {
		s.Handoffs++
		s.Wait += wait
		return
	}
	if len(t.keys) < MaxKeys {
		s := &KeyStat{Key: key, Handoffs: 1, Wait: wait}
		t.keys = append(t.keys, s)
		t.index[key] = s
		return
	}
	least := t.keys[0]
	for _, s := range t.keys[1:] {
		if s.Wait < least.Wait || (s.Wait == least.Wait && s.Handoffs < least.Handoffs) {
			least = s
		}
	}
	delete(t.index, least.Key)
	*least = KeyStat{Key: key, Handoffs: 1, Wait: least.Wait + wait, Overcount: least.Wait}
	t.index[key] = least
}

// Keys returns the summary of the most waited-for keys, most waited-for
// first (ties by key).
func (t *Tracker) Keys() []KeyStat {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]KeyStat, len(t.keys))
	for i, s := range t.keys {
		out[i] = *s
	}
	slices.SortFunc(out, func(a, b KeyStat) int {
		return cmp.Or(cmp.Compare(b.Wait, a.Wait), cmp.Compare(b.Handoffs, a.Handoffs), cmp.Compare(a.Key, b.Key))
	})
	return out
}
