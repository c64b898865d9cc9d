package mesh

import (
	"cmp"
	"slices"
	"time"

	"github.com/lockmesh/lockmesh/internal/level"
)

// A NodeHostID names the NodeHost that Raft messages for it must reach,
// and without a gossip key any peer can gossip any NodeHostID. The rules
// that keep one member from taking another's over, applied to the view as
// memberlist reports members:
//
//  1. A NodeHostID is held by the first live member seen gossiping it; this
//     peer always holds its own. The Registry resolves it to its holder's
//     RaftAddr, and to nothing else.
//  2. A member gossiping a NodeHostID another member holds is refused: it
//     stays out of the view (Members, Member, events, resolution) and is
//     listed by Conflicts, with one rate-limited warning naming both.
//  3. The holder's own updates apply: the same name may change its
//     addresses or restart, and keeps its NodeHostID.
//  4. When the holder dies or leaves, its NodeHostID stays reserved for its
//     name for Config.ReclaimAfter (resolving to nothing), so that a holder
//     declared dead by mistake or by a forged message, which refutes it
//     within seconds, or restarted under its name, keeps it. After that the
//     member refused longest ago for that NodeHostID, if any, takes it.
//
// A holder that changes its own NodeHostID gives up the old one at once.

// DefaultReclaimAfter is Config.ReclaimAfter when it is zero.
const DefaultReclaimAfter = 30 * time.Second

// Conflict is a live member this peer refuses because it gossips a
// NodeHostID another member holds.
type Conflict struct {
	// Member is the refused member as it gossips itself.
	Member Member
	// Holder is the name of the member that holds Member.Meta.NodeHostID
	// (alive, or gone less than Config.ReclaimAfter ago).
	Holder string
}

// refusal is a member in Mesh.refused; seq orders refusals, oldest first.
type refusal struct {
	mem Member
	seq uint64
}

// Conflicts returns the live members refused for gossiping a NodeHostID
// another member holds, sorted by name. They are in neither Members nor
// Member, no event reports them, and no raft target resolves to them; one
// is admitted (an EventJoin) only if the holder goes and stays gone for
// Config.ReclaimAfter. A peer admitting members to a cluster should not
// admit these.
func (m *Mesh) Conflicts() []Conflict {
	m.viewMu.RLock()
	out := make([]Conflict, 0, len(m.refused))
	for _, r := range m.refused {
		out = append(out, Conflict{Member: r.mem, Holder: m.byHostID[r.mem.Meta.NodeHostID]})
	}
	m.viewMu.RUnlock()
	slices.SortFunc(out, func(a, b Conflict) int { return cmp.Compare(a.Member.Name, b.Member.Name) })
	return out
}

// claim decides whether mem may hold the NodeHostID it gossips, and
// returns the holder that refuses it if not. This peer's own claim evicts
// any other holder. viewMu must be held.
func (m *Mesh) claim(mem Member) (holder string, ok bool) {
	id := mem.Meta.NodeHostID
	holder, held := m.byHostID[id]
	if id == "" || !held || holder == mem.Name {
		return "", true
	}
	if mem.Name != m.cfg.Name {
		return holder, false
	}
	m.log.Warn("mesh: another member gossiped this peer's NodeHostID; it no longer resolves to it",
		"node_host_id", id, "member", holder)
	m.stopReservation(id)
	delete(m.byHostID, id)
	if other, in := m.view[holder]; in {
		m.drop(other)
		m.refuse(other, mem.Name)
	}
	return "", true
}

// admitMember adds mem, whose claim succeeded, to the view. viewMu must be held.
func (m *Mesh) admitMember(mem Member) {
	m.view[mem.Name] = mem
	delete(m.refused, mem.Name)
	if id := mem.Meta.NodeHostID; id != "" {
		m.byHostID[id] = mem.Name
		m.stopReservation(id)
	}
}

// refuse records mem as refused because holder holds its NodeHostID,
// warning when it was not refused for that already. viewMu must be held.
func (m *Mesh) refuse(mem Member, holder string) {
	prev, was := m.refused[mem.Name]
	seq := prev.seq
	if !was || prev.mem.Meta.NodeHostID != mem.Meta.NodeHostID {
		m.claimSeq++
		seq = m.claimSeq
		m.conflicts.Warn(m.log, "mesh: refusing a member that gossips a NodeHostID another member holds; raft messages keep going to the holder",
			"node_host_id", mem.Meta.NodeHostID, "member", mem.Name, "addr", mem.Addr,
			"raft_addr", mem.Meta.RaftAddr, "holder", holder)
	}
	m.refused[mem.Name] = refusal{mem: mem, seq: seq}
}

// drop takes mem, which is alive, out of the view with an EventLeave; a
// NodeHostID it held passes on at once (rule 4 does not apply: mem gave
// it up). viewMu must be held.
func (m *Mesh) drop(mem Member) {
	delete(m.view, mem.Name)
	mem.State = StateLeft
	m.push(Event{Kind: EventLeave, Member: mem})
	m.release(mem.Meta.NodeHostID, mem.Name)
}

// release gives up NodeHostID id if name holds it, passing it to the
// member refused longest ago for it. viewMu must be held.
func (m *Mesh) release(id, name string) {
	if id == "" || m.byHostID[id] != name {
		return
	}
	m.stopReservation(id)
	delete(m.byHostID, id)
	m.promote(id, name)
}

// depart removes mem, which died, left or was dropped by SetLevel, from
// the view and reserves its NodeHostID for it for ReclaimAfter (rule 4).
// viewMu must be held.
func (m *Mesh) depart(mem Member) {
	delete(m.view, mem.Name)
	id := mem.Meta.NodeHostID
	if id == "" || m.byHostID[id] != mem.Name || m.viewClosed {
		return
	}
	m.stopReservation(id)
	r := &reservation{}
	r.timer = time.AfterFunc(m.cfg.ReclaimAfter, func() { m.endReservation(id, mem.Name, r) })
	m.reserved[id] = r
}

// reservation is a departed holder's claim on its NodeHostID; its timer
// ends it.
type reservation struct{ timer *time.Timer }

// endReservation runs when the NodeHostID id of the departed holder name
// has been reserved for ReclaimAfter: it passes to the member refused
// longest ago for it, if any.
func (m *Mesh) endReservation(id, name string, r *reservation) {
	m.viewMu.Lock()
	defer m.viewMu.Unlock()
	if m.viewClosed || m.reserved[id] != r {
		return // the holder came back, or another reservation replaced this one
	}
	delete(m.reserved, id)
	if !m.inView(name) {
		m.release(id, name)
	}
}

// promote admits the member refused longest ago for NodeHostID id, which
// nobody holds now, that speaks the cluster's level. viewMu must be held.
func (m *Mesh) promote(id, formerHolder string) {
	lvl := level.Level(m.level.Load())
	var next *refusal
	for _, r := range m.refused {
		if r.mem.Meta.NodeHostID != id {
			continue
		}
		if lo, hi := r.mem.Meta.Levels(); lvl != 0 && (lvl < lo || lvl > hi) {
			continue
		}
		if next == nil || r.seq < next.seq {
			next = &r
		}
	}
	if next == nil {
		return
	}
	m.log.Warn("mesh: a NodeHostID passes to another member: its holder is gone",
		"node_host_id", id, "member", next.mem.Name, "former_holder", formerHolder)
	m.admitMember(next.mem)
	m.push(Event{Kind: EventJoin, Member: next.mem})
}

// stopReservation ends the reservation of id, if any. viewMu must be held.
func (m *Mesh) stopReservation(id string) {
	if r, ok := m.reserved[id]; ok {
		r.timer.Stop()
		delete(m.reserved, id)
	}
}

// closeView stops the reservations' timers; later ones do nothing.
func (m *Mesh) closeView() {
	m.viewMu.Lock()
	defer m.viewMu.Unlock()
	m.viewClosed = true
	for id := range m.reserved {
		m.stopReservation(id)
	}
}
