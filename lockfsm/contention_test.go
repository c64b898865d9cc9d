package lockfsm

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
)

// TestContentionMatchesAFullListing builds random states of mutexes and
// semaphores, some held, some waited for, and checks Contention against
// the keys listed one by one with Key: the longest queues and the lowest
// tokens, in order, for several k.
func TestContentionMatchesAFullListing(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 7))
		s := New()
		index := uint64(0)
		apply := func(cmds ...Command) []Result {
			index++
			res, _ := s.Apply(index, cmds)
			return res
		}
		var sessions []uint64
		for range 8 {
			apply(Command{Op: OpOpenSession, Owner: "n", TTLMillis: 1000})
			sessions = append(sessions, index)
		}
		reqs := map[uint64]uint64{}
		var held [][2]uint64
		for range 400 {
			sess := sessions[rng.IntN(len(sessions))]
			switch rng.IntN(4) {
			case 0, 1, 2:
				reqs[sess]++
				key := fmt.Sprintf("k%d", rng.IntN(30))
				cmd := Command{Op: OpAcquire, Session: sess, Req: reqs[sess], Key: key, Wait: true}
				if rng.IntN(3) == 0 {
					cmd.Key, cmd.Kind, cmd.Limit = "s"+key, KindSemaphore, 2
				}
				if apply(cmd)[0].Status == StatusGranted {
					held = append(held, [2]uint64{sess, reqs[sess]})
				}
			case 3:
				if len(held) > 0 {
					i := rng.IntN(len(held))
					h := held[i]
					held = slices.Delete(held, i, i+1)
					reqs[h[0]]++
					apply(Command{Op: OpRelease, Session: h[0], Req: reqs[h[0]], Target: h[1]})
				}
			}
		}
		var wantQ []KeyQueue
		var wantH []KeyHold
		for key := range s.keys {
			info, _ := s.Key(key)
			if len(info.Waiters) > 0 {
				wantQ = append(wantQ, KeyQueue{Key: key, Waiters: len(info.Waiters), First: info.Waiters[0]})
			}
			for _, h := range info.Holders {
				wantH = append(wantH, KeyHold{Key: key, Holder: h})
			}
		}
		slices.SortFunc(wantQ, func(a, b KeyQueue) int { return cmp.Or(cmp.Compare(b.Waiters, a.Waiters), cmp.Compare(a.Key, b.Key)) })
		slices.SortFunc(wantH, func(a, b KeyHold) int { return cmp.Compare(a.Token, b.Token) })
		if len(wantQ) == 0 || len(wantH) < 5 {
			t.Fatalf("seed %d: a state with %d queues and %d holds tests little", seed, len(wantQ), len(wantH))
		}
		for _, k := range []int{1, 3, 10, 1000} {
			q, h := s.Contention(k)
			if !reflect.DeepEqual(q, wantQ[:min(k, len(wantQ))]) {
				t.Fatalf("seed %d k %d: queues\n%+v\nwant\n%+v", seed, k, q, wantQ[:min(k, len(wantQ))])
			}
			if !reflect.DeepEqual(h, wantH[:min(k, len(wantH))]) {
				t.Fatalf("seed %d k %d: holds\n%+v\nwant\n%+v", seed, k, h, wantH[:min(k, len(wantH))])
			}
		}
	}
}
