package node

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/lockmesh/lockmesh/internal/client"
	"github.com/lockmesh/lockmesh/internal/level"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// Leader election, built on the mutex: an election is the key of its
// name, its leader the key's holder, its candidates the key's waiters,
// and a term the fencing token of a leader's grant. So it carries the
// mutex's guarantees: candidates are elected in FIFO order, terms strictly
// increase across leaders, leader changes, restarts and retries, a
// leader's Done closes before the cluster can elect anyone else, and a
// resignation elects the next candidate in the same Raft entry. The
// leader's proclamation is its hold's value (WithValue, Lock.SetValue),
// fenced on its term. docs/ELECTION.md compares it with etcd's
// concurrency.Election and Curator's LeaderLatch.

// ErrNoLeader is returned by Leader when nobody leads the election.
var ErrNoLeader = errors.New("lockmesh: no leader")

// Election is a leader election among the Sessions that campaign on its
// name. The name is a key, and takes a hash tag as keys do; an election
// and a lock of the same name are the same key, so give elections names
// of their own ("election/ingest"). Make one with Session.Election; it is
// safe for concurrent use.
type Election struct {
	s    *Session
	name string
}

// Election returns the election called name, campaigned in through this
// Session. The name is checked when it is used.
func (s *Session) Election(name string) *Election { return &Election{s: s, name: name} }

// Name returns the election's name.
func (e *Election) Name() string { return e.name }

// Leadership is a term of office won by Campaign. It is over when Done
// closes: the leader resigned, its Session's lease may have run out, or
// the node closed; Err says which. It is never renewed: a Session that
// lost its leadership campaigns again (RunElected does that in a loop).
type Leadership struct {
	e *Election
	l *Lock

	resign    sync.Once
	resignErr error
}

// Campaign waits until this Session is elected, in FIFO order among the
// candidates of its priority (WithPriority: a candidate of higher
// priority is elected first), and returns its leadership, proclaiming
// value (at most MaxValueLen bytes; nil for none) for Leader and
// observers to read. WithMaxHold bounds the term: the cluster ends it
// then, as if the lease had run out. A WithValue among opts is
// ignored: value is the proclamation.
//
// It never returns a leadership without a live lease: a candidate whose
// Session is lost while it waits, or whose lease ran out by the time it
// was elected, gets an error wrapping ErrLeaseExpired, and the cluster
// hands the leadership on. When ctx ends first the candidate withdraws
// and a *WaitError says whom it waited behind, as for Lock.
//
// A Session campaigns on a name once at a time: a second Campaign on the
// same name while the first waits or leads fails at once with
// ErrAlreadyHeld. Needs feature level 4.
func (e *Election) Campaign(ctx context.Context, value []byte, opts ...LockOption) (*Leadership, error) {
	if err := nilContext(ctx, "Election.Campaign"); err != nil {
		return nil, err
	}
	if err := e.check(value); err != nil {
		return nil, err
	}
	spec, err := e.s.n.spec(client.Spec{}, opts)
	if err != nil {
		return nil, err
	}
	spec.Value = value
	if err := e.s.n.needLevel(level.Coordination, "elections"); err != nil {
		return nil, err
	}
	elected, end, err := e.s.campaign(e.name)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	c, err := e.s.n.campaigns.join(cancel)
	if err != nil {
		end()
		return nil, fmt.Errorf("campaign in %q: %w", e.name, err)
	}
	// A candidate's wait is not deadlock-checked, so that candidates of
	// higher priority may pass it (WithPriority).
	l, err := e.s.acquireChecked(ctx, e.name, true, spec, nil, false)
	if err != nil {
		end()
		e.s.n.campaigns.drop(c)
		if cause := context.Cause(ctx); errors.Is(cause, errLeaving) {
			err = fmt.Errorf("%w: %v", cause, err)
		}
		return nil, fmt.Errorf("campaign in %q: %w", e.name, err)
	}
	if err := l.Err(); err != nil {
		// Elected after the lease ran out: another may be elected any
		// moment, so this is no leadership. The release hands it on.
		end()
		e.s.n.campaigns.drop(c)
		_ = l.Release()
		return nil, fmt.Errorf("campaign in %q: elected with term %d after the lease ended: %w", e.name, l.Token(), err)
	}
	elected(l)
	ld := &Leadership{e: e, l: l}
	if !e.s.n.campaigns.lead(c, ld) {
		// The peer began to leave as it was elected.
		_ = ld.Resign(context.WithoutCancel(ctx))
		end()
		return nil, fmt.Errorf("campaign in %q: %w", e.name, errLeaving)
	}
	// The campaign is over when the leadership is, however it ends.
	l.h.AfterDone(func() {
		end()
		e.s.n.campaigns.drop(c)
	})
	return ld, nil
}

// check refuses a bad name or value before anything is sent.
func (e *Election) check(value []byte) error {
	if err := lockfsm.ValidateKey(e.name); err != nil {
		return fmt.Errorf("%w: election name: %v", ErrInvalidKey, err)
	}
	return checkValue("a campaign's value", value)
}

// campaignRecord is a Session's campaign in one election: l is its
// leadership's lock once elected.
type campaignRecord struct{ l *Lock }

// campaign records that the Session campaigns on name, or fails with
// ErrAlreadyHeld if it does already: it waits, or leads and its Done is
// open (a leadership whose Done closed is over, even before its record
// is cleared). elected records the leadership's lock; end forgets the
// record.
func (s *Session) campaign(name string) (elected func(*Lock), end func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rec := s.campaigns[name]; rec != nil && (rec.l == nil || rec.l.Err() == nil) {
		return nil, nil, fmt.Errorf("campaign in %q: %w: this Session campaigns in it already (it waits or leads); resign first, or campaign through another Session", name, ErrAlreadyHeld)
	}
	if s.campaigns == nil {
		s.campaigns = map[string]*campaignRecord{}
	}
	rec := &campaignRecord{}
	s.campaigns[name] = rec
	return func(l *Lock) {
			s.mu.Lock()
			rec.l = l
			s.mu.Unlock()
		}, func() {
			s.mu.Lock()
			if s.campaigns[name] == rec {
				delete(s.campaigns, name)
			}
			s.mu.Unlock()
		}, nil
}

// Election returns the election this leadership is of.
func (ld *Leadership) Election() *Election { return ld.e }

// Term returns this leadership's term: the fencing token of its grant,
// strictly greater than every earlier leader's of the election. Pass it
// to what the leader writes to (see Fence), so a deposed leader's late
// writes are refused.
func (ld *Leadership) Term() uint64 { return ld.l.Token() }

// Done is closed when this leader can no longer rely on its leadership,
// before the cluster can elect anyone else (see Lock.Done).
func (ld *Leadership) Done() <-chan struct{} { return ld.l.Done() }

// Err returns nil while the leadership holds, then why Done closed:
// ErrLeaseExpired, ErrNotHeld (after Resign) or ErrClosed.
func (ld *Leadership) Err() error { return ld.l.Err() }

// Context returns a context derived from parent that is cancelled when
// the leadership ends, with a cause that says why (see Lock.Context).
func (ld *Leadership) Context(parent context.Context) context.Context {
	return ld.l.Context(parent)
}

// Value returns what this leader proclaims: Campaign's value, or its last
// Proclaim's that committed.
func (ld *Leadership) Value() []byte { return ld.l.Value() }

// Proclaim replaces what the leader proclaims, without an election, once
// the change commits. It is fenced on the term: a leader deposed meanwhile
// fails with ErrNotHeld (or its Err's error, once Done closed), and never
// writes over its successor's proclamation.
func (ld *Leadership) Proclaim(ctx context.Context, value []byte) error {
	if err := nilContext(ctx, "Leadership.Proclaim"); err != nil {
		return err
	}
	if err := checkValue("a proclamation", value); err != nil {
		return err
	}
	if err := ld.l.SetValue(ctx, value); err != nil {
		return fmt.Errorf("proclaim in %q (term %d): %w", ld.e.name, ld.Term(), err)
	}
	return nil
}

// Resign ends the leadership and, in the same Raft entry, elects the next
// candidate: nobody waits out a TTL. Done closes before the resignation
// is proposed. It is idempotent: every call returns what the first did,
// nil once the resignation committed (as Lock.Unlock says, a resignation
// still uncommitted when ctx ends goes on in the background). A
// leadership already lost returns its Err's error.
func (ld *Leadership) Resign(ctx context.Context) error {
	ld.resign.Do(func() {
		if err := ld.l.Unlock(ctx); err != nil {
			ld.resignErr = fmt.Errorf("resign from %q (term %d): %w", ld.e.name, ld.Term(), err)
		}
	})
	return ld.resignErr
}

// LeaderInfo is who leads an election, as a linearizable read found it.
type LeaderInfo struct {
	// Value is what the leader proclaims.
	Value []byte
	// Term is the leader's term: its grant's fencing token.
	Term uint64
	// Peer is the name of the leader's peer, and Session its Session's ID.
	Peer    string
	Session uint64
	// For is how long it has led, as the replica that answered saw it
	// (see Holder.Age, and AtLeast).
	For     time.Duration
	AtLeast bool
	// Candidates counts the Sessions waiting to lead after it.
	Candidates int
}

// Leader returns the election's leader, read through the Raft log's read
// index (linearizable), or an error wrapping ErrNoLeader when nobody
// leads it.
func (e *Election) Leader(ctx context.Context) (LeaderInfo, error) {
	if err := nilContext(ctx, "Election.Leader"); err != nil {
		return LeaderInfo{}, err
	}
	if err := e.check(nil); err != nil {
		return LeaderInfo{}, err
	}
	return e.s.n.Leader(ctx, e.name)
}

// Leader returns the leader of the election called name, as
// Election.Leader does, without a Session.
func (n *Node) Leader(ctx context.Context, name string) (LeaderInfo, error) {
	if err := nilContext(ctx, "Node.Leader"); err != nil {
		return LeaderInfo{}, err
	}
	info, err := n.Inspect(ctx, name)
	if err != nil {
		return LeaderInfo{}, fmt.Errorf("leader of %q: %w", name, err)
	}
	if len(info.Holders) == 0 {
		return LeaderInfo{}, fmt.Errorf("election %q: %w (%d candidates waiting)", name, ErrNoLeader, len(info.Waiters))
	}
	h := info.Holders[0]
	return LeaderInfo{Value: h.Value, Term: h.Token, Peer: h.Peer, Session: h.Session, For: h.Age, AtLeast: h.AtLeast, Candidates: len(info.Waiters)}, nil
}

// RunElected runs fn while this Session leads election e, campaigning
// with value until it is elected, and again each time it loses the
// leadership, until ctx ends or fn returns while leading. fn gets a
// context cancelled when the leadership ends (Leadership.Context), with
// the cause, and must stop acting as leader once it is cancelled.
//
// When fn returns while still leading, RunElected resigns (the next
// candidate is elected at once) and returns fn's error. When the
// leadership ends first, it waits for fn to return and campaigns again;
// a Session that was lost ends RunElected with its error (run it with a
// new Session per call, if that should not end it). When
// ctx ends, it withdraws or resigns and returns ctx's error.
func RunElected(ctx context.Context, e *Election, value []byte, fn func(ctx context.Context, ld *Leadership) error) error {
	for {
		ld, err := e.Campaign(ctx, value)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, ErrLeaseExpired) && e.s.Err() == nil {
				continue // elected too late; the Session lives on
			}
			return err
		}
		fnErr := fn(ld.Context(ctx), ld)
		lost := ld.Err() != nil
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unlockBound)
		resignErr := ld.Resign(rctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case !lost:
			if resignErr != nil {
				return errors.Join(fnErr, resignErr)
			}
			return fnErr
		case e.s.Err() != nil:
			return fmt.Errorf("run elected in %q: %w", e.name, e.s.Err())
		}
	}
}

// errLeaving ends the campaigns of a peer that leaves the cluster.
var errLeaving = fmt.Errorf("%w: this peer is leaving the cluster (Leave)", ErrClosed)

// campaigns are a Node's campaigns, waiting or leading, so that Leave
// can end them before it moves the peer's replicas away.
type campaigns struct {
	mu      sync.Mutex
	leaving bool
	all     map[*campaignEntry]struct{}
}

// campaignEntry is one campaign: cancel withdraws it while it waits, ld
// is its leadership once elected.
type campaignEntry struct {
	cancel context.CancelCauseFunc
	ld     *Leadership
}

// join records a campaign, or fails once the peer is leaving.
func (cs *campaigns) join(cancel context.CancelCauseFunc) (*campaignEntry, error) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.leaving {
		return nil, errLeaving
	}
	if cs.all == nil {
		cs.all = map[*campaignEntry]struct{}{}
	}
	c := &campaignEntry{cancel: cancel}
	cs.all[c] = struct{}{}
	return c, nil
}

// lead records that c was elected, and reports false if the peer is
// leaving: the caller resigns.
func (cs *campaigns) lead(c *campaignEntry, ld *Leadership) bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.leaving {
		delete(cs.all, c)
		return false
	}
	c.ld = ld
	return true
}

// drop forgets c.
func (cs *campaigns) drop(c *campaignEntry) {
	cs.mu.Lock()
	delete(cs.all, c)
	cs.mu.Unlock()
}

// leave refuses new campaigns, withdraws the waiting ones and resigns
// the leaderships, each resignation bounded by ctx and unlockBound.
func (cs *campaigns) leave(ctx context.Context) {
	cs.mu.Lock()
	cs.leaving = true
	var leading []*Leadership
	for c := range cs.all {
		if c.ld != nil {
			leading = append(leading, c.ld)
		} else {
			c.cancel(errLeaving)
		}
	}
	cs.mu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, unlockBound)
	defer cancel()
	for _, ld := range leading {
		_ = ld.Resign(rctx)
	}
}

// LeaderEvent is a change of an election's leader, as Observe reports it.
type LeaderEvent struct {
	// Index is the Raft index of the entry that made the change, or of
	// the state a Resync (or the first event) read.
	Index uint64
	// Leader is who leads after the change, nil when nobody does. Its For,
	// AtLeast and Candidates are not set.
	Leader *LeaderInfo
	// Resync is set when the election's state was read again because the
	// entries since the last event were no longer held (Watch): changes
	// between the two may have been missed, and this is the state after
	// them.
	Resync bool
	// Err, on the last event before the channel closes, says why the
	// observation ended; the channel also closes without one when ctx
	// ends.
	Err error
}

// Observe reports the election's leader, first as a linearizable read
// found it (Leader nil when vacant), then every change in term order: a
// new leader, a vacancy, a new proclamation. A leader that resigns to the
// next candidate in one entry is one change, to the next leader. It is a
// Watch of the election's name, with its guarantees and its policy for a
// consumer that falls behind (a Resync, never a silent gap). Needs
// feature level 4.
func (e *Election) Observe(ctx context.Context) (<-chan LeaderEvent, error) {
	if err := nilContext(ctx, "Election.Observe"); err != nil {
		return nil, err
	}
	return e.s.n.Observe(ctx, e.name)
}

// Observe reports the leader of the election called name, as
// Election.Observe does, without a Session.
func (n *Node) Observe(ctx context.Context, name string) (<-chan LeaderEvent, error) {
	if err := nilContext(ctx, "Node.Observe"); err != nil {
		return nil, err
	}
	if err := lockfsm.ValidateKey(name); err != nil {
		return nil, fmt.Errorf("%w: election name: %v", ErrInvalidKey, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	watch, err := n.Watch(ctx, name)
	if err != nil {
		cancel()
		return nil, err
	}
	out := make(chan LeaderEvent, 16)
	go func() {
		defer cancel()
		defer close(out)
		var leader *LeaderInfo
		send := func(ev LeaderEvent) bool {
			select {
			case out <- ev:
				return true
			case <-ctx.Done():
				return false
			}
		}
		first := true
		for r := range watch {
			switch {
			case r.Err != nil:
				send(LeaderEvent{Index: r.Index, Leader: leader, Err: r.Err})
				return
			case r.Snapshot:
				leader = nil
				if len(r.Keys) > 0 && len(r.Keys[0].Holders) > 0 {
					leader = leaderOf(r.Keys[0].Holders[0])
				}
				if !send(LeaderEvent{Index: r.Index, Leader: leader, Resync: r.Resync && !first}) {
					return
				}
				first = false
			case len(r.Events) > 0:
				next := leader
				for _, ev := range r.Events {
					switch ev.Kind {
					case Granted:
						next = leaderOf(ev.Holder)
					case Released, Expired:
						if next != nil && next.Term == ev.Holder.Token {
							next = nil
						}
					case ValueChanged:
						if next != nil && next.Term == ev.Holder.Token {
							changed := *next
							changed.Value = ev.Holder.Value
							next = &changed
						}
					}
				}
				if sameLeader(leader, next) {
					continue
				}
				leader = next
				if !send(LeaderEvent{Index: r.Index, Leader: leader}) {
					return
				}
			}
		}
	}()
	return out, nil
}

func leaderOf(h Holder) *LeaderInfo {
	return &LeaderInfo{Value: h.Value, Term: h.Token, Peer: h.Peer, Session: h.Session}
}

func sameLeader(a, b *LeaderInfo) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Term == b.Term && string(a.Value) == string(b.Value)
}
