package client

import "time"

// Margin is how much earlier than its TTL after the last acknowledged
// keepalive a holder gives its lease up: leaseMargin, and at least a tenth
// of the TTL, so that a long TTL keeps the same tolerance of clock-rate
// differences (docs/SAFETY.md) as the default one.
func Margin(ttl, leaseMargin time.Duration) time.Duration { return max(leaseMargin, ttl/10) }

// Lease is the holder's view of one replicated session's lease: valid
// until a deadline on the holder's clock (Config.Clock, which never runs
// slow: it counts the time the machine spent suspended), the send time of
// the last acknowledged keepalive plus the TTL minus the margin. The
// leader expires the session only after a full TTL without keepalives,
// counted from when it received them, which is never earlier than when
// they were sent; so the holder always gives up first (docs/SAFETY.md).
//
// A Lease is a value with no clock of its own: the caller passes the
// times, and serializes calls.
type Lease struct {
	ttl, margin time.Duration
	deadline    time.Time
}

// NewLease returns the lease of a session whose open was sent at sent and
// succeeded: valid until sent + ttl - margin.
func NewLease(ttl, margin time.Duration, sent time.Time) Lease {
	return Lease{ttl: ttl, margin: margin, deadline: sent.Add(ttl - margin)}
}

// Deadline is when the lease runs out.
func (l Lease) Deadline() time.Time { return l.deadline }

// Passed reports whether the lease has run out at now. From then on the
// holder must consider its locks lost.
func (l Lease) Passed(now time.Time) bool { return !now.Before(l.deadline) }

// Extend records that a keepalive sent at sent was acknowledged, the
// acknowledgement arriving at now. It moves the deadline to
// sent + TTL - margin, never back (an older keepalive's acknowledgement
// arriving late changes nothing). It reports false, and changes nothing,
// when the deadline has already passed at now: a lease is never revived,
// since the holder may have been told its lock is lost and the leader may
// be expiring the session; the caller loses it instead.
func (l *Lease) Extend(sent, now time.Time) bool {
	if l.Passed(now) {
		return false
	}
	if d := sent.Add(l.ttl - l.margin); d.After(l.deadline) {
		l.deadline = d
	}
	return true
}
