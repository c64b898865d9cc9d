package node

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/lockmesh/lockmesh/internal/peer"
)

// The lock family under the nemesis suite: the load of nemesis_test.go,
// with the same faults and checkers, taking read/write locks, semaphores
// or LockAll instead of Node.Lock. Each worker locks through a Session of
// its own (a new one when its node restarted or the session was lost).
// What each model's checkers add to the mutex's:
//
//   - rw: a writer is inside with nobody, readers only with readers (the
//     resource); tokens rise in entry order, a reader's above every
//     writer's that entered before it and a writer's above every token
//     that did; the history is linearizable as a fenced read/write lock
//     (rwLockModel); and no holder sees its lease open after a grant that
//     may not be held with it was applied (lease overlap, by kind).
//   - sem: the permits of the holders inside with open leases never sum
//     above the semaphore's (the resource), nor those of grants whose
//     holders still saw their leases open when another was applied (lease
//     overlap, by permits); liveness takes every permit of each key, so a
//     dead holder's permits must have come back.
//   - multi: every key of a LockAll is a mutex (the mutex's checkers per
//     key), and after a LockAll fails, none of its keys stays held or
//     waited for by its session (Inspect, within livenessBound + 2×TTL).
//
// Each run logs its summary line as the mutex's do, named for its model:
//
//	nemesis rw-disk-stall: <ops> ops, <keys> keys, <violations> violations, <seconds>s

// familyModel is a member of the lock family as the load takes it.
type familyModel struct {
	name string
	keys []string
	// take takes, through who's Session on n, the locks of one operation
	// on key; liveness asks for the strongest hold of key.
	take func(ctx context.Context, m *familyModel, n *Node, who, key string, liveness bool) ([]*Lock, error)
	// together is the lease-overlap checker's rule of which grants may be
	// held at once (nil: none, as for mutexes).
	together func(lr *loadRun, key string, held []keyGrant, next keyGrant) (bool, string)
	// failed, when set, is called by the worker after take failed.
	failed func(ctx context.Context, lr *loadRun, p *faultPeer, who string)
	// hist is what each key's history must be linearizable as (nil:
	// token order only), named histName.
	hist     *porcupine.Model
	histName string
	// limit is a semaphore key's permit count.
	limit int
	// checkKeys, when set, checks the keys against the cluster's layout.
	checkKeys func(t testing.TB, fc *faultCluster)
	// watch runs the watch checker (watchcheck_test.go) on the keys.
	watch bool

	lr       *loadRun // the run it is used in
	mu       sync.Mutex
	sessions map[string]*Session // by worker
	lastFail map[string]lockAllFailure
	// checked counts failed LockAll calls whose keys were seen free of
	// their session; unchecked those whose keys could not be inspected
	// within the bound.
	checked, unchecked int
}

// use makes lr's workers take m's locks and its checkers judge them as
// m's kind.
func (m *familyModel) use(lr *loadRun) {
	m.sessions = map[string]*Session{}
	m.lastFail = map[string]lockAllFailure{}
	m.lr = lr
	lr.model = m
	lr.keys = m.keys
	lr.hist.model, lr.hist.modelName = m.hist, m.histName
	lr.res.limit = m.limit
}

// violate reports a violation only the model's take sees.
func (m *familyModel) violate(format string, args ...any) { m.lr.violate(format, args...) }

// session returns who's Session on n, a new one if it has none there or
// it ended.
func (m *familyModel) session(ctx context.Context, n *Node, who string) (*Session, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.sessions[who]; s != nil && s.n == n && s.Err() == nil {
		return s, nil
	}
	s, err := n.NewSession(ctx)
	if err != nil {
		return nil, err
	}
	m.sessions[who] = s
	return s, nil
}

// grantOf says what the grant (key, token) was asked as; ok is false for
// a grant no worker got back (its attempt was abandoned).
func (lr *loadRun) grantOf(key string, token uint64) (h holder, ok bool) {
	lr.mu.Lock()
	defer lr.mu.Unlock()
	h, ok = lr.granted[leaseKey{key, token}]
	return h, ok
}

// rwModel: workers read-lock (two in three) or write-lock one of four
// keys, one in eight with TryRLock or TryLock; liveness write-locks.
func rwModel() *familyModel {
	return &familyModel{
		name: "rw",
		keys: []string{"rw/1", "rw/2", "rw/3", "rw/4"},
		take: func(ctx context.Context, m *familyModel, n *Node, who, key string, liveness bool) ([]*Lock, error) {
			s, err := m.session(ctx, n, who)
			if err != nil {
				return nil, err
			}
			rw, try := s.RWMutex(key), !liveness && rand.IntN(8) == 0
			var l *Lock
			switch write := liveness || rand.IntN(3) == 0; {
			case write && try:
				l, err = rw.TryLock(ctx)
			case write:
				l, err = rw.Lock(ctx)
			case try:
				l, err = rw.TryRLock(ctx)
			default:
				l, err = rw.RLock(ctx)
			}
			if err != nil {
				return nil, err
			}
			return []*Lock{l}, nil
		},
		together: func(lr *loadRun, key string, held []keyGrant, next keyGrant) (bool, string) {
			nh, ok := lr.grantOf(key, next.Token)
			if !ok {
				return true, "" // abandoned: its kind is not known, and nobody held it
			}
			for _, g := range held {
				if h, _ := lr.grantOf(key, g.Token); conflict(h.kind, nh.kind) {
					return false, fmt.Sprintf("token %d is a %s lock, granted while token %d's %s lease was open", next.Token, nh.kind, g.Token, h.kind)
				}
			}
			return true, ""
		},
		hist:     &rwLockModel,
		histName: "a fenced read/write lock",
	}
}

// semPermits is the sem model's semaphore size.
const semPermits = 3

// semModel: workers take 1 or 2 of the 3 permits of one of two keys, one
// in eight with TryAcquire; liveness takes all 3.
func semModel() *familyModel {
	return &familyModel{
		name:  "sem",
		keys:  []string{"sem/1", "sem/2"},
		limit: semPermits,
		take: func(ctx context.Context, m *familyModel, n *Node, who, key string, liveness bool) ([]*Lock, error) {
			s, err := m.session(ctx, n, who)
			if err != nil {
				return nil, err
			}
			sem, permits := s.Semaphore(key, semPermits), 1+rand.IntN(2)
			var l *Lock
			switch {
			case liveness:
				l, err = sem.Acquire(ctx, semPermits)
			case rand.IntN(8) == 0:
				l, err = sem.TryAcquire(ctx, permits)
			default:
				l, err = sem.Acquire(ctx, permits)
			}
			if err != nil {
				return nil, err
			}
			return []*Lock{l}, nil
		},
		together: func(lr *loadRun, key string, held []keyGrant, next keyGrant) (bool, string) {
			nh, ok := lr.grantOf(key, next.Token)
			if !ok {
				return true, "" // abandoned: its permits are not known, and nobody held them
			}
			sum := nh.permits
			for _, g := range held {
				h, _ := lr.grantOf(key, g.Token)
				sum += h.permits
			}
			if sum <= semPermits {
				return true, ""
			}
			return false, fmt.Sprintf("%d permits held with token %d's %d, over the limit of %d", sum-nh.permits, next.Token, nh.permits, semPermits)
		},
		// No porcupine model: which earlier holders a grant displaced
		// depends on permits, not on order alone. Token order is checked.
		histName: "",
	}
}

// multiTagged share a hash tag, so one shard; multiPlain are hashed
// whole, each on another shard (TestNemesisFamily checks it).
var (
	multiTagged = []string{"{ord}/a", "{ord}/b", "{ord}/c"}
	multiPlain  = []string{"multi/x", "multi/y", "multi/z"}
)

// lockAllFailure is a worker's last LockAll that failed.
type lockAllFailure struct {
	s    *Session
	keys []string
	err  error
}

// multiModel: workers LockAll key with one or two of the other five keys
// (one group on one shard, or keys across shards), one in four with
// TryLockAll; liveness locks key alone. After a LockAll fails, its
// session must hold and wait for none of its keys (checkPartialHold).
func multiModel() *familyModel {
	return &familyModel{
		name: "multi",
		keys: append(slices.Clone(multiTagged), multiPlain...),
		take: func(ctx context.Context, m *familyModel, n *Node, who, key string, liveness bool) ([]*Lock, error) {
			s, err := m.session(ctx, n, who)
			if err != nil {
				return nil, err
			}
			keys := []string{key}
			if !liveness {
				others := slices.DeleteFunc(slices.Clone(m.keys), func(k string) bool { return k == key })
				rand.Shuffle(len(others), func(i, j int) { others[i], others[j] = others[j], others[i] })
				keys = append(keys, others[:1+rand.IntN(2)]...)
			}
			var ml *MultiLock
			if !liveness && rand.IntN(4) == 0 {
				ml, err = s.TryLockAll(ctx, keys...)
			} else {
				ml, err = s.LockAll(ctx, keys...)
			}
			if err != nil {
				m.mu.Lock()
				m.lastFail[who] = lockAllFailure{s: s, keys: keys, err: err}
				m.mu.Unlock()
				return nil, err
			}
			return ml.Locks(), nil
		},
		failed:    checkPartialHold,
		checkKeys: checkMultiKeys,
		hist:      &fencedMutexModel,
		histName:  "a fenced mutex",
	}
}

// checkPartialHold checks who's last failed LockAll: within
// livenessBound + 2×TTL, Inspect through who's peer must show none of its
// keys held or waited for by its session (the release of what it took is
// committed in the background, and a lost session's locks end by expiry).
// A failure whose keys could not be inspected in time is counted, not
// reported.
func checkPartialHold(ctx context.Context, lr *loadRun, p *faultPeer, who string) {
	m := lr.model
	m.mu.Lock()
	f, ok := m.lastFail[who]
	delete(m.lastFail, who)
	m.mu.Unlock()
	if !ok || errors.Is(f.err, ErrClosed) || errors.Is(f.err, ErrInvalidArgument) || errors.Is(f.err, ErrAlreadyHeld) {
		return // the node closed (its sessions end with it), or nothing was sent
	}
	failedAt := lr.hist.now()
	ttl := lr.fc.opts.ttl
	deadline := time.Now().Add(livenessBound(ttl) + 2*ttl)
	var left []string // keys the session held or waited for at the last successful look
	looked := false
	for ctx.Err() == nil {
		n := p.node()
		if n == nil {
			return
		}
		left, looked = left[:0], false
		for _, key := range f.keys {
			ictx, cancel := context.WithTimeout(ctx, time.Second)
			info, err := n.Inspect(ictx, key)
			cancel()
			if err != nil {
				left, looked = left[:0], false
				break
			}
			looked = true
			for _, h := range info.Holders {
				if h.Session == f.s.ID() {
					left = append(left, fmt.Sprintf("%s held (token %d)", key, h.Token))
				}
			}
			for _, h := range info.Waiters {
				if h.Session == f.s.ID() {
					left = append(left, key+" waited for")
				}
			}
		}
		if looked && len(left) == 0 {
			m.mu.Lock()
			m.checked++
			m.mu.Unlock()
			return
		}
		if time.Now().After(deadline) {
			break
		}
		sleepCtx(ctx, 20*time.Millisecond)
	}
	if ctx.Err() != nil {
		return
	}
	if !looked {
		m.mu.Lock()
		m.unchecked++
		m.mu.Unlock()
		return
	}
	lr.violate("partial hold: %s's LockAll of %v failed at %.3fs (%v), and %.1fs later its session %x still had %s",
		who, f.keys, time.Duration(failedAt).Seconds(), f.err, time.Duration(lr.hist.now()-failedAt).Seconds(), f.s.ID(), strings.Join(left, ", "))
}

// rwState is a read/write lock's state in the linearizability model: the
// writer the cluster honours (0: none), the readers it honours (sorted,
// as text so states compare), and the last token granted.
type rwState struct {
	writer  uint64
	readers string
	last    uint64
}

func (s rwState) readerSet() []uint64 {
	var out []uint64
	for _, f := range strings.Fields(s.readers) {
		var t uint64
		fmt.Sscan(f, &t)
		out = append(out, t)
	}
	return out
}

func withReaders(s rwState, readers []uint64) rwState {
	slices.Sort(readers)
	parts := make([]string, len(readers))
	for i, t := range readers {
		parts[i] = fmt.Sprint(t)
	}
	s.readers = strings.Join(parts, " ")
	return s
}

// rwLockModel is the fenced mutex model (linearizable_test.go) for a
// read/write lock. acquire -> t is legal iff t is above every token
// granted before; a writer then displaces every holder (their leases
// must have ended), a reader displaces the writer only. check(t) and
// release(t) are legal iff t is still honoured, as writer or reader.
var rwLockModel = porcupine.Model{
	Init: func() any { return rwState{} },
	Step: func(state, input, _ any) (bool, any) {
		s, op := state.(rwState), input.(lockOp)
		readers := s.readerSet()
		switch op.kind {
		case opAcquire:
			if op.token <= s.last {
				return false, s
			}
			if !op.read {
				return true, rwState{writer: op.token, last: op.token}
			}
			return true, withReaders(rwState{last: op.token}, append(readers, op.token))
		case opCheck:
			return s.writer == op.token || slices.Contains(readers, op.token), s
		case opRelease:
			if s.writer == op.token {
				s.writer = 0
				return true, s
			}
			if i := slices.Index(readers, op.token); i >= 0 {
				return true, withReaders(s, slices.Delete(readers, i, i+1))
			}
			return false, s
		}
		return false, s
	},
	Equal: func(a, b any) bool { return a.(rwState) == b.(rwState) },
	DescribeOperation: func(input, _ any) string {
		op := input.(lockOp)
		if op.kind == opAcquire && op.read {
			return fmt.Sprintf("%s racquire t%d", op.client, op.token)
		}
		return fmt.Sprintf("%s %s t%d", op.client, op.kind, op.token)
	},
	DescribeState: func(state any) string {
		s := state.(rwState)
		return fmt.Sprintf("writer t%d, readers [%s], last t%d", s.writer, s.readers, s.last)
	},
}

// electionModel: workers campaign in one of two elections (each a
// mutex: the mutex's checkers hold a leader to one term at a time, terms
// rising, no two leaders believing in their leases at once, and a
// Campaign that returned after its lease ended is a leader whose lease
// overlaps its successor's); one leader in four then proclaims anew and
// reads the leader back, linearizably: it must find its own term with a
// value it set, or a later term, never an earlier one.
func electionModel() *familyModel {
	return &familyModel{
		name:  "election",
		keys:  []string{"election/1", "election/2"},
		watch: true,
		take: func(ctx context.Context, m *familyModel, n *Node, who, key string, liveness bool) ([]*Lock, error) {
			s, err := m.session(ctx, n, who)
			if err != nil {
				return nil, err
			}
			e := s.Election(key)
			campaigned := who + " campaigns"
			ld, err := e.Campaign(ctx, []byte(campaigned))
			if err != nil {
				return nil, err
			}
			if !liveness && rand.IntN(4) == 0 {
				proclaimed := fmt.Sprintf("%s proclaims in term %d", who, ld.Term())
				_ = ld.Proclaim(ctx, []byte(proclaimed)) // either value may stand if it fails
				info, err := e.Leader(ctx)
				switch {
				case err != nil:
				case info.Term < ld.Term():
					m.violate("election %s: Leader read term %d after term %d was won", key, info.Term, ld.Term())
				case info.Term == ld.Term() && string(info.Value) != campaigned && string(info.Value) != proclaimed:
					m.violate("election %s: term %d proclaims %q, which its leader never set", key, info.Term, info.Value)
				}
			}
			return []*Lock{ld.l}, nil
		},
	}
}

// familyModels are the models TestNemesisFamily runs, made fresh per run.
var familyModels = []func() *familyModel{rwModel, semModel, multiModel, electionModel}

// familyFaults are the nemeses (nemesis_test.go) TestNemesisFamily runs
// each model under: a stand-in for a leader pause (its holders stopped
// inside, cut off), the disk stall that is the in-process pause, a
// crash and restart, message delay and drop, and membership changes
// under faults. The soak tier (-lockmesh.soak) runs every nemesis.
var familyFaults = []string{"isolate-hold", "disk-stall", "kill-restart", "delay-drop", "membership-faults"}

func nemesisNamed(t *testing.T, name string) nemesis {
	for _, nm := range nemeses {
		if nm.name == name {
			return nm
		}
	}
	t.Fatalf("no nemesis %q", name)
	return nemesis{}
}

// The multi model's keys must be what it says: the tagged ones on one
// shard, the plain ones each on a shard of its own.
func checkMultiKeys(t testing.TB, fc *faultCluster) {
	t.Helper()
	pl := fc.peers[0].node().peer.Placement()
	shards := map[uint64]bool{}
	for _, k := range multiTagged {
		shards[pl.ShardOf(k)] = true
	}
	if len(shards) != 1 {
		t.Fatalf("tagged keys %v on shards %v, want one", multiTagged, shards)
	}
	for _, k := range multiPlain {
		shards[pl.ShardOf(k)] = true
	}
	if len(shards) != 1+len(multiPlain) {
		t.Fatalf("multi keys %v %v on %d shards, want %d", multiTagged, multiPlain, len(shards), 1+len(multiPlain))
	}
}

func TestNemesisFamily(t *testing.T) {
	if testing.Short() {
		t.Skip("nemesis suite skipped in -short mode")
	}
	for _, newModel := range familyModels {
		for _, fault := range familyFaults {
			m := newModel()
			if fault == "membership-faults" && m.name != "multi" {
				// 21s a run: in the default tier only LockAll, whose keys
				// span shards whose replicas and leaders move; the soak
				// tier runs every model under it.
				continue
			}
			nm := nemesisNamed(t, fault)
			t.Run(m.name+"-"+nm.name, func(t *testing.T) {
				runFamilyNemesis(t, m, nm, 0)
			})
		}
	}
}

// runFamilyNemesis runs nm under m's load, soak long (0: one round), and
// fails t for every violation.
func runFamilyNemesis(t *testing.T, m *familyModel, nm nemesis, soak time.Duration) nemesisResult {
	r := runNemesisModel(t, nm, soak, nm.opts, m)
	reportViolations(t, r)
	if r.ops < 100 {
		t.Errorf("only %d ops checked: the load did not run", r.ops)
	}
	if m.failed != nil {
		t.Logf("%d failed LockAll calls left nothing held or waiting; %d could not be inspected in time", m.checked, m.unchecked)
	}
	return r
}

// Each model's checkers must catch its broken variant. With
// peer.Hooks.UnsafeGrantQueued a peer takes a Queued answer to an acquire
// as a grant (token 0): a lock handed out that the cluster never granted,
// so real holders overlap. The rw checkers must then report a writer
// inside with readers, the sem checkers more permits held than the
// semaphore has, the multi checkers two holders of a key of a LockAll.
// With peer.Hooks.UnsafeKeepPartialLockAll a LockAll that fails keeps
// what it took on the shards before the one that refused: the multi
// checker must report the partial hold. No fault is injected: every
// worker holds its lock for up to 10 ms or (one in two) 0.25-2 TTL, so
// that acquires queue; rounds of a second run until the checker reports,
// at most maxRounds. A partial hold needs a cross-shard TryLockAll to be
// refused on a later shard after an earlier one granted: here it took 6
// to 12 rounds (eight runs), and a CI run on a loaded machine saw none in
// 20, so that case gets 50.
func TestFamilyBrokenVariantsAreCaught(t *testing.T) {
	if testing.Short() {
		t.Skip("nemesis suite skipped in -short mode")
	}
	grantQueued := func(h *peer.Hooks) { h.UnsafeGrantQueued = true }
	has := func(words ...string) func(string) bool {
		return func(v string) bool {
			for _, w := range words {
				if !strings.Contains(v, w) {
					return false
				}
			}
			return true
		}
	}
	for _, c := range []struct {
		name      string
		model     func() *familyModel
		hook      func(*peer.Hooks)
		broken    string
		caught    func(v string) bool
		what      string
		maxRounds int
	}{
		{"rw", rwModel, grantQueued, "unsafeGrantQueued", has("inside at once", "(write, ", "(read, "), "a writer inside with readers", 10},
		{"sem", semModel, grantQueued, "unsafeGrantQueued", has("over the limit"), "more permits held than the semaphore has", 10},
		{"multi", multiModel, grantQueued, "unsafeGrantQueued", has("inside at once"), "two holders of a key of a LockAll inside at once", 10},
		{"election", electionModel, grantQueued, "unsafeGrantQueued", has("inside at once"), "two leaders of an election inside at once", 10},
		{"election-watch", electionModel, func(h *peer.Hooks) { h.UnsafeWatchSkipHandOffs = true }, "unsafeWatchSkipHandOffs", has("watch ", "missed grant"),
			"a watch that missed a hand-off's grant", 10},
		{"multi-partial", multiModel, func(h *peer.Hooks) { h.UnsafeKeepPartialLockAll = true }, "unsafeKeepPartialLockAll", has("partial hold"),
			"a failed LockAll's session still holding a key", 50},
	} {
		t.Run(c.name, func(t *testing.T) {
			start := time.Now()
			fc := startFaultCluster(t, faultOpts{hook: c.hook})
			m := c.model()
			lr := newLoadRun(fc)
			m.use(lr)
			if m.checkKeys != nil {
				m.checkKeys(t, fc)
			}
			lr.longShare = 2
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(c.maxRounds+30)*time.Second)
			defer cancel()
			var watched func()
			if m.watch {
				watched = startWatchChecks(context.Background(), lr, t.Logf)
			}
			wg := lr.start(ctx)
			sleepCtx(ctx, 1500*time.Millisecond)
			rounds := 0
			for rounds < c.maxRounds && ctx.Err() == nil && !slices.ContainsFunc(lr.soFar(), c.caught) {
				rounds++
				sleepCtx(ctx, time.Second)
			}
			cancel()
			wg.Wait()
			if watched != nil {
				watched()
			}
			ops, keys := lr.hist.size()
			v := lr.verify(t)
			t.Logf("nemesis %s-broken (%s): %d ops, %d keys, %d violations, %.1fs", c.name, c.broken, ops, keys, len(v), time.Since(start).Seconds())
			t.Logf("violations by checker: %v; the checker reported it after %d of at most %d rounds", violationKinds(v), rounds, c.maxRounds)
			i := slices.IndexFunc(v, c.caught)
			if i < 0 {
				t.Fatalf("%s, yet no checker reported %s (all violations: %v)", c.broken, c.what, v)
			}
			t.Logf("caught: %s", v[i])
			logViolations(t, v, 100)
		})
	}
}

// soFar returns the violations the resource, the nemeses and the
// liveness and partial-hold checks have reported so far.
func (lr *loadRun) soFar() []string {
	lr.res.mu.Lock()
	v := slices.Clone(lr.res.violations)
	lr.res.mu.Unlock()
	lr.mu.Lock()
	defer lr.mu.Unlock()
	return append(v, lr.extra...)
}

// TestSoakFamilyNemeses is the soak tier of TestNemesisFamily: each
// model under each of its nemeses, fault after fault, for -lockmesh.soak:
//
//	go test ./node -run SoakFamily -v -timeout 60m -lockmesh.soak=1m
//	go test ./node -run 'SoakFamily/^sem-kill-restart$' -v -timeout 10m -lockmesh.soak=2m
func TestSoakFamilyNemeses(t *testing.T) {
	if *soakFor <= 0 {
		t.Skip("soak tier: set -lockmesh.soak=2m to run it")
	}
	var total, bad, ran int
	for _, newModel := range familyModels {
		for _, fault := range familyFaults {
			m := newModel()
			nm := nemesisNamed(t, fault)
			t.Run(m.name+"-"+nm.name, func(t *testing.T) {
				ran++
				r := runFamilyNemesis(t, m, nm, *soakFor)
				total += r.ops
				bad += len(r.violations)
			})
		}
	}
	t.Logf("soak: %d ops checked over %d family runs of %v each, %d violations", total, ran, *soakFor, bad)
}
