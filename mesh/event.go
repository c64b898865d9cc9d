package mesh

import (
	"log/slog"
	"sync"
)

// State is a member's liveness as this peer sees it.
type State uint8

const (
	// StateAlive means the member answers probes.
	StateAlive State = iota
	// StateSuspect means a probe failed and the member may be dead; it is
	// still a member (and still resolvable) until declared dead. Reserved:
	// memberlist v0.7.0 does not expose suspicion, so Members reports
	// suspect peers as StateAlive.
	StateSuspect
	// StateDead means the member stopped answering and was declared dead
	// (or left without its leave notice reaching this peer).
	StateDead
	// StateLeft means the member left gracefully with [Mesh.Leave].
	StateLeft
)

// String returns "alive", "suspect", "dead" or "left".
func (s State) String() string {
	switch s {
	case StateAlive:
		return "alive"
	case StateSuspect:
		return "suspect"
	case StateDead:
		return "dead"
	case StateLeft:
		return "left"
	default:
		return "unknown"
	}
}

// Member is one peer of the mesh.
type Member struct {
	// Name is the peer's unique name ([Config.Name]).
	Name string
	// Addr is the peer's gossip host:port.
	Addr string
	// Meta is what the peer gossips about itself.
	Meta Meta
	// State is the peer's liveness.
	State State
}

// EventKind says what happened to a member.
type EventKind uint8

const (
	// EventJoin: the member joined (or its metadata became readable).
	EventJoin EventKind = iota + 1
	// EventLeave: the member left, was declared dead, or started gossiping
	// metadata this peer cannot decode. Member.State says which.
	EventLeave
	// EventUpdate: the member's metadata changed.
	EventUpdate
)

// String returns "join", "leave" or "update".
func (k EventKind) String() string {
	switch k {
	case EventJoin:
		return "join"
	case EventLeave:
		return "leave"
	case EventUpdate:
		return "update"
	default:
		return "unknown"
	}
}

// Event is a membership change delivered to [Config.OnEvent].
type Event struct {
	Kind   EventKind
	Member Member
}

// backlogWarnAt is the queue length at which a slow OnEvent is first
// logged; the threshold doubles after each warning.
const backlogWarnAt = 1024

// eventQueue hands events from memberlist's goroutines to one dispatcher
// goroutine. push never blocks; the queue grows instead, because blocking
// would stall memberlist's probes and make healthy peers look dead.
type eventQueue struct {
	fn  func(Event)
	log *slog.Logger

	mu      sync.Mutex
	pending []Event
	warnAt  int
	stopped bool

	wake chan struct{} // capacity 1: "pending may be non-empty"
	stop chan struct{}
	done chan struct{}
}

func newEventQueue(fn func(Event), log *slog.Logger) *eventQueue {
	q := &eventQueue{
		fn:     fn,
		log:    log,
		warnAt: backlogWarnAt,
		wake:   make(chan struct{}, 1),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	go q.run()
	return q
}

func (q *eventQueue) push(e Event) {
	q.mu.Lock()
	if q.stopped {
		q.mu.Unlock()
		return
	}
	q.pending = append(q.pending, e)
	n := len(q.pending)
	warn := n >= q.warnAt
	if warn {
		q.warnAt *= 2
	}
	q.mu.Unlock()
	if warn {
		q.log.Warn("mesh: OnEvent is slow, membership events are piling up", "queued", n)
	}
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *eventQueue) run() {
	defer close(q.done)
	for {
		select {
		case <-q.stop:
			return
		case <-q.wake:
		}
		for {
			q.mu.Lock()
			batch := q.pending
			q.pending = nil
			if len(batch) == 0 {
				q.warnAt = backlogWarnAt
			}
			q.mu.Unlock()
			if len(batch) == 0 {
				break
			}
			for _, e := range batch {
				select {
				case <-q.stop:
					return
				default:
				}
				q.fn(e)
			}
		}
	}
}

// close stops delivery and waits for an OnEvent call in progress.
func (q *eventQueue) close() {
	q.mu.Lock()
	q.stopped = true
	q.pending = nil
	q.mu.Unlock()
	close(q.stop)
	<-q.done
}
