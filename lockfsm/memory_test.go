package lockfsm

import (
	"bytes"
	"fmt"
	"runtime"
	"strconv"
	"testing"
)

// heapAlloc returns the live heap after two collections, so only what is
// still reachable counts.
func heapAlloc() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// holdLocks opens sessions and has each acquire perKey distinct keys
// ("k/123456"-like), every one granted and held. Each Acquire's key is a
// fresh string, as a decoded command's would be. It returns the state.
func holdLocks(tb testing.TB, sessions, perSession int) *State {
	s := New()
	idx := uint64(0)
	ids := make([]uint64, sessions)
	for i := range ids {
		idx++
		rs, _ := s.Apply(idx, []Command{{Op: OpOpenSession, Owner: "node-" + strconv.Itoa(i%5), TTLMillis: 10000}})
		ids[i] = rs[0].Session
	}
	const batch = 1000
	cmds := make([]Command, 0, batch)
	n := 0
	flush := func() {
		idx++
		rs, _ := s.Apply(idx, cmds)
		for _, r := range rs {
			if r.Status != StatusGranted {
				tb.Fatalf("acquire: %+v", r)
			}
		}
		cmds = cmds[:0]
	}
	for _, id := range ids {
		for req := 1; req <= perSession; req++ {
			key := fmt.Sprintf("k/%06d", n)
			n++
			cmds = append(cmds, Command{Op: OpAcquire, Session: id, Req: uint64(req), Ack: uint64(req), Key: key, Wait: true})
			if len(cmds) == batch {
				flush()
			}
		}
	}
	if len(cmds) > 0 {
		flush()
	}
	return s
}

// BenchmarkHeldLockMemory reports the live Go heap one held lock costs in a
// State (B/lock): N=100000 distinct short keys held, by one session or by
// 1000 sessions of 100 keys each, built by Apply or restored by Load from
// the snapshot of that state (a replica that caught up by snapshot).
//
//	go test -run '^$' -bench HeldLockMemory -benchtime 3x ./lockfsm/
func BenchmarkHeldLockMemory(b *testing.B) {
	for _, tc := range []struct {
		name                 string
		sessions, perSession int
	}{
		{"1x100000", 1, 100000},
		{"1000x100", 1000, 100},
	} {
		n := tc.sessions * tc.perSession
		b.Run(tc.name+"/apply", func(b *testing.B) {
			var perLock float64
			for b.Loop() {
				before := heapAlloc()
				s := holdLocks(b, tc.sessions, tc.perSession)
				after := heapAlloc()
				if st := s.Stats(); st.Holders != n {
					b.Fatalf("%d holders, want %d", st.Holders, n)
				}
				runtime.KeepAlive(s)
				perLock = float64(int64(after)-int64(before)) / float64(n)
			}
			b.ReportMetric(perLock, "B/lock")
		})
		b.Run(tc.name+"/load", func(b *testing.B) {
			var buf bytes.Buffer
			if err := holdLocks(b, tc.sessions, tc.perSession).Save(&buf); err != nil {
				b.Fatal(err)
			}
			snap := buf.Bytes()
			var perLock float64
			for b.Loop() {
				before := heapAlloc()
				s := New()
				if err := s.Load(bytes.NewReader(snap)); err != nil {
					b.Fatal(err)
				}
				after := heapAlloc()
				if st := s.Stats(); st.Holders != n {
					b.Fatalf("%d holders, want %d", st.Holders, n)
				}
				runtime.KeepAlive(s)
				perLock = float64(int64(after)-int64(before)) / float64(n)
			}
			runtime.KeepAlive(snap)
			b.ReportMetric(perLock, "B/lock")
		})
	}
}

// TestHeldLockMemory keeps a held mutex on a short key within 250 bytes of
// live heap, counting both maps, the attempt, the key and its holder.
func TestHeldLockMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("builds 100000 locks")
	}
	const n = 100000
	before := heapAlloc()
	s := holdLocks(t, 1, n)
	after := heapAlloc()
	runtime.KeepAlive(s)
	perLock := float64(int64(after)-int64(before)) / n
	t.Logf("%.1f B/lock", perLock)
	if perLock > 250 {
		t.Errorf("a held lock costs %.1f bytes of heap, want at most 250", perLock)
	}
}
