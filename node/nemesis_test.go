package node

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lni/dragonboat/v4"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/peer"
	"github.com/lockmesh/lockmesh/internal/replica"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// Nemesis tests: a 3-peer cluster (4 lock shards, TTL 1s, RTT 10ms) under
// concurrent lock load on several keys, one fault at a time, with every
// checker run on the whole history:
//
//	(a) porcupine: the history is linearizable as a fenced mutex;
//	(b) tokens strictly increase per key in grant order;
//	(c) a Fence never admits a token below one it admitted (rejections of
//	    stale holders are counted, not failures);
//	(d) the resource never has two holders inside whose Done() is open;
//	(e) lease overlap: no holder sees its Done() open after the next grant
//	    of its key was applied on any replica; every replica applies the
//	    same grants at each index, with tokens rising per key along its
//	    apply stream (overlap_test.go);
//	(f) after the fault heals, every key can be locked within livenessBound
//	    plus the longest long hold (one may have begun just before).
//
// One lock in longShare is held long, TTL/4 to 2×TTL, with Done() checked
// every few milliseconds while inside: a lease that outlives its grant by a
// few hundred milliseconds is seen only by a holder that is inside then.
//
// Each run logs one line (t.Logf; run with -v to see it on success):
//
//	nemesis <name>: <ops> ops, <keys> keys, <violations> violations, <seconds>s

const (
	nemesisTTL     = time.Second
	nemesisWorkers = 3  // per peer
	nemesisHold    = 10 // longest short stay inside, ms
	// longShare: one lock in longShare is held long (longHold).
	longShare = 4
)

// longHold is how long a long holder stays inside: TTL/4 to 2×TTL, so a
// holder is inside when a lease is wrongly cut short by anything up to a
// TTL. It checks Done() every 5-10 ms meanwhile and leaves early when the
// lease is lost.
func longHold(ttl time.Duration) time.Duration {
	return ttl/4 + rand.N(2*ttl-ttl/4)
}

// livenessBound is how long after healing every key must be lockable: the
// holder's lease may have just been extended (TTL), a new leader adds its
// grace and a full TTL (2×TTL), plus 2s for elections and catch-up.
func livenessBound(ttl time.Duration) time.Duration { return 3*ttl + 2*time.Second }

var nemesisKeys = []string{"acct/1", "acct/2", "acct/3", "job/a", "job/b", "job/c"}

// resource is the protected resource: who is inside per key, and a Fence
// every exclusive holder (a mutex, a writer) writes through. It judges
// holders by their lock's kind: exclusive holders overlap nobody, readers
// overlap readers, and a semaphore's holders together hold at most limit
// permits.
type resource struct {
	mu            sync.Mutex
	inside        map[string]map[*Lock]holder
	fence         Fence
	admitted      map[string]uint64 // highest token the fence admitted
	lastEntered   map[string]uint64 // highest token that entered with an open lease
	lastExclusive map[string]uint64 // highest exclusive holder's token that did
	reported      map[[2]uint64]bool
	reportedSets  map[string]bool // semaphore holder sets reported over the limit
	// limit is the permit count of the semaphore keys (the sem model).
	limit       int
	violations  []string
	rejections  atomic.Int64
	staleEnters atomic.Int64
	// beside counts holders that entered with others inside whose leases
	// were open: readers with readers, a semaphore's holders together.
	beside atomic.Int64
	// clock and observe put the resource's sightings of other holders'
	// open leases in the history: a sighting is a check by that holder.
	clock   func() int64
	observe func(key string, l *Lock, who string, call int64)
}

func newResource() *resource {
	return &resource{inside: map[string]map[*Lock]holder{}, admitted: map[string]uint64{}, lastEntered: map[string]uint64{},
		lastExclusive: map[string]uint64{}, reported: map[[2]uint64]bool{}, reportedSets: map[string]bool{}}
}

// holder is who is inside: a worker of a peer, with its lock's kind and
// permits.
type holder struct {
	who     string
	peer    *faultPeer
	kind    lockfsm.Kind
	permits int
}

func holderOf(l *Lock, p *faultPeer, who string) holder {
	return holder{who: who, peer: p, kind: l.h.Spec().Kind, permits: l.Permits()}
}

// exclusive reports whether a holder of kind k must be alone inside.
func exclusive(k lockfsm.Kind) bool { return k == lockfsm.KindMutex || k == lockfsm.KindWrite }

// conflict reports whether holders of kinds a and b may not be inside at
// once: a semaphore's holders are judged by their permits instead.
func conflict(a, b lockfsm.Kind) bool {
	if a == lockfsm.KindSemaphore || b == lockfsm.KindSemaphore {
		return false
	}
	return exclusive(a) || exclusive(b)
}

// kindName names a holder's kind in a violation: "" for the mutex, whose
// messages predate the family.
func kindName(k lockfsm.Kind) string {
	if k == lockfsm.KindMutex {
		return ""
	}
	return k.String() + ", "
}

func leaseOpen(l *Lock) bool {
	select {
	case <-l.Done():
		return false
	default:
		return true
	}
}

// count returns how many violations so far contain text.
func (r *resource) count(text string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, v := range r.violations {
		if strings.Contains(v, text) {
			n++
		}
	}
	return n
}

func (r *resource) violate(format string, args ...any) {
	r.violations = append(r.violations, fmt.Sprintf(format, args...))
}

// overlapLocked reports holders of key inside together with l (h), all
// with open leases, that its kind forbids: anybody beside a mutex or a
// writer, more permits than limit beside a semaphore's holder. Callers
// hold r.mu. It returns how many other holders inside had open leases.
func (r *resource) overlapLocked(key string, l *Lock, h holder) (others int) {
	permits, tokens := h.permits, []uint64{l.Token()}
	for o, oh := range r.inside[key] {
		// A paused process's view of its lease cannot be observed: it runs
		// no code. It is checked by the holder itself once resumed.
		if o == l || oh.peer.gate.isClosed() {
			continue
		}
		owho := oh.who
		call := r.clock()
		if !leaseOpen(o) {
			continue
		}
		// Another holder's lease seen open is a check in the history too.
		r.observe(key, o, owho, call)
		others++
		if h.kind == lockfsm.KindSemaphore {
			permits += oh.permits
			tokens = append(tokens, o.Token())
		}
		if !conflict(h.kind, oh.kind) {
			continue
		}
		pair := [2]uint64{min(o.Token(), l.Token()), max(o.Token(), l.Token())}
		if r.reported[pair] {
			continue
		}
		r.reported[pair] = true
		r.violate("key %s: %s (%stoken %d) and %s (%stoken %d) inside at once, both leases open", key, h.who, kindName(h.kind), l.Token(), owho, kindName(oh.kind), o.Token())
	}
	if h.kind == lockfsm.KindSemaphore && permits > r.limit {
		slices.Sort(tokens)
		set := fmt.Sprint(tokens)
		if !r.reportedSets[key+set] {
			r.reportedSets[key+set] = true
			r.violate("key %s: %d permits held, over the limit of %d: holders with tokens %s inside, all leases open (%s entering or checking)", key, permits, r.limit, set, h.who)
		}
	}
	return others
}

// write passes token through the fence. Callers hold r.mu.
func (r *resource) writeLocked(key string, token uint64) {
	if err := r.fence.Check(key, token); err != nil {
		r.rejections.Add(1)
		return
	}
	if token < r.admitted[key] {
		r.violate("key %s: fence admitted token %d after %d", key, token, r.admitted[key])
	}
	r.admitted[key] = max(r.admitted[key], token)
}

// enter puts holder l inside and reports whether its lease was open.
// Tokens must rise in the order holders enter with open leases, but
// readers granted together may enter in any order, and so may a
// semaphore's holders: a reader's token must be above every exclusive
// holder's that entered before it, an exclusive holder's above every
// token that did.
func (r *resource) enter(key string, l *Lock, p *faultPeer, who string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := holderOf(l, p, who)
	open := leaseOpen(l)
	if open {
		if r.overlapLocked(key, l, h) > 0 {
			r.beside.Add(1)
		}
		switch {
		case h.kind == lockfsm.KindSemaphore:
		case exclusive(h.kind) && l.Token() <= r.lastEntered[key]:
			r.violate("key %s: %s entered with token %d after token %d had entered", key, who, l.Token(), r.lastEntered[key])
		case !exclusive(h.kind) && l.Token() <= r.lastExclusive[key]:
			r.violate("key %s: %s (%s) entered with token %d after exclusive token %d had entered", key, who, h.kind, l.Token(), r.lastExclusive[key])
		}
		r.lastEntered[key] = max(r.lastEntered[key], l.Token())
		if exclusive(h.kind) {
			r.lastExclusive[key] = max(r.lastExclusive[key], l.Token())
		}
	} else {
		r.staleEnters.Add(1)
	}
	if r.inside[key] == nil {
		r.inside[key] = map[*Lock]holder{}
	}
	r.inside[key][l] = h
	if exclusive(h.kind) {
		r.writeLocked(key, l.Token())
	}
	return open
}

// check is a holder's look at its lease while inside: it reports whether
// the lease is open and, if so, whether another holder inside has an open
// lease too.
func (r *resource) check(key string, l *Lock, who string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	open := leaseOpen(l)
	if open {
		r.overlapLocked(key, l, r.inside[key][l])
	}
	return open
}

// leave checks l's lease one last time, writes (a holder that lost its
// lease writes too: the fence must stop it) and takes l out.
func (r *resource) leave(key string, l *Lock, who string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := r.inside[key][l]
	open := leaseOpen(l)
	if open {
		r.overlapLocked(key, l, h)
	}
	if exclusive(h.kind) {
		r.writeLocked(key, l.Token())
	}
	delete(r.inside[key], l)
	return open
}

// grantLog remembers when each peer's Lock calls were made and returned,
// for the majority-partition check.
type grant struct {
	peer      string
	call, ret int64
}

// loadRun is concurrent lock load on a fault cluster with its checkers.
type loadRun struct {
	fc     *faultCluster
	hist   *history
	res    *resource
	sights *leaseSights
	// hold is how long a short holder stays inside; one lock in longShare
	// (none if 0) is held for longFor instead. noLong stops new long
	// holds while liveness is checked.
	hold      func() time.Duration
	longShare int
	longFor   func() time.Duration
	noLong    atomic.Bool
	// keys are the keys the workers lock (nemesisKeys unless set before
	// start); fewer keys make more waiters.
	keys []string
	// enters, when set before start, receives (without blocking) every
	// entry of a holder with an open lease, for nemeses that aim at a
	// holder that has just gone inside.
	enters chan enterEvent
	// model, when set before start, is the member of the lock family the
	// workers take instead of Node.Lock (nemesis_family_test.go).
	model *familyModel
	mu    sync.Mutex
	// grants lists the grants returned, by peer; granted says what each
	// returned grant (key, token) was: its kind and permits.
	grants  []grant
	granted map[leaseKey]holder
	extra   []string // violations found by nemeses and the liveness check
	wg      sync.WaitGroup
}

func newLoadRun(fc *faultCluster) *loadRun {
	lr := &loadRun{fc: fc, hist: newHistory(), res: newResource(), sights: newLeaseSights(), longShare: longShare, keys: nemesisKeys, granted: map[leaseKey]holder{},
		hold:    func() time.Duration { return time.Duration(rand.IntN(nemesisHold*1000)) * time.Microsecond },
		longFor: func() time.Duration { return longHold(fc.opts.ttl) }}
	lr.res.clock = lr.hist.now
	lr.res.observe = func(key string, l *Lock, who string, call int64) {
		lr.hist.add(key, lockOp{kind: opCheck, token: l.Token(), client: who}, call, lr.hist.now())
		lr.sights.saw(key, l.Token(), who, call)
	}
	return lr
}

func (lr *loadRun) violate(format string, args ...any) {
	lr.mu.Lock()
	lr.extra = append(lr.extra, fmt.Sprintf(format, args...))
	lr.mu.Unlock()
}

// start runs workers on every peer until ctx ends.
func (lr *loadRun) start(ctx context.Context) *sync.WaitGroup {
	for _, p := range lr.fc.peers {
		lr.startWorkers(ctx, p)
	}
	return &lr.wg
}

// startWorkers runs p's workers until ctx ends or, once p was asked to
// leave, until p is closed.
func (lr *loadRun) startWorkers(ctx context.Context, p *faultPeer) {
	for w := 0; w < nemesisWorkers; w++ {
		who := fmt.Sprintf("%s/w%d", p.name, w)
		lr.wg.Add(1)
		go func() {
			defer lr.wg.Done()
			for ctx.Err() == nil {
				key := lr.keys[rand.IntN(len(lr.keys))]
				long := lr.longShare > 0 && rand.IntN(lr.longShare) == 0 && !lr.noLong.Load()
				if err := lr.once(ctx, p, who, key, 3*time.Second, long, false); errors.Is(err, ErrClosed) {
					if p.left.Load() {
						return // left the cluster: this worker's process is gone
					}
					time.Sleep(20 * time.Millisecond) // killed: wait for the restart
				}
			}
		}()
	}
}

// once locks key on p (with Node.Lock, or as lr.model takes it: several
// keys for LockAll), goes inside the resource, and unlocks, recording
// every operation whose outcome is known. A long holder stays inside for
// longHold, checking its leases all along. liveness asks the model for
// its strongest hold of key (a write lock, every permit, key's whole
// group).
func (lr *loadRun) once(ctx context.Context, p *faultPeer, who, key string, timeout time.Duration, long, liveness bool) error {
	p.gate.wait(ctx)
	n := p.node()
	if ctx.Err() != nil || n == nil {
		return ctx.Err()
	}
	h := lr.hist
	lctx, cancel := context.WithTimeout(ctx, timeout)
	call := h.now()
	var locks []*Lock
	var err error
	if lr.model != nil {
		locks, err = lr.model.take(lctx, lr.model, n, who, key, liveness)
	} else {
		var l *Lock
		if l, err = n.Lock(lctx, key); err == nil {
			locks = []*Lock{l}
		}
	}
	ret := h.now()
	cancel()
	if err != nil {
		if lr.model != nil && lr.model.failed != nil {
			lr.model.failed(ctx, lr, p, who)
		}
		return err
	}
	lr.mu.Lock()
	for _, l := range locks {
		h.add(l.Key(), lockOp{kind: opAcquire, token: l.Token(), client: who, read: l.h.Spec().Kind == lockfsm.KindRead}, call, ret)
		lr.grants = append(lr.grants, grant{peer: p.name, call: call, ret: ret})
		lr.granted[leaseKey{l.Key(), l.Token()}] = holderOf(l, p, who)
	}
	lr.mu.Unlock()

	p.gate.wait(ctx)
	for _, l := range locks {
		key, tok := l.Key(), l.Token()
		call = h.now()
		if lr.res.enter(key, l, p, who) {
			h.add(key, lockOp{kind: opCheck, token: tok, client: who}, call, h.now())
			lr.sights.saw(key, tok, who, call)
			if lr.enters != nil {
				select {
				case lr.enters <- enterEvent{p, key, time.Now()}:
				default:
				}
			}
		}
	}
	if long && !lr.noLong.Load() {
		lr.stayInside(ctx, p, locks, who, lr.longFor())
	} else {
		time.Sleep(lr.hold())
	}
	p.gate.wait(ctx) // a held holder checks its lease only once let go
	for _, l := range locks {
		key, tok := l.Key(), l.Token()
		call = h.now()
		if lr.res.leave(key, l, who) {
			h.add(key, lockOp{kind: opCheck, token: tok, client: who}, call, h.now())
			lr.sights.saw(key, tok, who, call)
		}
	}
	if rand.IntN(2) == 0 {
		// Release commits after it returns: like an operation whose
		// outcome is unknown, it is left out of the history. The next
		// acquire needs no release before it in the model.
		for _, l := range locks {
			_ = l.Release()
		}
		return nil
	}
	uctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for _, l := range locks {
		call = h.now()
		if err := l.Unlock(uctx); err == nil {
			h.add(l.Key(), lockOp{kind: opRelease, token: l.Token(), client: who}, call, h.now())
		}
	}
	return nil
}

// enterEvent is a holder of p going inside key at a time.
type enterEvent struct {
	peer *faultPeer
	key  string
	at   time.Time
}

// awaitEnter returns the next holder that goes inside, within the last 20
// ms, for which aim names a target (not nil); ok is false if ctx ended
// first.
func (lr *loadRun) awaitEnter(ctx context.Context, aim func(enterEvent) *faultPeer) (ev enterEvent, target *faultPeer, ok bool) {
	for {
		select {
		case ev = <-lr.enters:
		case <-ctx.Done():
			return ev, nil, false
		}
		if time.Since(ev.at) > 20*time.Millisecond {
			continue
		}
		if target = aim(ev); target != nil {
			return ev, target, true
		}
	}
}

// keyLeader names the peer leading key's shard, nil if unknown.
func (fc *faultCluster) keyLeader(key string) *faultPeer {
	leaders, pl := fc.shardLeaders()
	if pl == nil {
		return nil
	}
	name := leaders[pl.ShardOf(key)]
	for _, p := range fc.peers {
		if p.name == name {
			return p
		}
	}
	return nil
}

// stayInside keeps a long holder of locks inside for d, checking Done()
// of each every 5-10 ms as a careful holder does before each write; it
// leaves early when a lease is lost. Every sighting of an open lease is
// recorded for the lease-overlap checker, one every 100 ms in the history
// too (porcupine's cost grows with the history).
func (lr *loadRun) stayInside(ctx context.Context, p *faultPeer, locks []*Lock, who string, d time.Duration) {
	h := lr.hist
	end := time.Now().Add(d)
	var logged int64
	for time.Now().Before(end) && ctx.Err() == nil {
		time.Sleep(5*time.Millisecond + rand.N(5*time.Millisecond))
		p.gate.wait(ctx) // a held holder runs no code
		call := h.now()
		for _, l := range locks {
			if !lr.res.check(l.Key(), l, who) {
				return
			}
			lr.sights.saw(l.Key(), l.Token(), who, call)
		}
		if call-logged >= int64(100*time.Millisecond) {
			for _, l := range locks {
				h.add(l.Key(), lockOp{kind: opCheck, token: l.Token(), client: who}, call, h.now())
			}
			logged = call
		}
	}
}

// checkLiveness locks every key, from each peer in turn, within
// livenessBound of healed, plus the longest long hold: one may have begun
// just before the heal. No long hold begins meanwhile.
func (lr *loadRun) checkLiveness(ctx context.Context, healed time.Time) {
	lr.noLong.Store(true)
	defer lr.noLong.Store(false)
	bound := livenessBound(lr.fc.opts.ttl) + 2*lr.fc.opts.ttl
	var wg sync.WaitGroup
	for i, key := range lr.keys {
		p := lr.fc.peers[i%len(lr.fc.peers)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			var lastErr error
			for attempt := 1; ; attempt++ {
				left := time.Until(healed.Add(bound))
				if left <= 0 || ctx.Err() != nil {
					lr.violate("liveness: key %s not locked from %s within %v of healing (%d attempts, last: %v); %s",
						key, p.name, bound, attempt-1, lastErr, lr.describeKey(key))
					return
				}
				if lastErr = lr.once(ctx, p, p.name+"/liveness-"+key, key, left, false, true); lastErr == nil {
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
}

// describeKey says, for a liveness report, who leads key's shard, who is
// inside key now and what its last grants were.
func (lr *loadRun) describeKey(key string) string {
	var b strings.Builder
	if l := lr.fc.keyLeader(key); l != nil {
		fmt.Fprintf(&b, "shard leader %s", l.name)
	} else {
		b.WriteString("shard leader unknown")
	}
	lr.res.mu.Lock()
	for l, h := range lr.res.inside[key] {
		fmt.Fprintf(&b, "; inside: %s token %d, lease open %v", h.who, l.Token(), leaseOpen(l))
	}
	lr.res.mu.Unlock()
	gs := lr.fc.applies.grantsByKey()[key]
	for _, g := range gs[max(0, len(gs)-3):] {
		fmt.Fprintf(&b, "; granted token %d to session %d of %s at %.3fs", g.Token, g.Session, g.Owner, g.first.Sub(lr.hist.base).Seconds())
	}
	fmt.Fprintf(&b, "; now %.3fs; network %v", time.Duration(lr.hist.now()).Seconds(), lr.fc.net)
	return b.String()
}

// verify runs every checker and returns all violations.
func (lr *loadRun) verify(t testing.TB) []string {
	lr.res.mu.Lock()
	v := append([]string(nil), lr.res.violations...)
	lr.res.mu.Unlock()
	lr.mu.Lock()
	v = append(v, lr.extra...)
	lr.mu.Unlock()
	v = append(v, lr.checkApplies()...)
	return append(v, lr.hist.check(t.TempDir())...)
}

// checkApplies runs the apply log's checkers with the rule of lr's lock
// for which grants may be held together.
func (lr *loadRun) checkApplies() []string {
	var may together
	if lr.model != nil && lr.model.together != nil {
		may = func(key string, held []keyGrant, next keyGrant) (bool, string) {
			return lr.model.together(lr, key, held, next)
		}
	}
	return lr.fc.applies.checkWith(lr.hist.base, lr.sights, may)
}

// nemesis injects one fault into a running cluster and heals it; it
// returns when the cluster is healed. It may check what must not happen
// during the fault through lr.violate.
type nemesis struct {
	name   string
	inject func(ctx context.Context, lr *loadRun)
	// opts configures the nemesis's cluster (zero: the defaults).
	opts faultOpts
}

// faultFor is how long a fault lasts: longer than a TTL plus the new
// leader's grace, so sessions can expire during it.
const faultFor = 3 * time.Second

// gossipFaultFor is how long gossip is cut: past memberlist's suspicion
// timeout on loopback (3 probe intervals of 1s for 3 peers) plus a probe
// or two, so the cut-off peer is declared dead, not only suspected.
const gossipFaultFor = 6 * time.Second

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

var nemeses = []nemesis{
	{name: "leader-isolation", inject: func(ctx context.Context, lr *loadRun) {
		fc := lr.fc
		victim := fc.mostLeading()
		fc.net.Isolate(victim.name)
		sleepCtx(ctx, faultFor)
		fc.net.Heal()
	}},
	{name: "minority-partition", inject: func(ctx context.Context, lr *loadRun) {
		fc := lr.fc
		victim := fc.leastLeading()
		fc.net.Partition([]string{victim.name}, fc.others(victim))
		sleepCtx(ctx, faultFor)
		fc.net.Heal()
	}},
	{name: "majority-partition", inject: func(ctx context.Context, lr *loadRun) {
		// The majority side keeps working; the minority side, which led
		// the most shards, must not grant anything while cut off.
		fc := lr.fc
		minority := fc.mostLeading()
		cut := lr.hist.now()
		fc.net.Partition([]string{minority.name}, fc.others(minority))
		sleepCtx(ctx, faultFor)
		healed := lr.hist.now()
		fc.net.Heal()
		lr.mu.Lock()
		defer lr.mu.Unlock()
		for _, g := range lr.grants {
			if g.peer == minority.name && g.call > cut && g.ret < healed {
				lr.extra = append(lr.extra, fmt.Sprintf("minority peer %s granted a lock asked for at %.3fs, returned %.3fs, inside the partition [%.3fs, %.3fs]",
					g.peer, time.Duration(g.call).Seconds(), time.Duration(g.ret).Seconds(), time.Duration(cut).Seconds(), time.Duration(healed).Seconds()))
			}
		}
	}},
	{name: "one-way-leader", inject: func(ctx context.Context, lr *loadRun) {
		// The leader hears everyone but nobody hears it.
		fc := lr.fc
		victim := fc.mostLeading()
		for _, o := range fc.others(victim) {
			fc.net.OneWay(victim.name, o)
		}
		sleepCtx(ctx, faultFor)
		fc.net.Heal()
	}},
	{name: "gossip-partition", inject: func(ctx context.Context, lr *loadRun) {
		// Gossip alone is cut between the peer leading the most shards and
		// the others, long enough for memberlist to declare it dead on both
		// sides; Raft and RPC stay connected. Raft and RPC addresses are
		// resolved through gossip, so the peer may still drop out; what
		// matters is that no lock is granted twice and that gossip heals.
		fc := lr.fc
		victim := fc.mostLeading()
		fc.gossipNet.Partition([]string{victim.name}, fc.others(victim))
		observer := fc.peers[0]
		if observer == victim {
			observer = fc.peers[1]
		}
		declaredDead := false
		// At least gossipFaultFor, and on until the observer has declared
		// the victim dead (memberlist takes 4-6 s here, longer under load),
		// up to three times that.
		end, hardEnd := time.Now().Add(gossipFaultFor), time.Now().Add(3*gossipFaultFor)
		for (time.Now().Before(end) || (!declaredDead && time.Now().Before(hardEnd))) && ctx.Err() == nil {
			if _, ok := observer.node().peer.Mesh().Member(victim.name); !ok && !declaredDead {
				declaredDead = true
				fc.t.Logf("gossip-partition: %s dropped %s from its gossip view %.1fs into the cut",
					observer.name, victim.name, (gossipFaultFor - time.Until(end)).Seconds())
			}
			sleepCtx(ctx, 50*time.Millisecond)
		}
		fc.gossipNet.Heal()
		if !declaredDead {
			lr.violate("gossip-partition: %s still saw %s alive after %v without gossip; the nemesis did not exercise failure detection", observer.name, victim.name, 3*gossipFaultFor)
		}
		// Every peer must see every other alive again.
		deadline := time.Now().Add(livenessBound(fc.opts.ttl))
		for _, p := range fc.peers {
			for len(p.node().peer.Mesh().Members()) < len(fc.peers) {
				if time.Now().After(deadline) || ctx.Err() != nil {
					lr.violate("gossip-partition: %s sees %d of %d members %v after healing", p.name, len(p.node().peer.Mesh().Members()), len(fc.peers), livenessBound(fc.opts.ttl))
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	}},
	{name: "isolate-hold", inject: func(ctx context.Context, lr *loadRun) {
		// Not a pause (see isolateHold): the peer is cut off for longer
		// than the TTL and its load workers stop where they are, holders
		// inside checking nothing; its node runs on, and its clock too, so
		// its lease timers are due when its holders look again.
		fc := lr.fc
		victim := fc.mostLeading()
		fc.isolateHold(victim, false)
		sleepCtx(ctx, 2*fc.opts.ttl+time.Second)
		fc.rejoinHeld(victim)
	}},
	{name: "isolate-hold-frozen-clock", inject: func(ctx context.Context, lr *loadRun) {
		// The same with the peer's lease clock frozen meanwhile: its
		// holders see the whole fault pass at once when they look again.
		fc := lr.fc
		victim := fc.mostLeading()
		fc.isolateHold(victim, true)
		sleepCtx(ctx, 2*fc.opts.ttl+time.Second)
		fc.rejoinHeld(victim)
	}},
	{name: "disk-stall", inject: func(ctx context.Context, lr *loadRun) {
		// The fsyncs of the peer leading the shards of the most keys block
		// for 1.4×TTL under load: its Raft groups stop (one LogDB for all)
		// and lose leadership, while its lease expiry loop runs on with the
		// view it had, and decides to expire sessions that keep alive with
		// the new leaders (issue 10, bug 1).
		stallDisk(ctx, lr, lr.fc.leadingKeys(lr.keys), diskStallFor(lr.fc.opts.ttl))
	}},
	{name: "kill-restart", inject: func(ctx context.Context, lr *loadRun) {
		// A crash that loses every write not synced, then a restart from
		// what is left on the disk.
		fc := lr.fc
		victim := fc.mostLeading()
		fc.t.Logf("kill-restart: %s crashed; its disk lost %v", victim.name, fc.kill(victim))
		sleepCtx(ctx, 2*time.Second)
		fc.restart(victim)
	}},
	{name: "clock-jump", inject: func(ctx context.Context, lr *loadRun) {
		// Jumps smaller than the lease margin, forward and back, on the
		// peer leading most shards: the design tolerates clock errors up
		// to LeaseMargin per TTL (docs/SAFETY.md).
		fc := lr.fc
		victim := fc.mostLeading()
		j := fc.peers[0].node().cfg.LeaseMargin / 2
		for i := 0; i < 3 && ctx.Err() == nil; i++ {
			victim.clock.Jump(j)
			sleepCtx(ctx, fc.opts.ttl/2)
			victim.clock.Jump(-j)
			sleepCtx(ctx, fc.opts.ttl/2)
		}
	}},
	{name: "clock-skew", inject: func(ctx context.Context, lr *loadRun) {
		// Lease clocks run at different rates, in the direction that eats
		// the margin, at half of what the design tolerates
		// (docs/SAFETY.md): the peer leading the fewest shards runs slow
		// (its holders keep their leases late), the others fast (as
		// leaders they expire sessions early). The slow peer is then cut
		// off, so its sessions are expired by fast leaders while its
		// holders hold on.
		fc := lr.fc
		victim := fc.leastLeading()
		fast, slow := skewRates(fc.peers[0].node().cfg, 0.5)
		skewClocks(fc, victim, fast, slow)
		fc.net.Isolate(victim.name)
		sleepCtx(ctx, faultFor)
		fc.net.Heal()
		unskewClocks(fc)
	}},
	{name: "delay-drop", inject: func(ctx context.Context, lr *loadRun) {
		// Every link to and from the peer leading the most shards first
		// delays messages 20-60 ms and loses 10% of them (a TCP write
		// breaks its connection), then its outgoing links fall 150 ms
		// behind, past the election timeout: followers elect anew while
		// its old-term messages are still arriving.
		fc := lr.fc
		victim := fc.mostLeading()
		for _, o := range fc.others(victim) {
			for _, l := range [][2]string{{victim.name, o}, {o, victim.name}} {
				fc.net.Delay(l[0], l[1], 20*time.Millisecond+rand.N(40*time.Millisecond))
				fc.net.DropRate(l[0], l[1], 0.1)
			}
		}
		sleepCtx(ctx, faultFor/2)
		fc.net.Heal()
		for _, o := range fc.others(victim) {
			fc.net.Delay(victim.name, o, 150*time.Millisecond)
		}
		sleepCtx(ctx, faultFor/2)
		fc.net.Heal()
	}},
	{name: "snapshot-during-partition", inject: func(ctx context.Context, lr *loadRun) {
		fc := lr.fc
		victim := fc.leastLeading()
		fc.net.Partition([]string{victim.name}, fc.others(victim))
		sleepCtx(ctx, faultFor/2)
		// Snapshot and compact every shard on the connected peers, so the
		// cut-off replica can only catch up from a snapshot.
		for _, p := range fc.peers {
			if p == victim {
				continue
			}
			n := p.node()
			for _, shard := range n.peer.Placement().ShardIDs() {
				sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				_, err := n.peer.NodeHost().SyncRequestSnapshot(sctx, shard, dragonboat.SnapshotOption{OverrideCompactionOverhead: true, CompactionOverhead: 0})
				cancel()
				if err != nil && !errors.Is(err, dragonboat.ErrRejected) {
					fc.t.Logf("snapshot of shard %d on %s: %v", shard, p.name, err)
				}
			}
		}
		sleepCtx(ctx, faultFor/2)
		fc.net.Heal()
		// The replica must catch up: a linearizable read on each of its
		// shards needs it applied up to the leader's commit index.
		deadline := time.Now().Add(livenessBound(fc.opts.ttl))
		n := victim.node()
		for _, shard := range n.peer.Placement().ShardIDs() {
			var q any = replica.Query{Kind: replica.QuerySessions}
			if shard == layout.MetaShard {
				q = nil
			}
			for {
				rctx, cancel := context.WithTimeout(ctx, time.Second)
				_, err := n.peer.NodeHost().SyncRead(rctx, shard, q)
				cancel()
				if err == nil {
					break
				}
				if time.Now().After(deadline) || ctx.Err() != nil {
					lr.violate("snapshot: %s did not catch up on shard %d: %v", victim.name, shard, err)
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
		chunks := 0
		for _, o := range fc.others(victim) {
			chunks += fc.net.SnapshotChunks(o, victim.name)
		}
		if chunks == 0 {
			lr.violate("snapshot: %s caught up without receiving any snapshot chunk; the nemesis did not exercise snapshot transfer", victim.name)
		}
	}},
	{name: "membership", inject: injectMembership},
	{name: "membership-faults", inject: injectMembershipFaults, opts: faultOpts{mutate: func(c *Config) { c.DeadAfter = replaceDeadAfter }}},
}

// diskStallFor is how long the disk-stall nemesis stalls a disk: past the
// TTL, so the stalled leader's expiry loop finds sessions lapsed, and not
// much more, so its proposals are still in flight when it wakes.
func diskStallFor(ttl time.Duration) time.Duration { return ttl * 14 / 10 }

// stallDisk stalls victim's fsyncs for d, counted from the first fsync the
// stall blocks, then releases them. It reports as a violation a stall that
// blocked nothing. The load parks every worker now and then (all waiting
// behind long holds, which write nothing), and a stall that began in such
// a lull once ran its whole d without the victim trying to write: it
// stalled nothing and saw nothing. So d starts when the victim first
// waits, which it does within d of the stall at the latest, or the
// violation is reported.
func stallDisk(ctx context.Context, lr *loadRun, victim *faultPeer, d time.Duration) {
	fc := lr.fc
	before, leads := victim.stall.blocked.Load(), fc.leaderCounts()
	victim.stall.Stall(false)
	for first := time.Now(); victim.stall.blocked.Load() == before && time.Since(first) < d && ctx.Err() == nil; {
		sleepCtx(ctx, 5*time.Millisecond)
	}
	sleepCtx(ctx, d)
	victim.stall.Release()
	blocked := victim.stall.blocked.Load() - before
	fc.t.Logf("disk-stall: %s's fsyncs stalled %v (%d calls waited); leaders before %v, after %v", victim.name, d, blocked, leads, fc.leaderCounts())
	if blocked == 0 {
		lr.violate("disk-stall: no fsync of %s waited during the %v stall; the nemesis stalled nothing", victim.name, d)
	}
}

// skewRates are the clock rates of the clock-skew nemeses: fast for the
// leader, slow for holders, so that fast/slow = 1 + share × the most the
// design tolerates, TTL/(TTL-LeaseMargin) - 1 (docs/SAFETY.md). share < 1
// is inside the model; share > 1 is beyond it.
func skewRates(cfg Config, share float64) (fast, slow float64) {
	limit := float64(cfg.SessionTTL) / float64(cfg.SessionTTL-cfg.LeaseMargin) // ratio at which the margin is used up
	ratio := 1 + share*(limit-1)
	// fast × slow = 1, fast / slow = ratio
	fast = math.Sqrt(ratio)
	return fast, 1 / fast
}

// skewClocks makes holder's lease clock run at slow and every other
// peer's at fast.
func skewClocks(fc *faultCluster, holder *faultPeer, fast, slow float64) {
	for _, p := range fc.peers {
		if p == holder {
			p.clock.Skew(slow)
		} else {
			p.clock.Skew(fast)
		}
	}
	fc.t.Logf("clock skew: %s at rate %.4f, the others at %.4f (ratio %.4f)", holder.name, slow, fast, fast/slow)
}

// unskewClocks puts every lease clock back to the real rate, where it
// stands: no clock jumps.
func unskewClocks(fc *faultCluster) {
	for _, p := range fc.peers {
		p.clock.Skew(1)
	}
}

// membershipWithin bounds one round of the membership nemesis: two peers
// join and host replicas, an old peer drains, leaves and is forgotten.
const membershipWithin = 40 * time.Second

// membershipPeers is the cluster size the membership nemesis grows to
// before one peer leaves.
const membershipPeers = 5

// hostsAny reports whether the layout lists name as a replica of a shard.
func hostsAny(pl *layout.Placement, name string) bool {
	for _, shard := range pl.ShardIDs() {
		if pl.Hosts(shard, name) {
			return true
		}
	}
	return false
}

// waitLayout polls the layout, read linearizably from the meta shard
// through observer, until ok holds; it reports whether it did by deadline.
func waitLayout(ctx context.Context, observer *faultPeer, deadline time.Time, ok func(*layout.Placement) bool) (*layout.Placement, bool) {
	var last *layout.Placement
	for {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		pl, err := observer.node().readMetaPlacement(rctx)
		cancel()
		if err == nil {
			last = pl
			if ok(pl) {
				return pl, true
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return last, false
		}
		sleepCtx(ctx, 50*time.Millisecond)
	}
}

// describeOwnView is what p itself believes, for messages: the layout
// epoch it last adopted and the replicas it runs.
func describeOwnView(p *faultPeer) string {
	n := p.node()
	epoch := uint64(0)
	if pl := n.peer.Placement(); pl != nil {
		epoch = pl.Epoch
	}
	running := n.peer.Replicas().Running()
	return fmt.Sprintf("%s's own view: layout epoch %d, runs replicas (shard:replica) %v", p.name, epoch, running)
}

// describeLayout is the layout as "shard: peers" for messages.
func describeLayout(pl *layout.Placement) string {
	if pl == nil {
		return "unreadable"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "epoch %d:", pl.Epoch)
	for _, shard := range pl.ShardIDs() {
		fmt.Fprintf(&b, " %d%v", shard, pl.HostNames(shard))
	}
	for _, pe := range pl.Peers {
		if pe.Draining {
			fmt.Fprintf(&b, " (%s draining)", pe.Name)
		}
	}
	return b.String()
}

// injectMembership grows the cluster to membershipPeers peers with peers
// that join it under load (BootstrapExpect 0, every fault hook), waits
// until the layout gives each of them a replica, then makes the peer
// leading the most shards among those present before the round (the
// original three in the first round) Leave gracefully and waits until the
// layout forgets it. The new peers get workers too; the leaving peer's
// workers stop when it closes. In a soak each round adds one peer and
// removes one.
func injectMembership(ctx context.Context, lr *loadRun) {
	membershipRound(ctx, lr, "membership", membershipFaults{})
}

// injectMembershipFaults is the membership round with faults in force
// while peers join and leave: joins alternate between one made while the
// peer leading the fewest shards is cut off (faultFor) and one made while
// the disk of the peer leading the most shards stalls (diskStallFor); the
// leaving peer leaves, and a crashed peer is replaced, while another peer's
// disk stalls. Each fault ends on its own timer, whatever the join, leave
// or replacement is doing; the round waits for it before the next step.
// Each step within membershipWithin.
func injectMembershipFaults(ctx context.Context, lr *loadRun) {
	membershipRound(ctx, lr, "membership-faults", membershipFaults{
		join: func(fc *faultCluster, i int) (string, time.Duration, func() func()) {
			if (len(fc.retired)+i)%2 == 0 { // in a soak, later rounds alternate
				victim := fc.leastLeading()
				return victim.name + " cut off", faultFor, func() func() {
					fc.net.Isolate(victim.name)
					return func() { fc.net.Rejoin(victim.name) }
				}
			}
			return stallAnother(" disk stalled")(fc, nil)
		},
		leave:   stallAnother(" disk stalled during the leave"),
		replace: stallAnother(" disk stalled during the replacement"),
	})
}

// stallAnother is a membership fault that stalls the disk of the peer
// leading the most shards other than p (the one leaving or replaced; nil
// for none).
func stallAnother(what string) func(fc *faultCluster, p *faultPeer) (string, time.Duration, func() func()) {
	return func(fc *faultCluster, p *faultPeer) (string, time.Duration, func() func()) {
		var rest []*faultPeer
		for _, q := range fc.peers {
			if q != p {
				rest = append(rest, q)
			}
		}
		victim := fc.pickByLeads(rest, true)
		return victim.name + what, diskStallFor(fc.opts.ttl), func() func() {
			victim.stall.Stall(false)
			return victim.stall.Release
		}
	}
}

// membershipFaults are the faults a membership round runs while the i-th
// peer joins and while a peer leaves: each names the fault, how long it
// lasts, and a start function that returns the fault's end. Nil runs none.
type membershipFaults struct {
	join  func(fc *faultCluster, i int) (what string, d time.Duration, start func() (end func()))
	leave func(fc *faultCluster, leaving *faultPeer) (what string, d time.Duration, start func() (end func()))
	// replace, when set, ends the round by crashing a peer for longer than
	// DeadAfter, with this fault in force, until the cluster has replaced
	// its replicas and forgotten it; the peer then restarts from its disk
	// and is admitted again as a new peer.
	replace func(fc *faultCluster, victim *faultPeer) (what string, d time.Duration, start func() (end func()))
}

// replaceDeadAfter is DeadAfter in the membership-faults cluster: longer
// than its cuts (faultFor), so only the crashed peer is replaced.
const replaceDeadAfter = 5 * time.Second

// membershipRound is one round of the membership nemeses (see
// injectMembership), with faults in force while peers join and leave.
func membershipRound(ctx context.Context, lr *loadRun, name string, mf membershipFaults) {
	fc := lr.fc
	begin := time.Now()
	deadline := begin.Add(membershipWithin)
	before := append([]*faultPeer(nil), fc.peers...)
	var joined, faults []string
	// fault starts a fault now and ends it d later; the channel it returns
	// closes then (at once when there is no fault).
	fault := func(what string, d time.Duration, start func() (end func())) <-chan struct{} {
		ended := make(chan struct{})
		if start == nil {
			close(ended)
			return ended
		}
		faults = append(faults, what)
		end := start()
		time.AfterFunc(d, func() {
			end()
			close(ended)
		})
		return ended
	}
	for i := 0; len(fc.peers) < membershipPeers && ctx.Err() == nil; i++ {
		var ended <-chan struct{} = fault("", 0, nil)
		if mf.join != nil {
			ended = fault(mf.join(fc, i))
		}
		p := fc.addPeer()
		lr.startWorkers(ctx, p)
		joined = append(joined, p.name)
		<-ended
	}
	observer := before[0]
	pl, ok := waitLayout(ctx, observer, deadline, func(pl *layout.Placement) bool {
		for _, name := range joined {
			if !hostsAny(pl, name) {
				return false
			}
		}
		return true
	})
	if !ok {
		lr.violate("%s: %v joined (faults: %v) but not all host a replica %v after they started; layout %s", name, joined, faults, membershipWithin, describeLayout(pl))
		return
	}
	hosting := time.Since(begin)

	leaving := fc.pickByLeads(before, true)
	if leaving == observer {
		observer = fc.peers[len(fc.peers)-1]
	}
	leads := fc.leaderCounts()[leaving.name]
	var ended <-chan struct{} = fault("", 0, nil)
	if mf.leave != nil {
		ended = fault(mf.leave(fc, leaving))
	}
	lctx, cancel := context.WithDeadline(ctx, deadline)
	leaveStart, leaveCall := time.Now(), lr.hist.now()
	err := fc.leave(lctx, leaving)
	leaveRet := lr.hist.now()
	cancel()
	<-ended
	if err != nil {
		// Say what was stuck: the layout as the remaining peers see it,
		// and who leads what.
		pl, _ := waitLayout(ctx, observer, time.Now().Add(2*time.Second), func(*layout.Placement) bool { return true })
		lr.violate("%s: %s did not leave within %v of the round's start (faults: %v): %v; layout %s; leaders %v; %s",
			name, leaving.name, membershipWithin, faults, err, describeLayout(pl), fc.leaderCounts(), describeOwnView(leaving))
		return
	}
	left := time.Since(leaveStart)
	pl, ok = waitLayout(ctx, observer, deadline, func(pl *layout.Placement) bool {
		_, listed := pl.Peer(leaving.name)
		return !listed
	})
	if !ok {
		lr.violate("%s: the layout still lists %s %v after the round started (faults: %v): %s", name, leaving.name, membershipWithin, faults, describeLayout(pl))
		return
	}
	forgotten := time.Since(begin)
	replaced := ""
	if mf.replace != nil {
		if replaced = replaceRound(ctx, lr, name, observer, fault, mf); replaced == "" {
			return
		}
	}
	grants := map[string]int{}
	lr.mu.Lock()
	for _, g := range lr.grants {
		grants[g.peer]++
	}
	lr.mu.Unlock()
	fc.t.Logf("%s: %v joined and hosted replicas in %.1fs; %s (leading %d shards) left in %.1fs (history time %.3fs-%.3fs); forgotten %.1fs after the start;%s faults: %v; grants so far by peer %v; layout %s",
		name, joined, hosting.Seconds(), leaving.name, leads, left.Seconds(), time.Duration(leaveCall).Seconds(), time.Duration(leaveRet).Seconds(), forgotten.Seconds(), replaced, faults, grants, describeLayout(pl))
}

// replaceRound crashes the peer leading the fewest shards (never the
// observer) with mf.replace's fault in force, waits until the cluster has
// replaced its replicas and forgotten it, then restarts it from its disk
// and waits until it is admitted again as a new peer. It returns a
// description for the round's log line, or "" after reporting a violation.
func replaceRound(ctx context.Context, lr *loadRun, name string, observer *faultPeer,
	fault func(string, time.Duration, func() func()) <-chan struct{}, mf membershipFaults) string {
	fc := lr.fc
	var candidates []*faultPeer
	for _, p := range fc.peers {
		if p != observer {
			candidates = append(candidates, p)
		}
	}
	victim := fc.pickByLeads(candidates, false)
	start := time.Now()
	deadline := start.Add(membershipWithin)
	loss := fc.kill(victim)
	ended := fault(mf.replace(fc, victim))
	pl, ok := waitLayout(ctx, observer, deadline, func(pl *layout.Placement) bool {
		_, listed := pl.Peer(victim.name)
		return !listed
	})
	<-ended
	gone := time.Since(start)
	// Restart it whatever happened: the liveness check and the next round
	// expect every peer up.
	fc.restart(victim)
	if !ok {
		lr.violate("%s: crashed %s still listed %v after the crash (DeadAfter %v); layout %s", name, victim.name, gone, observer.node().cfg.DeadAfter, describeLayout(pl))
		return ""
	}
	pl, ok = waitLayout(ctx, observer, deadline, func(pl *layout.Placement) bool {
		_, listed := pl.Peer(victim.name)
		return listed
	})
	if !ok {
		lr.violate("%s: restarted %s not admitted again %v after its crash; layout %s", name, victim.name, membershipWithin, describeLayout(pl))
		return ""
	}
	return fmt.Sprintf(" %s crashed (lost %v), replaced and forgotten %.1fs later, admitted again %.1fs after the crash;", victim.name, loss, gone.Seconds(), time.Since(start).Seconds())
}

// nemesisResult is what one run checked.
type nemesisResult struct {
	ops, keys  int
	violations []string
	elapsed    time.Duration
}

// runNemesis starts a fault cluster, runs load, injects nm's fault (again
// and again until soak ends, at least once), checks liveness after each
// heal, then stops the load and runs every checker.
func runNemesis(t *testing.T, nm nemesis, soak time.Duration, o faultOpts) nemesisResult {
	return runNemesisModel(t, nm, soak, o, nil)
}

// runNemesisModel is runNemesis with the workers taking model's locks
// (nil: Node.Lock); its summary line names the model ("nemesis
// rw-disk-stall").
func runNemesisModel(t *testing.T, nm nemesis, soak time.Duration, o faultOpts, model *familyModel) nemesisResult {
	start := time.Now()
	if o.ttl == 0 {
		o.ttl = nemesisTTL
	}
	fc := startFaultCluster(t, o)
	lr := newLoadRun(fc)
	name := nm.name
	if model != nil {
		model.use(lr)
		name = model.name + "-" + nm.name
		if model.checkKeys != nil {
			model.checkKeys(t, fc)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var watched func()
	if model != nil && model.watch {
		watched = startWatchChecks(context.Background(), lr, t.Logf)
	}
	wg := lr.start(ctx)
	sleepCtx(ctx, 1500*time.Millisecond) // warm up: sessions open, leaders settle
	for round := 0; round == 0 || time.Since(start) < soak; round++ {
		nm.inject(ctx, lr)
		lr.checkLiveness(ctx, time.Now())
		sleepCtx(ctx, time.Second)
	}
	cancel()
	wg.Wait()
	if watched != nil {
		watched()
	}
	ops, keys := lr.hist.size()
	r := nemesisResult{ops: ops, keys: keys, violations: lr.verify(t), elapsed: time.Since(start)}
	t.Logf("%s; %d stale holders fenced off", fc.applies.describe(), lr.res.rejections.Load())
	if model != nil {
		t.Logf("%d holders entered beside others with open leases", lr.res.beside.Load())
	}
	t.Logf("nemesis %s: %d ops, %d keys, %d violations, %.1fs", name, r.ops, r.keys, len(r.violations), r.elapsed.Seconds())
	if len(r.violations) > 0 {
		t.Logf("violations by checker: %v", violationKinds(r.violations))
	}
	return r
}

func TestNemesis(t *testing.T) {
	if testing.Short() {
		t.Skip("nemesis suite skipped in -short mode")
	}
	for _, nm := range nemeses {
		t.Run(nm.name, func(t *testing.T) {
			r := runNemesis(t, nm, 0, nm.opts)
			reportViolations(t, r)
			if r.ops < 100 {
				t.Errorf("only %d ops checked: the load did not run", r.ops)
			}
		})
	}
}

// reportViolations fails t for each violation. There is no way to excuse
// one: a violation is never a skip.
func reportViolations(t *testing.T, r nemesisResult) {
	t.Helper()
	for _, v := range r.violations {
		t.Error(v)
	}
}

// The suite must be able to fail: with leaders expiring sessions after a
// quarter of the TTL and no new-leader grace, while holders stay inside for
// half a TTL trusting Done() and peers are cut off for a little over half a
// TTL, porcupine, the resource and the lease-overlap checker must all
// report violations.
func TestBrokenVariantIsCaught(t *testing.T) {
	if testing.Short() {
		t.Skip("nemesis suite skipped in -short mode")
	}
	o := faultOpts{hook: func(h *peer.Hooks) { h.UnsafeExpireAfter = nemesisTTL / 4 }}
	fc := startFaultCluster(t, o)
	lr := newLoadRun(fc)
	lr.hold = func() time.Duration { return nemesisTTL/2 + time.Duration(rand.IntN(50))*time.Millisecond }
	start := time.Now()
	// At least 6s, then until the resource and the lease-overlap checker
	// have both seen an overlap, at most 24s: whether a stale holder is
	// still inside when the next one enters depends on Raft timing, so a
	// fixed 6s run sometimes gave the resource only a token-order report
	// (seen once). porcupine is judged on the whole history at the end.
	ctx, cancel := context.WithTimeout(context.Background(), 24*time.Second)
	defer cancel()
	wg := lr.start(ctx)
	// Cut each peer off in turn for a little over half a TTL: long enough
	// for the broken leaders to expire its sessions, short enough that its
	// holders' leases (TTL minus margin) stay open throughout. The correct
	// code survives exactly this (see the nemesis suite).
	for i := 0; ctx.Err() == nil; i++ {
		sleepCtx(ctx, 300*time.Millisecond)
		victim := fc.peers[i%len(fc.peers)]
		fc.net.Isolate(victim.name)
		sleepCtx(ctx, 600*time.Millisecond)
		fc.net.Heal()
		if time.Since(start) > 6*time.Second && lr.res.count("inside at once") > 0 &&
			violationKinds(fc.applies.check(lr.hist.base, lr.sights))["lease-overlap"] > 0 {
			cancel()
		}
	}
	wg.Wait()
	ops, keys := lr.hist.size()
	v := lr.verify(t)
	t.Logf("nemesis broken-expiry: %d ops, %d keys, %d violations, %.1fs", ops, keys, len(v), time.Since(start).Seconds())
	kinds := violationKinds(v)
	t.Logf("violations by checker: %v", kinds)
	if kinds["porcupine"] == 0 || kinds["inside-at-once"] == 0 || kinds["lease-overlap"] == 0 {
		t.Fatalf("sessions expired at TTL/4 under holders inside for TTL/2, yet porcupine, the resource and the lease-overlap checker did not all report it: %v", v)
	}
	logViolations(t, v, 5)
}

// untilOverlap runs round until the lease-overlap checker reports
// something, at most max times, and returns how many rounds ran. It is for
// tests that prove the checker catches a fault: each round is one attempt
// at the situation the fault needs (a holder inside, with a waiter, when
// the lease is wrongly cut short), which depends on Raft timing; the
// verdict comes from the whole run's checkers afterwards.
func (lr *loadRun) untilOverlap(ctx context.Context, max int, round func()) int {
	for i := 1; ; i++ {
		round()
		if i == max || ctx.Err() != nil || violationKinds(lr.checkApplies())["lease-overlap"] > 0 {
			return i
		}
	}
}

// violationKinds counts violations by the checker that reported them.
func violationKinds(v []string) map[string]int {
	kinds := map[string]int{}
	for _, s := range v {
		switch {
		case strings.Contains(s, "not linearizable"):
			kinds["porcupine"]++
		case strings.Contains(s, "inside at once"):
			kinds["inside-at-once"]++
		case strings.Contains(s, "over the limit"):
			kinds["permits-over-limit"]++
		case strings.Contains(s, "partial hold"):
			kinds["partial-hold"]++
		case strings.Contains(s, "no replica applied"):
			kinds["unapplied-grant"]++
		case strings.Contains(s, "lease overlap"):
			kinds["lease-overlap"]++
		case strings.Contains(s, "fence admitted"):
			kinds["fence"]++
		case strings.Contains(s, "applied grants") || strings.Contains(s, "apply stream"):
			kinds["apply-streams"]++
		case strings.Contains(s, "entered with token") || strings.Contains(s, "granted twice") || strings.Contains(s, "granted after") || strings.Contains(s, "granted at shard"):
			kinds["token-order"]++
		case strings.Contains(s, "liveness"):
			kinds["liveness"]++
		default:
			kinds["other"]++
		}
	}
	return kinds
}

// logViolations logs the first n violations.
func logViolations(t *testing.T, v []string, n int) {
	t.Helper()
	for i, s := range v {
		if i == n {
			break
		}
		t.Logf("caught: %s", s)
	}
}

// Bug 1 of issue 10 must be caught in the CI tier: with the term fence
// skipped (unsafeSkipExpiryTerm), a shard leader whose disk stalls for
// 1.4×TTL decides, with its frozen view, to expire sessions that keep
// alive with its successor, and its ExpireSession commits under the
// successor. Holders stay inside for 2-3 TTL on 3 keys (so they have
// waiters), and the stall aims at the leader of a key another peer's holder
// has just entered, in rounds until the lease-overlap checker reports it
// (at most 8; one to four in 16 runs).
func TestStalledLeaderExpiryIsCaught(t *testing.T) {
	if testing.Short() {
		t.Skip("nemesis suite skipped in -short mode")
	}
	fc := startFaultCluster(t, faultOpts{hook: func(h *peer.Hooks) {
		h.UnsafeSkipExpiryTerm = true
		// The deposed leader's ExpireSession reaches its successor as a
		// Propose its replica forwards over Raft, which the Raft port's
		// filter drops (a leader-only command from the network): it is a
		// second fence, off here so that the first one's absence shows.
		h.UnsafeNoRaftFilter = true
	}})
	longFor := func() time.Duration { return 2*nemesisTTL + rand.N(nemesisTTL) }
	v, kinds, _ := runUntilOverlap(t, fc, "stalled-leader-expiry (unsafeSkipExpiryTerm)", longFor, 8, func(ctx context.Context, lr *loadRun) {
		// Stall the leader of a key another peer's holder has just
		// entered for 2-3 TTL: it is still inside when the stalled
		// leader's expiry commits, 1.4 TTL on.
		ev, victim, ok := lr.awaitEnter(ctx, func(ev enterEvent) *faultPeer {
			if l := fc.keyLeader(ev.key); l != ev.peer {
				return l
			}
			return nil
		})
		if !ok {
			t.Fatal("no holder entered a key led by another peer within a minute")
		}
		t.Logf("%s entered %s; stalling its shard's leader %s", ev.peer.name, ev.key, victim.name)
		stallDisk(ctx, lr, victim, diskStallFor(nemesisTTL))
		sleepCtx(ctx, nemesisTTL) // the expired holders learn of it at their next keepalive
	})
	if kinds["lease-overlap"] == 0 {
		t.Fatalf("a stalled leader's expiry committed under its successor without the term fence, yet the lease-overlap checker reported nothing (all violations: %v)", v)
	}
}

// Clock rates further apart than the lease margin allows are outside the
// model (docs/SAFETY.md): a leader whose clock runs fast expires a session
// while the holder, whose clock runs slow, still trusts Done(). This test
// documents that, and that the checkers see it: with the fast/slow ratio
// at 1 + 4× (TTL/(TTL-LeaseMargin) - 1), about 1.44 for a 10% margin,
// holders on a slow peer that is cut off see their leases open after the
// lock was granted on; the lease-overlap checker must report it. The
// fence still rejects the stale holder's writes (counted, not failures).
// The peer of a holder that has just entered a key led by another peer is
// the slow one and is cut off, in rounds until the checker reports it (at
// most 4); 3 keys make sure its holders have waiters.
func TestClockSkewBeyondMarginIsCaught(t *testing.T) {
	if testing.Short() {
		t.Skip("nemesis suite skipped in -short mode")
	}
	fc := startFaultCluster(t, faultOpts{})
	longFor := func() time.Duration { return 3*nemesisTTL/2 + rand.N(nemesisTTL) }
	fast, slow := skewRates(fc.peers[0].node().cfg, 4)
	v, kinds, lr := runUntilOverlap(t, fc, "clock-skew-beyond-margin", longFor, 4, func(ctx context.Context, lr *loadRun) {
		// Cut off, with a slow clock, the peer of a holder that has just
		// entered a key led by another (fast) peer, for 1.5 TTL: its
		// hold of 1.5-2.5 TTL lasts past the fast leader's expiry.
		ev, victim, ok := lr.awaitEnter(ctx, func(ev enterEvent) *faultPeer {
			if l := fc.keyLeader(ev.key); l != nil && l != ev.peer {
				return ev.peer
			}
			return nil
		})
		if !ok {
			t.Fatal("no holder entered a key led by another peer within a minute")
		}
		t.Logf("%s entered %s; cutting it off", ev.peer.name, ev.key)
		skewClocks(fc, victim, fast, slow)
		fc.net.Isolate(victim.name)
		sleepCtx(ctx, 3*nemesisTTL/2)
		fc.net.Heal()
		unskewClocks(fc)
		sleepCtx(ctx, nemesisTTL/2)
	})
	t.Logf("%d stale writes fenced off", lr.res.rejections.Load())
	if kinds["lease-overlap"] == 0 {
		t.Fatalf("clock rates %.3f and %.3f (beyond the lease margin) under cut-off holders, yet the lease-overlap checker reported nothing (all violations: %v)", fast, slow, v)
	}
}

// runUntilOverlap runs long-hold load (every lock held for longFor) on 3
// keys of fc, so that holders have waiters, and calls round, at most
// maxRounds times, until the lease-overlap checker reports. It then stops
// the load, logs the nemesis summary line under name, and returns every
// checker's violations, counted by checker too.
func runUntilOverlap(t *testing.T, fc *faultCluster, name string, longFor func() time.Duration, maxRounds int,
	round func(ctx context.Context, lr *loadRun)) (v []string, kinds map[string]int, lr *loadRun) {
	t.Helper()
	lr = newLoadRun(fc)
	lr.longShare = 1
	lr.longFor = longFor
	lr.keys = nemesisKeys[:3]
	lr.enters = make(chan enterEvent, 64)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	wg := lr.start(ctx)
	sleepCtx(ctx, 1500*time.Millisecond)
	rounds := lr.untilOverlap(ctx, maxRounds, func() { round(ctx, lr) })
	t.Logf("the lease-overlap checker caught it after %d of at most %d rounds", rounds, maxRounds)
	cancel()
	wg.Wait()
	ops, keys := lr.hist.size()
	v = lr.verify(t)
	kinds = violationKinds(v)
	t.Logf("nemesis %s: %d ops, %d keys, %d violations, %.1fs", name, ops, keys, len(v), time.Since(start).Seconds())
	t.Logf("violations by checker: %v", kinds)
	logViolations(t, v, 5)
	return v, kinds, lr
}
