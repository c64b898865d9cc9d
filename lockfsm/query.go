package lockfsm

import (
	"cmp"
	"slices"
	"strings"
)

// RequestInfo describes one lock attempt.
type RequestInfo struct {
	// Found is false when the attempt is unknown: never made, or terminal
	// and pruned after the client acknowledged it.
	Found bool
	// Key is the locked key; empty for the tombstone of a Cancel that
	// arrived before its Acquire.
	Key   string
	State ReqState
	// Token is the fencing token of the grant, once granted (also after release).
	Token uint64
}

// Request returns the state of the attempt (session, req). sessionFound is
// false when the session is unknown (expired or closed), in which case the
// attempt holds and awaits nothing.
func (s *State) Request(session, req uint64) (info RequestInfo, sessionFound bool) {
	sess := s.sessions[session]
	if sess == nil {
		return RequestInfo{}, false
	}
	at := sess.reqs[req]
	if at == nil {
		return RequestInfo{}, true
	}
	return RequestInfo{Found: true, Key: at.key, State: at.state, Token: at.token}, true
}

// Holder is a holder or waiter of a key. Waiters have Token 0. Owner and
// Label are its session's (Command.Owner and Command.Label); Kind,
// Permits and Value its attempt's (Permits is 1 but for semaphores).
type Holder struct {
	Session, Req, Token uint64
	Owner               string
	Label               uint64
	Kind                Kind
	Permits             uint32
	// Value is the attempt's Command.Value (feature level 4); the
	// results of refused acquires (Result.Holders) do not carry it.
	Value []byte `msgpack:",omitempty"`
}

// KeyInfo describes a key that is held or waited for.
type KeyInfo struct {
	Key   string
	Limit uint32
	// Role is the kind of lock the key is: KindMutex, KindWrite for a
	// read/write lock, or KindSemaphore.
	Role Kind
	// Holders in grant order (ascending tokens).
	Holders []Holder
	// Waiters in FIFO order: the first is granted next.
	Waiters []Holder
}

// Key returns the holders and waiters of key. ok is false when nobody holds
// or waits for it (such keys are not stored).
func (s *State) Key(key string) (info KeyInfo, ok bool) {
	k := s.keys[key]
	if k == nil {
		return KeyInfo{}, false
	}
	info = KeyInfo{Key: key, Limit: k.limit(), Role: k.role().kindName(), Holders: s.holders(k.holders(), 0), Waiters: s.holders(k.waiters(), 0)}
	return info, true
}

// holders describes the attempts slots, at most max of them (0: all).
func (s *State) holders(slots []ref, max int) []Holder {
	if max > 0 && len(slots) > max {
		slots = slots[:max]
	}
	if len(slots) == 0 {
		return nil
	}
	out := make([]Holder, len(slots))
	for i, h := range slots {
		out[i] = Holder{Session: h.session, Req: h.req, Permits: 1}
		if sess := s.sessions[h.session]; sess != nil {
			out[i].Owner, out[i].Label = sess.owner, sess.label
			if at := sess.reqs[h.req]; at != nil {
				out[i].Token, out[i].Kind, out[i].Permits = at.token, at.kind, at.permits
				out[i].Value = slices.Clone(s.values[h]) // the answer's own: callers may change it
			}
		}
	}
	return out
}

// SessionInfo describes a live session.
type SessionInfo struct {
	ID        uint64
	Owner     string
	TTLMillis uint64
	Label     uint64
	// Held and Waiting count the session's live attempts.
	Held, Waiting int
}

func (sess *session) info() SessionInfo {
	return SessionInfo{ID: sess.id, Owner: sess.owner, TTLMillis: sess.ttl, Label: sess.label, Held: sess.held, Waiting: sess.waiting}
}

// Sessions returns every live session sorted by ID. The leader uses it to
// start a keepalive timer for each after it takes over.
func (s *State) Sessions() []SessionInfo {
	out := make([]SessionInfo, 0, len(s.sessions))
	for _, sess := range s.sessions {
		out = append(out, sess.info())
	}
	slices.SortFunc(out, func(a, b SessionInfo) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// Session returns the live session id; ok is false if it is unknown.
func (s *State) Session(id uint64) (info SessionInfo, ok bool) {
	sess := s.sessions[id]
	if sess == nil {
		return SessionInfo{}, false
	}
	return sess.info(), true
}

// SessionCount returns how many sessions the shard holds, and how many of
// them owner has: the counts the session caps are checked against
// (MaxSessions, MaxSessionsPerOwner). It costs O(1), so a peer may ask it
// for every OpenSession it accepts.
func (s *State) SessionCount(owner string) (total, owned int) {
	return len(s.sessions), s.owned[owner]
}

// Stats counts what the state holds.
type Stats struct {
	// Index is the last applied entry index.
	Index uint64
	// Sessions, Keys, Holders and Waiters count live sessions, keys held or
	// waited for, holders and waiters across keys.
	Sessions, Keys, Holders, Waiters int
	// Attempts counts remembered attempts, live and terminal (the dedup table).
	Attempts int
	// NextToken is the fencing token the next grant of this shard will get.
	NextToken uint64
}

// Stats returns counts of the state's contents.
func (s *State) Stats() Stats {
	st := Stats{Index: s.index, Sessions: len(s.sessions), Keys: len(s.keys), NextToken: s.lastToken + 1}
	for _, k := range s.keys {
		st.Holders += len(k.holders())
		st.Waiters += len(k.waiters())
	}
	for _, sess := range s.sessions {
		st.Attempts += len(sess.reqs)
	}
	return st
}

// HoldInfo is a held lock with a maximum hold time (Command.MaxHoldMillis).
type HoldInfo struct {
	Session, Req  uint64
	MaxHoldMillis uint64
}

// MaxHolds returns the held attempts that have a maximum hold time, sorted
// by session and request id. The leader times them and ends them with
// ExpireHold.
func (s *State) MaxHolds() []HoldInfo {
	var out []HoldInfo
	for r, ms := range s.maxHold {
		if at := s.sessions[r.session].reqs[r.req]; at.state == ReqHeld {
			out = append(out, HoldInfo{Session: r.session, Req: r.req, MaxHoldMillis: ms})
		}
	}
	slices.SortFunc(out, func(a, b HoldInfo) int {
		return cmp.Or(cmp.Compare(a.Session, b.Session), cmp.Compare(a.Req, b.Req))
	})
	return out
}

// KeyQueue is a key with waiters: how many, and the first of them (the
// one granted next).
type KeyQueue struct {
	Key     string
	Waiters int
	First   Holder
}

// KeyHold is one holder of a key.
type KeyHold struct {
	Key string
	Holder
}

// Contention scans every key for the k keys with the longest queues
// (longest first, ties by key) and the k holders with the lowest tokens,
// the grants made longest ago (lowest first). It costs a pass over the
// keys and O(k) memory, and is meant for operators' queries, not for a
// loop.
func (s *State) Contention(k int) (queues []KeyQueue, oldest []KeyHold) {
	if k <= 0 {
		return nil, nil
	}
	type queue struct {
		key string
		k   *lockKey
	}
	type hold struct {
		key   string
		h     ref
		token uint64
	}
	var qs []queue
	var hs []hold
	longer := func(a, b queue) int {
		return cmp.Or(cmp.Compare(len(b.k.waiters()), len(a.k.waiters())), cmp.Compare(a.key, b.key))
	}
	older := func(a, b hold) int { return cmp.Compare(a.token, b.token) }
	for key, lk := range s.keys {
		if n := len(lk.waiters()); n > 0 && (len(qs) < k || longer(queue{key, lk}, qs[len(qs)-1]) < 0) {
			qs = insertBounded(qs, queue{key, lk}, k, longer)
		}
		for _, h := range lk.holders() {
			if t := s.attemptOf(h).token; len(hs) < k || t < hs[len(hs)-1].token {
				hs = insertBounded(hs, hold{key, h, t}, k, older)
			} else {
				break // the rest of the key's holders have higher tokens
			}
		}
	}
	for _, q := range qs {
		queues = append(queues, KeyQueue{Key: q.key, Waiters: len(q.k.waiters()), First: s.holders(q.k.waiters(), 1)[0]})
	}
	for _, h := range hs {
		oldest = append(oldest, KeyHold{Key: h.key, Holder: s.holders([]ref{h.h}, 1)[0]})
	}
	return queues, oldest
}

// insertBounded inserts v into s, sorted by cmp, keeping at most k.
func insertBounded[T any](s []T, v T, k int, cmp func(a, b T) int) []T {
	i, _ := slices.BinarySearchFunc(s, v, cmp)
	s = slices.Insert(s, i, v)
	if len(s) > k {
		s = s[:k]
	}
	return s
}

// LastToken is the fencing token of the shard's latest grant; 0 before
// the first.
func (s *State) LastToken() uint64 { return s.lastToken }

// KeysWithPrefix returns the keys that start with prefix, come after
// after in byte order ("" for the first), and are held or waited for,
// sorted, at most max of them; more is true when there were more. It
// scans every key of the shard.
func (s *State) KeysWithPrefix(prefix, after string, max int) (infos []KeyInfo, more bool) {
	var keys []string
	for key := range s.keys {
		if strings.HasPrefix(key, prefix) && key > after {
			keys = append(keys, key)
		}
	}
	slices.Sort(keys)
	if len(keys) > max {
		keys, more = keys[:max], true
	}
	for _, key := range keys {
		info, _ := s.Key(key)
		infos = append(infos, info)
	}
	return infos, more
}
