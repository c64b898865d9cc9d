package lockfsm

import (
	"fmt"
	"slices"
)

// Events: what an entry changed, key by key, for watchers. ApplyEvents
// reports them beside the results; they are a function of the state and
// the entry, like everything Apply does, so every replica reports the
// same events for the same entry, in the same order. They are not part
// of the state: a replica that wants a history of them keeps it.

// EventKind is what happened to a key's holder or waiter.
type EventKind uint8

// The event kinds.
const (
	// EventGranted: the attempt became a holder, at once or by hand-off.
	EventGranted EventKind = iota + 1
	// EventReleased: a holder gave the key up (Release, a Cancel of a
	// holder, or its session closed).
	EventReleased
	// EventExpired: a holder's session expired or its maximum hold ran
	// out (ExpireSession, ExpireHold): the cluster took the key back.
	EventExpired
	// EventQueued: the attempt joined the key's queue.
	EventQueued
	// EventCancelled: a waiter left the queue without a grant (Cancel, a
	// group withdrawn with it, or its session ended).
	EventCancelled
	// EventValue: a holder replaced its value (SetValue).
	EventValue
)

// String returns the kind's name.
func (k EventKind) String() string {
	switch k {
	case EventGranted:
		return "granted"
	case EventReleased:
		return "released"
	case EventExpired:
		return "expired"
	case EventQueued:
		return "queued"
	case EventCancelled:
		return "cancelled"
	case EventValue:
		return "value"
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// Event is one change to a key. Session and Req name the attempt; Owner
// and Label are its session's; Token is its grant's (0 for a waiter's
// events); Value is its value after the event (Granted, Queued, Value),
// and must not be changed.
type Event struct {
	Kind    EventKind
	Key     string
	Session uint64
	Req     uint64
	Token   uint64
	Owner   string
	Label   uint64
	Lock    Kind   // the attempt's kind
	Permits uint32 // a semaphore attempt's permits; 1 for every other
	Value   []byte
	// Position is a Queued attempt's place in the key's queue (0 is its
	// head): the tail, but for a prioritized wait (Command.Priority).
	Position int
}

// ApplyEvents is Apply that also returns the events of the entry, in the
// order the changes were made: a release before the grant it hands the
// key on to, a group's grants together.
func (s *State) ApplyEvents(index uint64, cmds []Command) (results []Result, grants []Grant, events []Event) {
	events = []Event{}
	results, grants = s.apply(index, cmds, &events)
	return results, grants, events
}

// event records an event of the attempt (sess, req) on key, when the
// entry's events are asked for.
func (a *applier) event(kind EventKind, key string, sess *session, req uint64, at *attempt) {
	if a.events == nil {
		return
	}
	e := Event{Kind: kind, Key: key, Session: sess.id, Req: req, Owner: sess.owner, Label: sess.label, Lock: at.kind, Permits: at.permits}
	if at.state == ReqHeld || kind == EventReleased || kind == EventExpired {
		e.Token = at.token
	}
	if kind == EventGranted || kind == EventQueued || kind == EventValue {
		e.Value = a.s.values[ref{sess.id, req}]
	}
	if kind == EventQueued {
		e.Position = slices.Index(a.s.keys[key].waiters(), ref{sess.id, req})
	}
	*a.events = append(*a.events, e)
}
