package lockfsm

import (
	"fmt"
)

// Verify checks the state's invariants and returns the first violation:
//   - every key has holders or waiters; its holders fit its role (a
//     mutex's at most Limit, a read/write lock's one writer or only
//     readers, a semaphore's permits at most Limit), each of its kind; and
//     its queue's head could not be granted now (alone, or with its group);
//   - holders are in grant order: tokens ascend and none exceeds the last
//     token issued by the shard;
//   - every holder and waiter is a live attempt of a live session, on that
//     key, listed exactly once, and every live attempt is listed;
//   - session counters and prune lists match their attempts; a group's
//     attempts wait all together or none;
//   - the count of live sessions per owner matches the sessions (it is not
//     checked against the caps: entries written before level 3 were not
//     capped, and their sessions stay).
//
// Load runs it on every snapshot; tests and fuzzers run it after Apply.
func (s *State) Verify() error {
	seen := map[ref]bool{}
	live := 0
	for key, k := range s.keys {
		if err := ValidateKey(key); err != nil {
			return err
		}
		if k.limit() == 0 {
			return fmt.Errorf("key %q: limit 0", key)
		}
		if len(k.holders()) == 0 && len(k.waiters()) == 0 {
			return fmt.Errorf("key %q: kept with no holders and no waiters", key)
		}
		if k.ext != nil && k.ext.queue != nil && len(k.ext.queue) == 0 {
			return fmt.Errorf("key %q: empty waiter queue kept", key)
		}
		for i, list := range [][]ref{k.holders(), k.waiters()} {
			want := ReqHeld
			if i == 1 {
				want = ReqWaiting
			}
			for _, h := range list {
				if seen[h] {
					return fmt.Errorf("key %q: attempt (%d,%d) listed twice", key, h.session, h.req)
				}
				seen[h] = true
				live++
				sess := s.sessions[h.session]
				if sess == nil {
					return fmt.Errorf("key %q: %v attempt (%d,%d) of unknown session", key, want, h.session, h.req)
				}
				at := sess.reqs[h.req]
				if at == nil || at.state != want || at.key != key {
					return fmt.Errorf("key %q: attempt (%d,%d) listed as %v disagrees with the session's record", key, h.session, h.req, want)
				}
			}
		}
		// Every holder is a held attempt now, whose token the sessions'
		// loop below checks against the last token issued.
		var prev uint64
		for _, h := range k.holders() {
			t := s.attemptOf(h).token
			if t <= prev {
				return fmt.Errorf("key %q: holder (%d,%d) token %d out of order (previous %d)", key, h.session, h.req, t, prev)
			}
			prev = t
		}
	}
	attempts := 0
	owned := map[string]int{}
	for id, sess := range s.sessions {
		owned[sess.owner]++
		if err := s.checkSessionID(id); err != nil {
			return err
		}
		if sess.id != id || sess.ttl == 0 || len(sess.owner) > MaxOwnerLen {
			return fmt.Errorf("session %d: bad id, ttl or owner", id)
		}
		held, waiting := 0, 0
		for req, at := range sess.reqs {
			if req == 0 {
				return fmt.Errorf("session %d: attempt with request id 0", id)
			}
			if at.priority != 0 && (at.deadlock || at.size != 0) {
				return fmt.Errorf("session %d: attempt %d: a priority with the deadlock check or a group, which Apply refuses", id, req)
			}
			switch at.state {
			case ReqHeld, ReqReleased:
				if at.token == 0 || at.token > s.lastToken {
					return fmt.Errorf("session %d: attempt %d: token %d out of range (last issued %d)", id, req, at.token, s.lastToken)
				}
			case ReqWaiting, ReqRejected, ReqCancelled:
				if at.token != 0 {
					return fmt.Errorf("session %d: attempt %d: %v with token %d", id, req, at.state, at.token)
				}
			default:
				return fmt.Errorf("session %d: attempt %d: unknown state %d", id, req, at.state)
			}
			if at.key == "" && at.state != ReqCancelled {
				return fmt.Errorf("session %d: attempt %d: %v without a key", id, req, at.state)
			}
			if at.key != "" {
				if err := ValidateKey(at.key); err != nil {
					return fmt.Errorf("session %d: attempt %d: %w", id, req, err)
				}
			}
			if at.last < req {
				return fmt.Errorf("session %d: attempt %d: last touching request %d below its own id", id, req, at.last)
			}
			if err := verifyAttempt(sess, req, at); err != nil {
				return fmt.Errorf("session %d: attempt %d: %w", id, req, err)
			}
			switch at.state {
			case ReqHeld:
				held++
			case ReqWaiting:
				waiting++
			}
		}
		if len(sess.terminal) != len(sess.reqs)-held-waiting {
			return fmt.Errorf("session %d: %d terminal attempts listed for pruning, %d recorded", id, len(sess.terminal), len(sess.reqs)-held-waiting)
		}
		listed := map[uint64]bool{}
		for _, req := range sess.terminal {
			at := sess.reqs[req]
			if at == nil || at.state.live() || listed[req] {
				return fmt.Errorf("session %d: attempt %d listed for pruning is missing, live or listed twice", id, req)
			}
			listed[req] = true
		}
		if held != sess.held || waiting != sess.waiting {
			return fmt.Errorf("session %d: counts held %d waiting %d, records say %d and %d", id, sess.held, sess.waiting, held, waiting)
		}
		attempts += held + waiting
	}
	if attempts != live {
		return fmt.Errorf("%d live attempts in sessions, %d holders and waiters in keys", attempts, live)
	}
	if len(owned) != len(s.owned) {
		return fmt.Errorf("sessions of %d owners counted for %d", len(owned), len(s.owned))
	}
	for owner, n := range owned {
		if s.owned[owner] != n {
			return fmt.Errorf("owner %q: %d sessions counted, %d live", owner, s.owned[owner], n)
		}
	}
	for r, ms := range s.maxHold {
		if at := s.lookup(r); ms == 0 || at == nil || !at.state.live() {
			return fmt.Errorf("maximum hold %dms kept for (%d,%d), which is not a live attempt", ms, r.session, r.req)
		}
	}
	for r, v := range s.values {
		if at := s.lookup(r); len(v) == 0 || len(v) > MaxValueLen || at == nil || !at.state.live() {
			return fmt.Errorf("value of %d bytes kept for (%d,%d), which is not a live attempt or not a value", len(v), r.session, r.req)
		}
	}
	// Every holder and waiter is now known to be a live attempt of a live
	// session, so the role rules can look them up.
	for key, k := range s.keys {
		if err := s.verifyKey(key, k); err != nil {
			return err
		}
	}
	return nil
}

// checkSessionID reports whether id could have been issued by an entry at
// or below the current index.
func (s *State) checkSessionID(id uint64) error {
	idx := id
	if id&extraSessionBit != 0 {
		idx = (id &^ extraSessionBit) >> 12
	}
	if idx == 0 || idx > s.index {
		return fmt.Errorf("session %d: not an id an entry up to index %d could issue", id, s.index)
	}
	return nil
}

// verifyKey checks k's role, limit and holders, and that its queue's head
// waits for a reason.
func (s *State) verifyKey(key string, k *lockKey) error {
	if k.role() > roleSemaphore {
		return fmt.Errorf("key %q: unknown role %d", key, k.role())
	}
	for i, list := range [][]ref{k.holders(), k.waiters()} {
		for _, h := range list {
			if at := s.attemptOf(h); roleOf(at.kind) != k.role() {
				return fmt.Errorf("key %q: a %s's %s attempt (%d,%d) (list %d)", key, k.role(), at.kind, h.session, h.req, i)
			}
		}
	}
	switch k.role() {
	case roleMutex:
		if uint64(len(k.holders())) > uint64(k.limit()) {
			return fmt.Errorf("key %q: %d holders, more than its limit %d", key, len(k.holders()), k.limit())
		}
	case roleRW:
		if k.limit() != 1 {
			return fmt.Errorf("key %q: read/write lock with limit %d", key, k.limit())
		}
		for _, h := range k.holders() {
			if at := s.attemptOf(h); at.kind == KindWrite && len(k.holders()) > 1 {
				return fmt.Errorf("key %q: a writer among %d holders", key, len(k.holders()))
			}
		}
	case roleSemaphore:
		if used := s.used(k); used > k.limit() {
			return fmt.Errorf("key %q: %d permits held of %d", key, used, k.limit())
		}
	}
	if w := k.waiters(); len(w) > 0 {
		sess := s.sessions[w[0].session]
		at := sess.reqs[w[0].req]
		if at.size == 0 && s.canGrant(k, at) || at.size != 0 && s.groupReady(sess, at.first(w[0].req), at.size) {
			return fmt.Errorf("key %q: its first waiter (%d,%d) could be granted", key, w[0].session, w[0].req)
		}
	}
	return nil
}

// verifyAttempt checks the lock family's fields of the attempt req.
func verifyAttempt(sess *session, req uint64, at *attempt) error {
	if at.kind > maxKind {
		return fmt.Errorf("unknown kind %d", at.kind)
	}
	if at.permits == 0 || at.permits != 1 && at.kind != KindSemaphore {
		return fmt.Errorf("%d permits for a %s attempt", at.permits, at.kind)
	}
	if at.size == 0 {
		if at.offset != 0 {
			return fmt.Errorf("place %d in no group", at.offset)
		}
		return nil
	}
	first := at.first(req)
	if at.size < 2 || at.size > MaxGroup || uint16(at.offset) >= at.size || req < uint64(at.offset) {
		return fmt.Errorf("not in its group of %d at %d", at.size, first)
	}
	if at.state != ReqWaiting {
		return nil
	}
	for r := first; r < first+uint64(at.size); r++ {
		if m := sess.reqs[r]; m == nil || m.state != ReqWaiting || m.first(r) != first || m.size != at.size {
			return fmt.Errorf("waits while attempt %d of its group does not", r)
		}
	}
	return nil
}
