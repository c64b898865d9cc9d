package lockfsm

import (
	"fmt"
	"testing"
)

// BenchmarkApplyAcquireRelease measures one uncontended lock cycle: an entry
// with an Acquire, then an entry with its Release (with Ack, so the dedup
// table stays small).
func BenchmarkApplyAcquireRelease(b *testing.B) {
	s := New()
	s.Apply(1, []Command{{Op: OpOpenSession, Owner: "n", TTLMillis: 1000}})
	idx := uint64(1)
	acquire := []Command{{Op: OpAcquire, Session: 1, Key: "invoice/42", Wait: true}}
	release := []Command{{Op: OpRelease, Session: 1}}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		req := uint64(2*i + 1)
		acquire[0].Req, acquire[0].Ack = req, req
		idx++
		if rs, _ := s.Apply(idx, acquire); rs[0].Status != StatusGranted {
			b.Fatalf("acquire: %+v", rs[0])
		}
		release[0].Req, release[0].Target = req+1, req
		idx++
		if rs, _ := s.Apply(idx, release); rs[0].Status != StatusOK {
			b.Fatalf("release: %+v", rs[0])
		}
	}
}

// BenchmarkApplyContended measures hand-off: 64 sessions queue on one key,
// and each entry releases the holder and re-queues it.
func BenchmarkApplyContended(b *testing.B) {
	s := New()
	const n = 64
	idx := uint64(0)
	for i := 0; i < n; i++ {
		idx++
		s.Apply(idx, []Command{{Op: OpOpenSession, Owner: fmt.Sprint("n", i), TTLMillis: 1000}})
	}
	req := make([]uint64, n+1)
	for sess := uint64(1); sess <= n; sess++ {
		req[sess] = 1
		idx++
		s.Apply(idx, []Command{{Op: OpAcquire, Session: sess, Req: 1, Key: "k", Wait: true}})
	}
	b.ReportAllocs()
	for b.Loop() {
		info, _ := s.Key("k")
		h := info.Holders[0]
		req[h.Session] += 2
		idx++
		_, gs := s.Apply(idx, []Command{
			{Op: OpRelease, Session: h.Session, Req: req[h.Session] - 1, Target: h.Req, Ack: h.Req},
			{Op: OpAcquire, Session: h.Session, Req: req[h.Session], Key: "k", Wait: true},
		})
		if len(gs) != 1 {
			b.Fatalf("grants %+v", gs)
		}
	}
}
