package lockfsm

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"math"
	"slices"

	"github.com/vmihailenco/msgpack/v5"
)

// Snapshot format (SnapshotVersion 4, written from feature level 4 on, and
// at any level by a state that holds what only it can carry; see
// MinSnapshotFormat): the version byte, then one canonical msgpack array
// (see the wire format in codec.go):
//
//	[index, lastToken, term, sessions, keys]
//	session: [id, owner, ttlMillis, ack, attempts, label]   sessions sorted by id
//	attempt: [req, key, state, token, last, kind, permits, group, size, deadlock, maxHoldMillis, value, priority]
//	                                                 attempts sorted by req
//	key:     [key, limit, holders, waiters, role]    keys sorted by bytes
//	holder:  [session, req, token]                   in grant order
//	waiter:  [session, req]                          in FIFO order
//
// Version 3 (feature level 3) attempts end at maxHoldMillis: they load
// without values or priorities. Version 2 sessions have no label ([id, owner, ttlMillis, ack, attempts]),
// attempts end at last and keys at waiters: they load as mutexes without
// groups, labels or the deadlock flag; version 1 snapshots also have no term ([index,
// lastToken, sessions, keys]) and load with term 0.
//
// Sorted order and shortest encodings make the snapshot a function of the
// state alone: equal states give equal bytes, and Load accepts only that
// form, so Save after Load of a current-version snapshot reproduces the
// input exactly.

const (
	snapshotFields   = 5
	snapshotFieldsV1 = 4
	sessionFields    = 6
	sessionFieldsV2  = 5
	attemptFields    = 13
	attemptFieldsV3  = 11
	attemptFieldsV2  = 5
	keyFields        = 5
	keyFieldsV2      = 4
	holderFields     = 3
	waiterFields     = 2
)

// Save writes the canonical snapshot of the state to w in the newest
// format, SnapshotVersion. The bytes depend only on the state, never on map
// order or history.
func (s *State) Save(w io.Writer) error { return s.SaveFormat(w, SnapshotVersion) }

// SaveFormat writes the canonical snapshot of the state to w in the given
// snapshot format: a cluster writes the format its feature level allows, so
// that every replica it may send the snapshot to can load it. This release
// writes formats 2 to 4. Format 2 cannot carry session labels or the
// lock family's state, format 3 no values: a state that holds them is
// refused with ErrVersion, as is any other format, before anything is
// written (MinSnapshotFormat says which format a state needs).
func (s *State) SaveFormat(w io.Writer, format byte) error {
	if format < 2 || format > SnapshotVersion {
		return fmt.Errorf("lockfsm: save snapshot: %w: format %d, this release writes 2 to %d", ErrVersion, format, SnapshotVersion)
	}
	if need := s.MinSnapshotFormat(); format < need {
		return fmt.Errorf("lockfsm: save snapshot: %w: format %d cannot hold this state's session labels, lock family or values, which need format %d", ErrVersion, format, need)
	}
	bw := bufio.NewWriter(w)
	if err := bw.WriteByte(format); err != nil {
		return fmt.Errorf("lockfsm: save snapshot: %w", err)
	}
	fields, atFields, kFields := sessionFields, attemptFields, keyFields
	switch format {
	case 2:
		fields, atFields, kFields = sessionFieldsV2, attemptFieldsV2, keyFieldsV2
	case 3:
		atFields = attemptFieldsV3
	}
	e := stickyEncoder{e: msgpack.NewEncoder(bw)}
	e.arrayLen(snapshotFields)
	e.uint(s.index)
	e.uint(s.lastToken)
	e.uint(s.term)

	ids := make([]uint64, 0, len(s.sessions))
	for id := range s.sessions {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	e.arrayLen(len(ids))
	reqs := []uint64{}
	for _, id := range ids {
		sess := s.sessions[id]
		e.arrayLen(fields)
		e.uint(sess.id)
		e.str(sess.owner)
		e.uint(sess.ttl)
		e.uint(sess.ack)
		reqs = reqs[:0]
		for req := range sess.reqs {
			reqs = append(reqs, req)
		}
		slices.Sort(reqs)
		e.arrayLen(len(reqs))
		for _, req := range reqs {
			at := sess.reqs[req]
			e.arrayLen(atFields)
			e.uint(req)
			e.str(at.key)
			e.uint(uint64(at.state))
			e.uint(at.token)
			e.uint(at.last)
			if atFields >= attemptFieldsV3 {
				e.uint(uint64(at.kind))
				e.uint(uint64(at.permits))
				e.uint(at.first(req) * uint64(min(at.size, 1))) // the group's first request id; 0 for none
				e.uint(uint64(at.size))
				e.bool(at.deadlock)
				e.uint(s.maxHold[ref{sess.id, req}])
			}
			if atFields == attemptFields {
				e.str(string(s.values[ref{sess.id, req}]))
				e.uint(uint64(at.priority))
			}
		}
		if fields == sessionFields {
			e.uint(sess.label)
		}
	}

	keys := make([]string, 0, len(s.keys))
	for key := range s.keys {
		keys = append(keys, key)
	}
	slices.Sort(keys)
	e.arrayLen(len(keys))
	for _, key := range keys {
		k := s.keys[key]
		e.arrayLen(kFields)
		e.str(key)
		e.uint(uint64(k.limit()))
		e.arrayLen(len(k.holders()))
		for _, h := range k.holders() {
			e.arrayLen(holderFields)
			e.uint(h.session)
			e.uint(h.req)
			e.uint(s.tokenOf(h))
		}
		e.arrayLen(len(k.waiters()))
		for _, h := range k.waiters() {
			e.arrayLen(waiterFields)
			e.uint(h.session)
			e.uint(h.req)
		}
		if kFields == keyFields {
			e.uint(uint64(k.role()))
		}
	}
	if e.err != nil {
		return fmt.Errorf("lockfsm: save snapshot: %w", e.err)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("lockfsm: save snapshot: %w", err)
	}
	return nil
}

// MinSnapshotFormat is the oldest snapshot format that can hold the state:
// 4 once it holds a value or a priority (feature level 4), 3 once it holds what only a
// cluster at feature level 3 writes (a session label, a key of the lock
// family, an attempt of a group or with the deadlock flag), else 2. A
// replica writes at least this format even while its own view of the
// cluster's level lags: the entry that made it was proposed at the
// higher level, so every member reads that format.
func (s *State) MinSnapshotFormat() byte {
	if len(s.values) > 0 {
		return 4
	}
	for _, sess := range s.sessions {
		for _, at := range sess.reqs {
			if at.priority != 0 {
				return 4
			}
		}
	}
	for _, sess := range s.sessions {
		if sess.label != 0 {
			return 3
		}
		for _, at := range sess.reqs {
			if at.kind != KindMutex || at.size != 0 || at.deadlock {
				return 3
			}
		}
	}
	for _, k := range s.keys {
		if k.role() != roleMutex {
			return 3
		}
	}
	if len(s.maxHold) > 0 {
		return 3
	}
	return 2
}

// stickyEncoder keeps the first write error so Save checks once.
type stickyEncoder struct {
	e   *msgpack.Encoder
	err error
}

func (e *stickyEncoder) arrayLen(n int) {
	if e.err == nil {
		e.err = e.e.EncodeArrayLen(n)
	}
}

func (e *stickyEncoder) uint(v uint64) {
	if e.err == nil {
		e.err = e.e.EncodeUint(v)
	}
}

func (e *stickyEncoder) bool(v bool) {
	if e.err == nil {
		e.err = e.e.EncodeBool(v)
	}
}

func (e *stickyEncoder) str(v string) {
	if e.err == nil {
		e.err = e.e.EncodeString(v)
	}
}

// Load replaces the whole state with the snapshot read from r. It reads at
// most MaxSnapshotSize bytes, checks every length against the input before
// allocating, accepts only the canonical form Save writes, and verifies the
// invariants (see Verify). On error the state is left unchanged and the
// error wraps ErrCorrupt or ErrVersion, or is the reader's error.
func (s *State) Load(r io.Reader) error {
	b, err := io.ReadAll(io.LimitReader(r, MaxSnapshotSize+1))
	if err != nil {
		return fmt.Errorf("lockfsm: load snapshot: %w", err)
	}
	ns, err := decodeSnapshot(b)
	if err != nil {
		return err
	}
	ns.broken = s.broken // a test's, kept across a restore
	*s = *ns
	return nil
}

func decodeSnapshot(b []byte) (*State, error) {
	d, err := newDecoder(b, MaxSnapshotSize, "snapshot", SnapshotVersion)
	if err != nil {
		return nil, err
	}
	fields := snapshotFields
	if d.version == 1 {
		fields = snapshotFieldsV1
	}
	if err := d.record("snapshot", fields); err != nil {
		return nil, err
	}
	s := New()
	s.index = d.uint("index", math.MaxUint64)
	s.lastToken = d.uint("lastToken", math.MaxUint64)
	if fields == snapshotFields {
		s.term = d.uint("term", math.MaxUint64)
	}
	if d.err != nil {
		return nil, d.err
	}

	sessFields, atFields, kFields := sessionFields, attemptFields, keyFields
	switch {
	case d.version < 3:
		sessFields, atFields, kFields = sessionFieldsV2, attemptFieldsV2, keyFieldsV2
	case d.version == 3:
		atFields = attemptFieldsV3
	}
	// Smallest session: header, id, owner, ttl, ack, attempts(, label).
	n, err := d.arrayLen("sessions", sessFields+1)
	if err != nil {
		return nil, err
	}
	var prevID uint64
	for i := 0; i < n; i++ {
		_ = d.record("session", sessFields)
		sess := &session{}
		sess.id = d.uint("session id", math.MaxUint64)
		sess.owner = d.str("owner", MaxOwnerLen)
		sess.ttl = d.uint("ttl", math.MaxUint64)
		sess.ack = d.uint("ack", math.MaxUint64)
		if d.err != nil {
			return nil, d.err
		}
		if i > 0 && sess.id <= prevID {
			return nil, d.errorf("session %d not in ascending order after %d", sess.id, prevID)
		}
		prevID = sess.id
		m, err := d.arrayLen("attempts", atFields+1)
		if err != nil {
			return nil, err
		}
		sess.reqs = make(map[uint64]*attempt, m)
		var prevReq uint64
		for j := 0; j < m; j++ {
			_ = d.record("attempt", atFields)
			req := d.uint("req", math.MaxUint64)
			at := &attempt{permits: 1}
			at.key = d.str("key", MaxKeyLen)
			at.state = ReqState(d.uint("state", math.MaxUint8))
			at.token = d.uint("token", math.MaxUint64)
			at.last = d.uint("last", math.MaxUint64)
			if atFields >= attemptFieldsV3 {
				at.kind = Kind(d.uint("kind", math.MaxUint8))
				at.permits = uint32(d.uint("permits", math.MaxUint32))
				group := d.uint("group", math.MaxUint64)
				at.size = uint16(d.uint("size", math.MaxUint16))
				at.deadlock = d.bool("deadlock")
				switch {
				case at.size == 0 && group != 0:
					d.fail("attempt %d: group at %d without a size", req, group)
				case at.size != 0 && (group > req || req-group >= uint64(min(at.size, MaxGroup))):
					d.fail("attempt %d: not in its group of %d at %d", req, at.size, group)
				case at.size != 0:
					at.offset = uint8(req - group)
				}
				if mh := d.uint("maxHoldMillis", math.MaxUint64); mh != 0 {
					if !at.state.live() {
						d.fail("attempt %d: a maximum hold kept for a %v attempt", req, at.state)
					}
					s.maxHold[ref{sess.id, req}] = mh
				}
			}
			if atFields == attemptFields {
				if v := d.str("value", MaxValueLen); v != "" {
					if !at.state.live() {
						d.fail("attempt %d: a value kept for a %v attempt", req, at.state)
					}
					s.values[ref{sess.id, req}] = []byte(v)
				}
				at.priority = uint8(d.uint("priority", math.MaxUint8))
			}
			if d.err != nil {
				return nil, d.err
			}
			if j > 0 && req <= prevReq {
				return nil, d.errorf("session %d: attempt %d not in ascending order after %d", sess.id, req, prevReq)
			}
			prevReq = req
			sess.reqs[req] = at
			switch at.state {
			case ReqHeld:
				sess.held++
			case ReqWaiting:
				sess.waiting++
			default:
				sess.terminal = append(sess.terminal, req)
			}
		}
		if sessFields == sessionFields {
			sess.label = d.uint("label", math.MaxUint64)
			if d.err != nil {
				return nil, d.err
			}
		}
		s.addSession(sess) // counts it for its owner: the counts are not in the snapshot
	}

	n, err = d.arrayLen("keys", kFields+1)
	if err != nil {
		return nil, err
	}
	var prevKey string
	for i := 0; i < n; i++ {
		_ = d.record("key", kFields)
		key := d.str("key", MaxKeyLen)
		k := newLockKey(uint32(d.uint("limit", math.MaxUint32)), roleMutex)
		if d.err != nil {
			return nil, d.err
		}
		if i > 0 && cmp.Compare(key, prevKey) <= 0 {
			return nil, d.errorf("key %q not in ascending order after %q", key, prevKey)
		}
		prevKey = key
		held, err := s.decodeSlots(d, "holders", holderFields)
		if err != nil {
			return nil, err
		}
		k.setHolders(held)
		waiters, err := s.decodeSlots(d, "waiters", waiterFields)
		if err != nil {
			return nil, err
		}
		k.setWaiters(waiters)
		if kFields == keyFields {
			k.setRole(role(d.uint("role", uint64(roleSemaphore))))
			if d.err != nil {
				return nil, d.err
			}
		}
		s.keys[key] = k
	}
	if err := d.end(); err != nil {
		return nil, err
	}
	if err := s.Verify(); err != nil {
		return nil, fmt.Errorf("lockfsm: decode snapshot: %w: inconsistent state: %v", ErrCorrupt, err)
	}
	s.shareKeys()
	return s, nil
}

// shareKeys points the key of every live attempt at the string of its entry
// in s.keys, as Apply does, so a held lock's key is stored once rather than
// once per decoded copy. Verify has checked that the strings are equal.
func (s *State) shareKeys() {
	for key, k := range s.keys {
		for _, list := range [2][]ref{k.holders(), k.waiters()} {
			for _, h := range list {
				s.sessions[h.session].reqs[h.req].key = key
			}
		}
	}
}

// decodeSlots decodes a holder or waiter list. A holder's token is not
// kept (the holder's attempt has it) but must be its attempt's: one that
// differs fails d. A holder whose attempt is missing is left for Verify.
func (s *State) decodeSlots(d *decoder, field string, fields int) ([]ref, error) {
	n, err := d.arrayLen(field, fields+1)
	if err != nil || n == 0 {
		return nil, err
	}
	out := make([]ref, n)
	for i := range out {
		_ = d.record(field, fields)
		out[i].session = d.uint("session", math.MaxUint64)
		out[i].req = d.uint("req", math.MaxUint64)
		if fields != holderFields {
			continue
		}
		token := d.uint("token", math.MaxUint64)
		if at := s.lookup(out[i]); at != nil && at.token != token {
			d.fail("holder (%d,%d): token %d, its attempt's is %d", out[i].session, out[i].req, token, at.token)
		}
	}
	return out, d.err
}
