package mesh

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/lni/dragonboat/v4/config"
	"github.com/lockmesh/lockmesh/internal/level"
	"github.com/lockmesh/lockmesh/internal/throttle"
)

// Join retry backoff bounds.
const (
	joinBackoffMin = 100 * time.Millisecond
	joinBackoffMax = 5 * time.Second
)

// Overrides of memberlist.DefaultLocalConfig for Config.Local.
const (
	localRetransmitMult   = 4
	localPushPullInterval = 2 * time.Second
)

// msgLeaveIntent prefixes the user message a peer sends to every member
// just before it leaves, followed by its name. memberlist reports left and
// dead peers alike through NotifyLeave without saying which (Node.State is
// not maintained in v0.7.0), so the intent is how peers tell them apart.
const msgLeaveIntent byte = 1

// Mesh is this peer's membership in the gossip mesh. Its methods are safe
// for concurrent use.
type Mesh struct {
	cfg  Config
	log  *slog.Logger
	list *memberlist.Memberlist
	// addr is the gossip address, read once at Create: memberlist rewrites
	// its local node without a lock on every UpdateNode.
	addr string
	// events is nil when Config.OnEvent is nil.
	events *eventQueue

	metaMu    sync.Mutex
	meta      Meta
	metaBytes []byte

	// viewMu guards the members whose metadata decodes and that are not
	// dead or left, as memberlist's event callbacks report them, and who
	// holds each NodeHostID (see identity.go). The registry resolves from
	// it.
	viewMu   sync.RWMutex
	view     map[string]Member // admitted members, by name
	byHostID map[string]string // NodeHostID -> its holder's name
	// refused are the live members refused for gossiping a NodeHostID
	// another member holds; reserved, the NodeHostIDs of departed holders
	// still reserved for them, with the timer that ends the reservation.
	refused    map[string]refusal
	reserved   map[string]*reservation
	claimSeq   uint64
	viewClosed bool
	leaving    map[string]struct{} // members (in view) that announced Leave

	// closing is set when Close begins (see slogWriter).
	closing atomic.Bool

	// closeMu orders Join's WaitGroup.Add before Close's Wait.
	closeMu sync.RWMutex
	closed  bool
	joins   sync.WaitGroup

	// joinErr is why the newest join attempt reached nobody; nil after a
	// join succeeded. keyWarned remembers the addresses already reported
	// as having another SecretKey.
	joinErr   atomic.Pointer[error]
	keyWarned sync.Map

	// level is the cluster's feature level once known (SetLevel), 0
	// before. refusals rate-limits the warning for refused peers, which
	// memberlist reports on every alive message they send.
	level    atomic.Uint32
	refusals throttle.Warner
	// conflicts rate-limits the warning for members refused by a
	// NodeHostID conflict.
	conflicts throttle.Warner
}

// Create validates cfg and starts the local peer: it binds the gossip
// address and becomes a mesh of one. Call [Mesh.Join] to contact others and
// [Mesh.Close] to stop. The first [EventJoin] (for this peer itself) may be
// delivered before Create returns.
func Create(cfg Config) (*Mesh, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.BindAddr == "" {
		cfg.BindAddr = DefaultBindAddr
	}
	if cfg.BroadcastTimeout == 0 {
		cfg.BroadcastTimeout = DefaultBroadcastTimeout
	}
	if cfg.MaxMembers == 0 {
		cfg.MaxMembers = DefaultMaxMembers
	}
	if cfg.ReclaimAfter == 0 {
		cfg.ReclaimAfter = DefaultReclaimAfter
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	metaBytes, err := EncodeMeta(cfg.Meta)
	if err != nil {
		return nil, fmt.Errorf("mesh: %w", err) // unreachable: Validate checked it
	}
	m := &Mesh{
		cfg:       cfg,
		log:       logger,
		meta:      cfg.Meta,
		metaBytes: metaBytes,
		view:      make(map[string]Member),
		byHostID:  make(map[string]string),
		refused:   make(map[string]refusal),
		reserved:  make(map[string]*reservation),
		leaving:   make(map[string]struct{}),
	}
	m.refusals.Every = 10 * time.Second
	m.conflicts.Every = 10 * time.Second
	if cfg.OnEvent != nil {
		m.events = newEventQueue(cfg.OnEvent, logger)
	}

	mc := memberlist.DefaultLANConfig()
	if cfg.Local {
		mc = memberlist.DefaultLocalConfig()
		// DefaultLocalConfig retransmits each broadcast only twice, so in a
		// mesh of five a metadata update regularly misses a peer until the
		// next push-pull, 15 s later. Loopback bandwidth is free: use the
		// LAN retransmit count and a short push-pull as the safety net.
		mc.RetransmitMult = localRetransmitMult
		mc.PushPullInterval = localPushPullInterval
	}
	mc.Name = cfg.Name
	host, port, _ := splitHostPort(cfg.BindAddr) // validated
	if host == "" {
		host = "0.0.0.0"
	}
	mc.BindAddr, mc.BindPort = host, port
	mc.AdvertiseAddr, mc.AdvertisePort = "", port
	if cfg.AdvertiseAddr != "" {
		mc.AdvertiseAddr, mc.AdvertisePort, _ = splitHostPort(cfg.AdvertiseAddr) // validated
	}
	if len(cfg.SecretKey) > 0 {
		mc.SecretKey = slices.Clone(cfg.SecretKey)
		mc.GossipVerifyIncoming = true
		mc.GossipVerifyOutgoing = true
	}
	mc.Delegate = delegate{m}
	mc.Events = eventDelegate{m}
	mc.Alive = admitDelegate{m}
	mc.Merge = admitDelegate{m}
	mc.LogOutput = nil
	mc.Logger = log.New(slogWriter{log: logger, closing: &m.closing, fallbacks: &probeFallbacks{}}, "", 0)

	inner := cfg.Transport
	if inner == nil {
		nt, err := listenGossip(host, port, mc.Logger)
		if err != nil {
			if m.events != nil {
				m.events.close()
			}
			return nil, fmt.Errorf("mesh: start gossip on %s: %w", cfg.BindAddr, err)
		}
		if port == 0 && cfg.AdvertiseAddr == "" {
			// What memberlist does for the transport it makes itself.
			mc.BindPort = nt.GetAutoBindPort()
			mc.AdvertisePort = mc.BindPort
		}
		inner = nt
	}
	guard := newGuardTransport(inner, newGuardLimits(cfg.MaxMembers), len(cfg.SecretKey) > 0, logger)
	mc.Transport = guard

	list, err := memberlist.Create(mc)
	if err != nil {
		if m.events != nil {
			m.events.close()
		}
		// memberlist shuts a transport down only on some of its failure
		// paths; the guard's Shutdown is idempotent.
		_ = guard.Shutdown()
		return nil, fmt.Errorf("mesh: start gossip on %s: %w", cfg.BindAddr, err)
	}
	m.list = list
	m.addr = list.LocalNode().Address()
	return m, nil
}

// Join contacts the given gossip addresses (host:port) and merges their
// view of the mesh into this peer's. It retries the whole list with
// exponential backoff until at least one address answers, and returns how
// many did. It returns (0, nil) for an empty list (the first peer of a
// mesh has nobody to join). When ctx ends first, the error wraps ctx.Err()
// and says why the last attempt failed; an attempt already in flight keeps
// running in the background (bounded by memberlist's TCP timeout) and may
// still join. Peers with a different or missing SecretKey never let this
// one in: the first attempt that meets one logs a warning naming it, and
// the error says "gossip key mismatch with <addr>".
func (m *Mesh) Join(ctx context.Context, addrs []string) (int, error) {
	if len(addrs) == 0 {
		return 0, nil
	}
	backoff := joinBackoffMin
	for attempt := 1; ; attempt++ {
		n, err := m.joinOnce(ctx, addrs)
		if n > 0 {
			m.joinErr.Store(nil)
			if err != nil {
				m.log.Debug("mesh: joined, some addresses did not answer", "joined", n, "err", m.describeJoinErr(err))
			}
			return n, nil
		}
		if errors.Is(err, ErrClosed) {
			return 0, err
		}
		if err == nil {
			err = errors.New("no address answered")
		}
		if ctx.Err() == nil || !errors.Is(err, ctx.Err()) {
			err = m.describeJoinErr(err)
			m.joinErr.Store(&err)
		}
		if ctx.Err() != nil {
			return 0, fmt.Errorf("mesh: join %v: %w (after %d attempts; last: %v)", addrs, ctx.Err(), attempt, err)
		}
		m.log.Debug("mesh: join attempt failed, retrying", "addrs", addrs, "attempt", attempt, "backoff", backoff, "err", err)
		// Full jitter keeps peers started together from retrying in step.
		wait := backoff/2 + rand.N(backoff/2+1)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return 0, fmt.Errorf("mesh: join %v: %w (after %d attempts; last: %v)", addrs, ctx.Err(), attempt, err)
		case <-t.C:
		}
		backoff = min(2*backoff, joinBackoffMax)
	}
}

// JoinError is why the newest join attempt reached no peer ("gossip key
// mismatch with <addr>: ..." when a peer has another SecretKey), or nil
// once a join succeeded or before any attempt failed.
func (m *Mesh) JoinError() error {
	if e := m.joinErr.Load(); e != nil {
		return *e
	}
	return nil
}

// keyMismatchTexts are what memberlist says, on either side, when two
// peers do not share a SecretKey.
var keyMismatchTexts = []string{
	"no installed keys could decrypt the message",
	"remote state is encrypted and encryption is not configured",
	"encryption is configured but remote state is not encrypted",
}

func isKeyMismatch(text string) bool {
	text = strings.ToLower(text)
	for _, k := range keyMismatchTexts {
		if strings.Contains(text, k) {
			return true
		}
	}
	return false
}

// describeJoinErr turns memberlist's multi-line error for a failed Join
// ("2 errors occurred:\n\t* failed to join a: ...") into one line, one
// address per part, naming a gossip key mismatch as such and logging it
// once per address as soon as it is seen.
func (m *Mesh) describeJoinErr(err error) error {
	var parts []error
	if multi, ok := err.(interface{ WrappedErrors() []error }); ok {
		parts = multi.WrappedErrors()
	} else {
		parts = []error{err}
	}
	var texts []string
	for _, p := range parts {
		text := p.Error()
		if isKeyMismatch(text) {
			addr, detail, ok := strings.Cut(strings.TrimPrefix(text, "failed to join "), ": ")
			if !ok {
				addr, detail = "a peer", text
			}
			text = fmt.Sprintf("gossip key mismatch with %s: %s (the two peers' SecretKeys differ, or one has none)", addr, detail)
			if _, seen := m.keyWarned.LoadOrStore(addr, true); !seen {
				m.log.Warn("mesh: gossip key mismatch: this peer's SecretKey differs from the one at the address, or one of them has none; it cannot join through it", "addr", addr, "detail", detail)
			}
		}
		texts = append(texts, text)
	}
	return errors.New(strings.Join(texts, "; "))
}

// joinOnce runs one memberlist.Join, which cannot be cancelled, on a
// goroutine Close waits for, so that Join itself honours ctx.
func (m *Mesh) joinOnce(ctx context.Context, addrs []string) (int, error) {
	m.closeMu.RLock()
	if m.closed {
		m.closeMu.RUnlock()
		return 0, ErrClosed
	}
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	m.joins.Add(1)
	m.closeMu.RUnlock()
	go func() {
		defer m.joins.Done()
		n, err := m.list.Join(addrs)
		done <- result{n, err}
	}()
	select {
	case r := <-done:
		return r.n, r.err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// LocalName returns this peer's name.
func (m *Mesh) LocalName() string { return m.cfg.Name }

// Addr returns the gossip host:port other peers reach this one at (the
// advertised address, with the real port when BindAddr asked for port 0).
func (m *Mesh) Addr() string { return m.addr }

// LocalMeta returns the metadata this peer currently gossips.
func (m *Mesh) LocalMeta() Meta {
	m.metaMu.Lock()
	defer m.metaMu.Unlock()
	return m.meta
}

// Members returns the live members (not declared dead or left) whose
// metadata decodes, this peer included until it leaves, sorted by Name.
// Members refused for gossiping a NodeHostID another member holds are
// not among them (see [Mesh.Conflicts]).
// It is served from the view the event callbacks maintain, never from
// memberlist's node structs, which memberlist mutates without a lock.
// Member.State is always StateAlive: memberlist v0.7.0 does not expose
// suspicion.
func (m *Mesh) Members() []Member {
	m.viewMu.RLock()
	out := make([]Member, 0, len(m.view))
	for _, mem := range m.view {
		out = append(out, mem)
	}
	m.viewMu.RUnlock()
	slices.SortFunc(out, func(a, b Member) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// Member returns the live member called name, if there is one, its
// metadata decodes and it is not refused (see [Mesh.Conflicts]).
func (m *Mesh) Member(name string) (Member, bool) {
	m.viewMu.RLock()
	defer m.viewMu.RUnlock()
	mem, ok := m.view[name]
	return mem, ok
}

// SetMeta replaces the metadata this peer gossips and broadcasts it. It
// returns once the update has been gossiped, or with an error after
// Config.BroadcastTimeout; the new metadata is set locally either way and
// still spreads through periodic state exchange. It fails with
// [ErrMetaTooLarge] when meta does not fit and [ErrClosed] after Close.
func (m *Mesh) SetMeta(meta Meta) error {
	b, err := EncodeMeta(meta)
	if err != nil {
		return fmt.Errorf("mesh: set metadata: %w", err)
	}
	if m.isClosed() {
		return ErrClosed
	}
	m.metaMu.Lock()
	m.meta, m.metaBytes = meta, b
	m.metaMu.Unlock()
	if err := m.list.UpdateNode(m.cfg.BroadcastTimeout); err != nil {
		return fmt.Errorf("mesh: broadcast metadata (set locally, will spread by push-pull): %w", err)
	}
	return nil
}

// Leave tells the other peers this one is leaving, waiting up to timeout
// for the message to go out, so they report it with [StateLeft] rather
// than [StateDead] (a peer that misses the best-effort notice reports
// StateDead). The peer keeps running until Close; call Close afterwards.
func (m *Mesh) Leave(timeout time.Duration) error {
	if m.isClosed() {
		return ErrClosed
	}
	m.noteLeaving(m.cfg.Name)
	intent := append([]byte{msgLeaveIntent}, m.cfg.Name...)
	for _, mem := range m.Members() {
		if mem.Name == m.cfg.Name {
			continue
		}
		if err := m.sendLeaveNotice(mem, intent); err != nil {
			m.log.Debug("mesh: leave notice not sent", "member", mem.Name, "err", err)
		}
	}
	if err := m.list.Leave(timeout); err != nil {
		return fmt.Errorf("mesh: leave: %w", err)
	}
	return nil
}

// sendLeaveNotice sends intent to mem over a stream, falling back to a
// packet. A stream's user message is handed to NotifyMsg as it is read,
// while a packet's waits in memberlist's low-priority queue, behind the
// high-priority dead message Leave gossips next: under load the receiver
// then saw the member dead before it read the notice, and reported
// StateDead for a member that left (TestMeshMembership under -race).
func (m *Mesh) sendLeaveNotice(mem Member, intent []byte) error {
	host, portStr, err := net.SplitHostPort(mem.Addr)
	ip := net.ParseIP(host)
	port, perr := strconv.ParseUint(portStr, 10, 16)
	if err == nil && ip != nil && perr == nil {
		if err = m.list.SendReliable(&memberlist.Node{Name: mem.Name, Addr: ip, Port: uint16(port)}, intent); err == nil {
			return nil
		}
	}
	return m.list.SendToAddress(memberlist.Address{Addr: mem.Addr, Name: mem.Name}, intent)
}

// Close stops gossip without telling the others (call Leave first for a
// graceful exit): it closes the gossip sockets, waits for background join
// attempts and for an OnEvent call in progress, and drops undelivered
// events. It is idempotent; later calls return nil.
func (m *Mesh) Close() error {
	m.closeMu.Lock()
	if m.closed {
		m.closeMu.Unlock()
		return nil
	}
	m.closed = true
	m.closeMu.Unlock()

	m.closing.Store(true)
	err := m.list.Shutdown()
	m.joins.Wait()
	m.closeView()
	if m.events != nil {
		m.events.close()
	}
	if err != nil {
		return fmt.Errorf("mesh: shutdown: %w", err)
	}
	return nil
}

// listenGossip binds memberlist's UDP and TCP transport on host:port. A
// port of 0 is retried a few times, as memberlist does: the system picks
// the TCP port, which may be taken for UDP.
func listenGossip(host string, port int, logger *log.Logger) (*memberlist.NetTransport, error) {
	nc := &memberlist.NetTransportConfig{BindAddrs: []string{host}, BindPort: port, Logger: logger}
	attempts := 1
	if port == 0 {
		attempts = 10
	}
	var err error
	for range attempts {
		var nt *memberlist.NetTransport
		if nt, err = memberlist.NewNetTransport(nc); err == nil {
			return nt, nil
		}
		if !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	return nil, err
}

func (m *Mesh) isClosed() bool {
	m.closeMu.RLock()
	defer m.closeMu.RUnlock()
	return m.closed
}

// NodeRegistryFactory returns a factory for dragonboat v4's
// NodeHostConfig.Expert.NodeRegistryFactory. A NodeHost with a registry
// factory addresses replicas by NodeHostID (as with dragonboat's own gossip
// registry, NodeHostConfig.DefaultNodeRegistryEnabled, which must then stay
// false: NewNodeHost refuses both): the targets passed to StartReplica and
// RequestAddReplica are NodeHostIDs, checked by dragonboat's NodeHostID
// validator, and the registry resolves each to the RaftAddr gossiped by the
// live member that holds that NodeHostID: the first seen gossiping it,
// never another member gossiping it while the holder lives (see
// [Mesh.Conflicts]). Resolution follows the gossip view as it changes;
// before a peer is seen, Resolve fails with [ErrUnknownTarget] and
// dragonboat retries. Closing the registry does not close the Mesh.
func (m *Mesh) NodeRegistryFactory() config.NodeRegistryFactory {
	return registryFactory{m}
}

// lookupRaftAddr resolves a NodeHostID through the gossip view.
func (m *Mesh) lookupRaftAddr(nodeHostID string) (string, bool) {
	m.viewMu.RLock()
	defer m.viewMu.RUnlock()
	name, ok := m.byHostID[nodeHostID]
	if !ok {
		return "", false
	}
	if m.cfg.Bound != nil {
		if owner, bound := m.cfg.Bound(nodeHostID); bound && owner != name {
			return "", false
		}
	}
	addr := m.view[name].Meta.RaftAddr
	return addr, addr != ""
}

// observe applies one memberlist notification to the view and queues the
// matching event. It runs on memberlist's goroutines, often under
// memberlist's locks, so it must not block or call back into memberlist.
func (m *Mesh) observe(n *memberlist.Node, gone bool) {
	mem := Member{Name: n.Name, Addr: n.Address(), State: StateAlive}
	var decodeErr error
	if !gone {
		mem.Meta, decodeErr = DecodeMeta(n.Meta)
	}

	m.viewMu.Lock()
	defer m.viewMu.Unlock()
	if gone {
		mem.State = StateDead
		if _, ok := m.leaving[n.Name]; ok {
			mem.State = StateLeft
		}
	}
	if gone || !m.inView(n.Name) {
		// A member that comes back after leaving must announce again.
		delete(m.leaving, n.Name)
	}
	old, had := m.view[n.Name]
	if gone || decodeErr != nil {
		if decodeErr != nil {
			m.log.Warn("mesh: ignoring member with undecodable metadata",
				"member", n.Name, "addr", mem.Addr, "err", decodeErr)
		}
		delete(m.refused, n.Name)
		if !had {
			return
		}
		m.depart(old)
		mem.Meta = old.Meta
		m.push(Event{Kind: EventLeave, Member: mem})
		return
	}
	if holder, ok := m.claim(mem); !ok {
		if had {
			m.drop(old)
		}
		m.refuse(mem, holder)
		return
	}
	m.admitMember(mem)
	switch {
	case !had:
		m.push(Event{Kind: EventJoin, Member: mem})
	case old.Meta != mem.Meta || old.Addr != mem.Addr:
		m.push(Event{Kind: EventUpdate, Member: mem})
	}
	if had && old.Meta.NodeHostID != mem.Meta.NodeHostID {
		m.release(old.Meta.NodeHostID, n.Name)
	}
}

// push queues ev for OnEvent. It is called under viewMu, so events come
// out in the order the view changed.
func (m *Mesh) push(ev Event) {
	if m.events != nil {
		m.events.push(ev)
	}
}

func (m *Mesh) inView(name string) bool {
	_, ok := m.view[name]
	return ok
}

// noteLeaving records a leave notice from a member in the view; notices
// about unknown names are dropped so the set stays bounded by the view.
func (m *Mesh) noteLeaving(name string) {
	m.viewMu.Lock()
	defer m.viewMu.Unlock()
	if m.inView(name) {
		m.leaving[name] = struct{}{}
	}
}

// delegate serves memberlist's Delegate calls; only NodeMeta does work.
type delegate struct{ m *Mesh }

// NodeMeta returns the encoded local metadata. EncodeMeta guarantees it
// fits in MetaMaxSize, which is the limit memberlist passes.
func (d delegate) NodeMeta(limit int) []byte {
	d.m.metaMu.Lock()
	defer d.m.metaMu.Unlock()
	if len(d.m.metaBytes) > limit {
		d.m.log.Error("mesh: metadata exceeds memberlist limit, gossiping none",
			"size", len(d.m.metaBytes), "limit", limit)
		return nil
	}
	return slices.Clone(d.m.metaBytes)
}

// NotifyMsg receives leave notices (see msgLeaveIntent) and ignores any
// other message. It runs on memberlist's packet handler and only takes
// viewMu briefly.
func (d delegate) NotifyMsg(msg []byte) {
	if len(msg) < 2 || len(msg) > 1+MaxMetaSize || msg[0] != msgLeaveIntent {
		return
	}
	d.m.noteLeaving(string(msg[1:]))
}

func (delegate) GetBroadcasts(int, int) [][]byte        { return nil }
func (delegate) LocalState(bool) []byte                 { return nil }
func (delegate) MergeRemoteState(buf []byte, join bool) {}

// eventDelegate feeds memberlist's notifications to Mesh.observe.
type eventDelegate struct{ m *Mesh }

func (e eventDelegate) NotifyJoin(n *memberlist.Node)   { e.m.observe(n, false) }
func (e eventDelegate) NotifyLeave(n *memberlist.Node)  { e.m.observe(n, true) }
func (e eventDelegate) NotifyUpdate(n *memberlist.Node) { e.m.observe(n, false) }

// SetLevel tells the mesh the cluster's feature level once it is known (a
// node learns it from the cluster layout). From then on a peer is admitted
// only if it speaks that level; before, only if its versions overlap this
// peer's. Members already in the view that do not speak it leave the view
// (an EventLeave each), so nothing resolves to them any more; memberlist
// refuses their later alive messages.
func (m *Mesh) SetLevel(l level.Level) {
	if uint32(l) == m.level.Swap(uint32(l)) {
		return
	}
	m.viewMu.Lock()
	defer m.viewMu.Unlock()
	for name, mem := range m.view {
		lo, hi := mem.Meta.Levels()
		if name == m.cfg.Name || (lo <= l && l <= hi) {
			continue
		}
		m.log.Warn("mesh: dropping a member that does not speak the cluster's level", "member", name,
			"speaks", fmt.Sprintf("%d to %d", lo, hi), "level", l)
		m.depart(mem)
		mem.State = StateLeft
		m.push(Event{Kind: EventLeave, Member: mem})
	}
	for name, r := range m.refused {
		if lo, hi := r.mem.Meta.Levels(); l < lo || l > hi {
			delete(m.refused, name)
		}
	}
}

// admit decides whether the member name with metadata raw may join the
// view: its protocol versions must include the cluster's level, or, before
// the level is known, overlap this peer's own.
func (m *Mesh) admit(name string, raw []byte) error {
	if name == m.cfg.Name {
		return nil
	}
	meta, err := DecodeMeta(raw)
	if err != nil {
		return nil // observe ignores it, with its own warning
	}
	lo, hi := meta.Levels()
	var reason string
	if lvl := level.Level(m.level.Load()); lvl != 0 {
		if lvl < lo || lvl > hi {
			reason = fmt.Sprintf("peer %s speaks protocol versions %d to %d, but the cluster runs at level %d: upgrade it (see docs/UPGRADING.md)", name, lo, hi, lvl)
		}
	} else {
		m.metaMu.Lock()
		ownLo, ownHi := m.meta.Levels()
		m.metaMu.Unlock()
		if hi < ownLo || lo > ownHi {
			reason = fmt.Sprintf("peer %s speaks protocol versions %d to %d, this peer %d to %d: none in common; upgrade the older one (see docs/UPGRADING.md)", name, lo, hi, ownLo, ownHi)
		}
	}
	if reason == "" {
		return nil
	}
	m.refusals.Warn(m.log, "mesh: refusing peer: "+reason, "member", name)
	return fmt.Errorf("%w: %s", ErrIncompatible, reason)
}

// admitDelegate refuses peers that cannot work with this one: memberlist
// drops alive messages (gossip) and fails joins (push-pull) it refuses.
type admitDelegate struct{ m *Mesh }

// NotifyAlive runs on memberlist's packet and push-pull handlers.
func (a admitDelegate) NotifyAlive(n *memberlist.Node) error { return a.m.admit(n.Name, n.Meta) }

// NotifyMerge runs when this peer joins others or others join it; one
// refused peer fails the whole join, with the reason in Join's error.
func (a admitDelegate) NotifyMerge(peers []*memberlist.Node) error {
	for _, n := range peers {
		if err := a.m.admit(n.Name, n.Meta); err != nil {
			return err
		}
	}
	return nil
}

var (
	_ memberlist.Delegate      = delegate{}
	_ memberlist.EventDelegate = eventDelegate{}
	_ memberlist.AliveDelegate = admitDelegate{}
	_ memberlist.MergeDelegate = admitDelegate{}
)
