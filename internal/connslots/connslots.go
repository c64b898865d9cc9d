// Package connslots decides which inbound connections a server keeps
// when more arrive than it will hold. lockmesh's RPC port (transport) and
// its Raft port (internal/raftnet) follow the same rules through it.
//
// A connection is unproven from its accept until it proves itself. With
// TLS it does so by completing its handshake, and the server's check of
// the verified certificate then makes it a member (a peer the layout
// lists) or a stranger (any other holder of a certificate of the CA).
// Without TLS there is no identity to prove: a connection shows only
// that it speaks the protocol, with its first valid frame, and is a
// stranger. A remote IP address is never taken as proof (127.0.0.1 is
// every process on the host).
//
// The rules, for Limits l:
//
//  1. An unproven connection is never refused. When its IP already has
//     l.MaxPerIP unproven connections, the oldest of them is closed to
//     make room; otherwise, when l.MaxUnproven connections are
//     unproven, the oldest unproven one of all is. Connections that
//     stall before or in their handshake are closed by the server's
//     handshake deadline, or sooner by newer ones: they cannot keep a
//     member out, and an IP at its l.MaxPerIP pushes out only its own.
//  2. A member is kept while fewer than l.MaxConns connections are proven.
//  3. A stranger is kept while fewer than l.MaxConns-l.Reserved strangers,
//     fewer than l.MaxPerIP strangers from its IP, and fewer than
//     l.MaxConns proven connections are held.
//  4. A connection pushed out (1) or refused at its proof (2, 3) counts
//     no more: its server closes it.
//
// So a server holds at most l.MaxConns+l.MaxUnproven connections,
// strangers never hold the l.Reserved slots that only members may take,
// and a member is refused only when members hold them all.
//
// What the rules cannot do: a flood that opens l.MaxUnproven new
// connections (l.MaxPerIP from the member's own IP) while one member's
// handshake is under way pushes it out, and the member redials; and
// without TLS every connection is a stranger, so whoever can send valid
// frames from a member's IP shares that IP's l.MaxPerIP slots with it.
package connslots

import (
	"container/list"
	"fmt"
	"io"
	"sync"
)

// Limits are a Table's caps; each must be at least 1, Reserved at most
// MaxConns (0 when no connection can prove to be a member).
type Limits struct {
	// MaxConns caps the proven connections, members' and strangers'.
	MaxConns int
	// Reserved is the part of MaxConns only members may hold.
	Reserved int
	// MaxUnproven caps the connections not yet proven.
	MaxUnproven int
	// MaxPerIP caps, per remote IP, the unproven connections and,
	// separately, the strangers' proven ones.
	MaxPerIP int
}

// Class is where a Slot stands.
type Class uint8

const (
	// Unproven is a connection that has not yet proved itself.
	Unproven Class = iota
	// Member is a connection proven to be a member's.
	Member
	// Stranger is a proven connection of anyone else.
	Stranger
	// Gone is a connection pushed out, refused or released: it counts
	// no more.
	Gone
)

// Slot is one connection's place in a Table.
type Slot struct {
	ip    string
	conn  io.Closer
	class Class         // guarded by Table.mu
	all   *list.Element // in Table.unproven while Unproven
	byIP  *list.Element // in Table.unprovenByIP[ip] while Unproven
}

// Table counts one server's inbound connections by the package's rules.
// It does no I/O: the connections it pushes out are handed back to be
// closed. Safe for concurrent use.
type Table struct {
	lim Limits

	mu            sync.Mutex
	unproven      list.List // of *Slot, oldest first
	unprovenByIP  map[string]*list.List
	members       int
	strangers     int
	strangersByIP map[string]int
}

// New returns an empty Table with limits l.
func New(l Limits) *Table {
	return &Table{lim: l, unprovenByIP: map[string]*list.List{}, strangersByIP: map[string]int{}}
}

// Admit files a new connection from ip, which c closes, as unproven (rule
// 1). When it had to make room, it returns the connection it pushed out,
// which the caller must close, and why; that connection's Slot is Gone.
func (t *Table) Admit(ip string, c io.Closer) (s *Slot, pushed io.Closer, why string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var victim *Slot
	byIP := t.unprovenByIP[ip]
	switch {
	case byIP != nil && byIP.Len() >= t.lim.MaxPerIP:
		victim = byIP.Front().Value.(*Slot)
		why = fmt.Sprintf("%d unproven connections from %s (MaxConnsPerIP)", byIP.Len(), ip)
	case t.unproven.Len() >= t.lim.MaxUnproven && t.unproven.Len() > 0:
		victim = t.unproven.Front().Value.(*Slot)
		why = fmt.Sprintf("%d unproven connections (MaxUnprovenConns)", t.unproven.Len())
	}
	if victim != nil {
		t.forgetLocked(victim)
		pushed = victim.conn
	}
	if byIP = t.unprovenByIP[ip]; byIP == nil {
		byIP = list.New()
		t.unprovenByIP[ip] = byIP
	}
	s = &Slot{ip: ip, conn: c}
	s.all = t.unproven.PushBack(s)
	s.byIP = byIP.PushBack(s)
	return s, pushed, why
}

// Prove files s, unproven until now, as a member's or a stranger's
// connection. It returns "" when s is kept, or why it is not (rule 2 or
// 3, or s was pushed out or released meanwhile): s is then Gone and the
// caller closes its connection.
func (t *Table) Prove(s *Slot, member bool) (why string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s.class != Unproven {
		return "pushed out by newer connections before it proved itself (MaxUnprovenConns, MaxConnsPerIP)"
	}
	proven := t.members + t.strangers
	switch {
	case proven >= t.lim.MaxConns:
		why = fmt.Sprintf("%d proven connections held (MaxConns)", proven)
	case member:
	case t.strangers >= t.lim.MaxConns-t.lim.Reserved:
		why = fmt.Sprintf("%d strangers' connections held (MaxConns %d less %d reserved for members)", t.strangers, t.lim.MaxConns, t.lim.Reserved)
	case t.strangersByIP[s.ip] >= t.lim.MaxPerIP:
		why = fmt.Sprintf("%d strangers' connections held from %s (MaxConnsPerIP)", t.strangersByIP[s.ip], s.ip)
	}
	t.forgetLocked(s)
	if why != "" {
		return why
	}
	if member {
		s.class = Member
		t.members++
	} else {
		s.class = Stranger
		t.strangers++
		t.strangersByIP[s.ip]++
	}
	return ""
}

// Release forgets s, whatever its class. It is idempotent; the caller
// closes the connection.
func (t *Table) Release(s *Slot) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.forgetLocked(s)
}

// Class reports where s stands now.
func (t *Table) Class(s *Slot) Class {
	t.mu.Lock()
	defer t.mu.Unlock()
	return s.class
}

// Counts reports how many connections are unproven, members' and
// strangers'.
func (t *Table) Counts() (unproven, members, strangers int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.unproven.Len(), t.members, t.strangers
}

// forgetLocked uncounts s and makes it Gone. t.mu must be held.
func (t *Table) forgetLocked(s *Slot) {
	switch s.class {
	case Unproven:
		t.unproven.Remove(s.all)
		byIP := t.unprovenByIP[s.ip]
		if byIP.Remove(s.byIP); byIP.Len() == 0 {
			delete(t.unprovenByIP, s.ip)
		}
		s.all, s.byIP = nil, nil
	case Member:
		t.members--
	case Stranger:
		t.strangers--
		if t.strangersByIP[s.ip]--; t.strangersByIP[s.ip] <= 0 {
			delete(t.strangersByIP, s.ip)
		}
	}
	s.class = Gone
}
