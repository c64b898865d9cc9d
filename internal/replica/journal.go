package replica

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"sync"

	"github.com/lockmesh/lockmesh/lockfsm"
)

// JournalEvents is the most events a replica's Journal keeps, and
// JournalBytes the most bytes of them (EventSize: the keys, owners and
// values they name count, which a released hold's or a replaced value's
// no longer share with the state). A watch that falls further behind is
// resynced.
const (
	JournalEvents = 1 << 14
	JournalBytes  = 4 << 20
)

// Journal is what a lock replica remembers of the events of the entries
// it applied most recently (lockfsm.ApplyEvents), for watches: every
// entry from First to Last is in it, those with events as a Batch. It
// starts empty, at the index of the state the replica starts from, and
// begins again when the replica loads a snapshot. It is safe for
// concurrent use: the replica appends on its apply goroutine, watches
// read on theirs.
type Journal struct {
	limit   int // the most events it keeps
	mu      sync.Mutex
	first   uint64  // the first index the journal covers (last+1 when empty)
	last    uint64  // the last index applied
	batches []Batch // in index order, each with events
	events  int     // in batches
	bytes   int     // their EventSize
	// changed is closed when last moves, for Wait; nil until a watch
	// waits.
	changed chan struct{}
}

// Batch is the events of one entry, in the order the entry made them.
type Batch struct {
	Index  uint64          `msgpack:"i"`
	Events []lockfsm.Event `msgpack:"e"`
}

// NewJournal returns an empty journal that keeps at most limit events (0:
// JournalEvents).
func NewJournal(limit int) *Journal {
	if limit <= 0 {
		limit = JournalEvents
	}
	return &Journal{limit: limit, first: 1}
}

// add records the events of the entry at index, which follows the last.
func (j *Journal) add(index uint64, events []lockfsm.Event) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.last = index
	if len(events) > 0 {
		j.batches = append(j.batches, Batch{Index: index, Events: events})
		j.events += len(events)
		j.bytes += batchSize(events)
		for (j.events > j.limit || j.bytes > JournalBytes) && len(j.batches) > 1 {
			j.events -= len(j.batches[0].Events)
			j.bytes -= batchSize(j.batches[0].Events)
			j.first = j.batches[0].Index + 1
			j.batches[0] = Batch{}
			j.batches = j.batches[1:]
		}
	}
	j.wake()
}

// reset empties the journal at index: the replica loaded a snapshot of
// that index, so what came before is not known here.
func (j *Journal) reset(index uint64) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.first, j.last, j.batches, j.events, j.bytes = index+1, index, nil, 0, 0
	j.wake()
}

func (j *Journal) wake() {
	if j.changed != nil {
		close(j.changed)
		j.changed = nil
	}
}

// Last returns the index of the last entry the journal covers.
func (j *Journal) Last() uint64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.last
}

// EventSize is about how many bytes e takes in an answer: what Since's
// limit counts.
func EventSize(e *lockfsm.Event) int { return len(e.Key) + len(e.Owner) + len(e.Value) + 64 }

func batchSize(events []lockfsm.Event) int {
	n := 0
	for i := range events {
		n += EventSize(&events[i])
	}
	return n
}

// Since returns the batches after index after whose events match (each
// cut to its matching events), of whole entries at most limit bytes
// (EventSize) but at least one entry's, and the index they cover up to:
// the last batch's when limit cut them, else the journal's last. gone is
// true when entries after after are no longer all in the journal: the
// watch must start again from a snapshot.
func (j *Journal) Since(after uint64, match func(key string) bool, limit int) (batches []Batch, upTo uint64, gone bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if after+1 < j.first {
		return nil, j.last, true
	}
	n := 0
	start, _ := slices.BinarySearchFunc(j.batches, after+1, func(b Batch, index uint64) int { return cmp.Compare(b.Index, index) })
	for i := start; i < len(j.batches); i++ {
		b := &j.batches[i]
		var picked []lockfsm.Event
		size := 0
		for i := range b.Events {
			if match(b.Events[i].Key) {
				picked = append(picked, b.Events[i])
				size += EventSize(&b.Events[i])
			}
		}
		if len(picked) == 0 {
			continue
		}
		if n > 0 && n+size > limit {
			return batches, batches[len(batches)-1].Index, false
		}
		batches = append(batches, Batch{Index: b.Index, Events: picked})
		n += size
	}
	return batches, max(j.last, after), false
}

// Wait blocks until the journal covers an entry after index after, or
// ctx ends.
func (j *Journal) Wait(ctx context.Context, after uint64) error {
	for {
		j.mu.Lock()
		if j.last > after {
			j.mu.Unlock()
			return nil
		}
		if j.changed == nil {
			j.changed = make(chan struct{})
		}
		ch := j.changed
		j.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Match returns the test of a watch's keys: key itself, or every key
// that starts with it when prefix is set.
func Match(key string, prefix bool) func(string) bool {
	if prefix {
		return func(k string) bool { return strings.HasPrefix(k, key) }
	}
	return func(k string) bool { return k == key }
}
