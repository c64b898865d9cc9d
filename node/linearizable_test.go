package node

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// The lock history and its linearizability check.
//
// The object is one key's fenced mutex with leases. Its state is the token
// of the holder the cluster currently honours (0: none) and the last token
// granted. Operations, as clients observe them:
//
//   - acquire -> token t: a Lock call that returned. Legal iff t is above
//     every token granted before; the key then belongs to t. The previous
//     holder need not have released: its lease may have ended, which the
//     model cannot see. What makes that safe is the next operation.
//   - check(t): holder t looked at its own Lock.Done() and found it open.
//     Legal iff t is still the holder: no later grant was linearized before
//     the check. This is what a user relies on when touching the resource.
//   - release(t): Unlock returned nil. Legal iff t is still the holder.
//
// Operations with an unknown outcome (a Lock or Unlock that failed or timed
// out) are left out: per porcupine's docs they would get a return time of
// infinity, and at the end of the history they change nothing the recorded
// operations observe. Failed TryLocks (ErrLocked) have a definite outcome
// that changes nothing, and are left out too.

type lockOpKind uint8

const (
	opAcquire lockOpKind = iota
	opCheck
	opRelease
)

func (k lockOpKind) String() string {
	return [...]string{"acquire", "check", "release"}[k]
}

type lockOp struct {
	kind   lockOpKind
	token  uint64
	client string
	read   bool // an acquire of a read lock (the read/write model)
}

type lockState struct{ holder, last uint64 }

var fencedMutexModel = porcupine.Model{
	Init: func() any { return lockState{} },
	Step: func(state, input, _ any) (bool, any) {
		s, op := state.(lockState), input.(lockOp)
		switch op.kind {
		case opAcquire:
			if op.token <= s.last {
				return false, s
			}
			return true, lockState{holder: op.token, last: op.token}
		case opCheck:
			return s.holder == op.token, s
		case opRelease:
			if s.holder != op.token {
				return false, s
			}
			return true, lockState{last: s.last}
		}
		return false, s
	},
	Equal: func(a, b any) bool { return a.(lockState) == b.(lockState) },
	DescribeOperation: func(input, _ any) string {
		op := input.(lockOp)
		return fmt.Sprintf("%s %s t%d", op.client, op.kind, op.token)
	},
	DescribeState: func(state any) string {
		s := state.(lockState)
		return fmt.Sprintf("holder t%d, last t%d", s.holder, s.last)
	},
}

// history records lock operations per key, with times on the test's real
// monotonic clock (never a peer's injected clock).
type history struct {
	base time.Time
	// model is what each key's history must be linearizable as, named
	// modelName in reports: the fenced mutex unless set before use; nil
	// checks token order only.
	model     *porcupine.Model
	modelName string

	mu   sync.Mutex
	ops  map[string][]porcupine.Operation
	n    int
	ids  map[string]int // client -> porcupine client id
	keys map[string]bool
}

func newHistory() *history {
	return &history{base: time.Now(), model: &fencedMutexModel, modelName: "a fenced mutex", ops: map[string][]porcupine.Operation{}, ids: map[string]int{}, keys: map[string]bool{}}
}

func (h *history) now() int64 { return int64(time.Since(h.base)) }

func (h *history) add(key string, op lockOp, call, ret int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	id, ok := h.ids[op.client]
	if !ok {
		id = len(h.ids)
		h.ids[op.client] = id
	}
	h.ops[key] = append(h.ops[key], porcupine.Operation{ClientId: id, Input: op, Call: call, Return: ret})
	h.n++
}

func (h *history) size() (ops, keys int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n, len(h.ops)
}

// check runs every history checker and returns the violations found.
// dumpDir, when not empty, receives a porcupine visualization of each key
// that fails the linearizability check.
func (h *history) check(dumpDir string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	keys := make([]string, 0, len(h.ops))
	for k := range h.ops {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, key := range keys {
		ops := h.ops[key]
		out = append(out, checkTokenOrder(key, ops)...)
		if h.model == nil {
			continue
		}
		res, info := porcupine.CheckOperationsVerbose(*h.model, ops, 30*time.Second)
		switch res {
		case porcupine.Illegal:
			msg := fmt.Sprintf("key %s: history of %d ops is not linearizable as %s", key, len(ops), h.modelName)
			if dumpDir != "" {
				path := filepath.Join(dumpDir, "porcupine-"+strings.NewReplacer("/", "_", "{", "", "}", "").Replace(key)+".html")
				if err := porcupine.VisualizePath(*h.model, info, path); err == nil {
					msg += " (visualization: " + path + ")"
				}
			}
			out = append(out, msg+"; "+excerpt(ops))
		case porcupine.Unknown:
			// Not a violation, but say so: the check did not finish.
			fmt.Fprintf(os.Stderr, "key %s: linearizability check timed out on %d ops\n", key, len(ops))
		}
	}
	return out
}

// checkTokenOrder checks tokens strictly increasing per key in grant
// order: an acquire that returned before another acquire was called got
// the lower token, and no token was granted twice.
func checkTokenOrder(key string, ops []porcupine.Operation) []string {
	var acq []porcupine.Operation
	for _, o := range ops {
		if o.Input.(lockOp).kind == opAcquire {
			acq = append(acq, o)
		}
	}
	var out []string
	seen := map[uint64]porcupine.Operation{}
	for _, o := range acq {
		t := o.Input.(lockOp).token
		if prev, dup := seen[t]; dup {
			out = append(out, fmt.Sprintf("key %s: token %d granted twice: %s and %s", key, t, describeOp(prev), describeOp(o)))
		}
		seen[t] = o
	}
	byReturn := append([]porcupine.Operation(nil), acq...)
	sort.Slice(byReturn, func(i, j int) bool { return byReturn[i].Return < byReturn[j].Return })
	byCall := append([]porcupine.Operation(nil), acq...)
	sort.Slice(byCall, func(i, j int) bool { return byCall[i].Call < byCall[j].Call })
	var best porcupine.Operation // highest-token acquire returned so far
	var bestTok uint64
	r := 0
	for _, o := range byCall {
		for r < len(byReturn) && byReturn[r].Return < o.Call {
			if t := byReturn[r].Input.(lockOp).token; t > bestTok {
				bestTok, best = t, byReturn[r]
			}
			r++
		}
		if t := o.Input.(lockOp).token; bestTok > 0 && t <= bestTok {
			out = append(out, fmt.Sprintf("key %s: token %d granted after %d: %s began after %s returned", key, t, bestTok, describeOp(o), describeOp(best)))
		}
	}
	return out
}

func describeOp(o porcupine.Operation) string {
	op := o.Input.(lockOp)
	return fmt.Sprintf("%s %s t%d [%.3fs, %.3fs]", op.client, op.kind, op.token,
		time.Duration(o.Call).Seconds(), time.Duration(o.Return).Seconds())
}

// excerpt lists the operations around the first pair of overlapping
// holders, for the report.
func excerpt(ops []porcupine.Operation) string {
	sorted := append([]porcupine.Operation(nil), ops...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Call < sorted[j].Call })
	// An acquire of t2 that returned before a check of a lower t1 began.
	for _, c := range sorted {
		cop := c.Input.(lockOp)
		if cop.kind == opAcquire {
			continue
		}
		for _, a := range sorted {
			aop := a.Input.(lockOp)
			if aop.kind == opAcquire && aop.token > cop.token && a.Return < c.Call {
				var lines []string
				for _, o := range sorted {
					t := o.Input.(lockOp).token
					if t == cop.token || t == aop.token {
						lines = append(lines, describeOp(o))
					}
				}
				return "first conflict: " + strings.Join(lines, "; ")
			}
		}
	}
	var lines []string
	for i, o := range sorted {
		if i == 12 {
			break
		}
		lines = append(lines, describeOp(o))
	}
	return "first ops: " + strings.Join(lines, "; ")
}

// The checker must be able to fail: a few hand-written histories.
func TestLinearizabilityCheckerRejectsBadHistories(t *testing.T) {
	ms := func(d int) int64 { return int64(time.Duration(d) * time.Millisecond) }
	type rec struct {
		op        lockOp
		call, ret int
	}
	build := func(rs ...rec) *history {
		h := newHistory()
		for _, r := range rs {
			h.add("k", r.op, ms(r.call), ms(r.ret))
		}
		return h
	}
	a, b := "a", "b"
	cases := []struct {
		name  string
		h     *history
		legal bool
	}{
		{"handoff", build(
			rec{lockOp{kind: opAcquire, token: 3, client: a}, 0, 1}, rec{lockOp{kind: opCheck, token: 3, client: a}, 2, 2}, rec{lockOp{kind: opRelease, token: 3, client: a}, 3, 4},
			rec{lockOp{kind: opAcquire, token: 5, client: b}, 1, 5}, rec{lockOp{kind: opCheck, token: 5, client: b}, 6, 6}), true},
		{"expiry then new holder, old one stays out", build(
			rec{lockOp{kind: opAcquire, token: 3, client: a}, 0, 1}, rec{lockOp{kind: opAcquire, token: 4, client: b}, 0, 9}, rec{lockOp{kind: opCheck, token: 4, client: b}, 10, 10}), true},
		{"second holder inside while the first still sees its lease", build(
			rec{lockOp{kind: opAcquire, token: 3, client: a}, 0, 1}, rec{lockOp{kind: opAcquire, token: 4, client: b}, 0, 5}, rec{lockOp{kind: opCheck, token: 3, client: a}, 6, 6}), false},
		{"release after someone else was granted", build(
			rec{lockOp{kind: opAcquire, token: 3, client: a}, 0, 1}, rec{lockOp{kind: opAcquire, token: 4, client: b}, 2, 3}, rec{lockOp{kind: opRelease, token: 3, client: a}, 4, 5}), false},
		{"token went down", build(
			rec{lockOp{kind: opAcquire, token: 7, client: a}, 0, 1}, rec{lockOp{kind: opRelease, token: 7, client: a}, 2, 3}, rec{lockOp{kind: opAcquire, token: 6, client: b}, 4, 5}), false},
		{"token granted twice", build(
			rec{lockOp{kind: opAcquire, token: 7, client: a}, 0, 1}, rec{lockOp{kind: opAcquire, token: 7, client: b}, 0, 1}), false},
	}
	for _, c := range cases {
		v := c.h.check("")
		if c.legal && len(v) > 0 {
			t.Errorf("%s: legal history flagged: %v", c.name, v)
		}
		if !c.legal && len(v) == 0 {
			t.Errorf("%s: bad history passed", c.name)
		}
	}
}
