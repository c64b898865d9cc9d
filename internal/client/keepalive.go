package client

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/lockmesh/lockmesh/internal/lockerr"
)

// RunKeepAlives is the keepalive loop, the one place this peer's
// keepalives are sent from; it returns when ctx ends. A round starts every
// quarter of the shortest TTL among the live sessions (and of
// Config.SessionTTL), counted on Config.RoundClock from the start of the
// last round, so a slow round does not push the next one back; a session
// opened with a shorter TTL moves the next round up. Each round makes one
// Config.KeepAlive call per shard, carrying every live session this peer
// has there, bounded by the interval. An acknowledgement extends each
// session from the time the keepalive was sent (Session.Extend); a session
// the leader reports expired is lost.
func (c *Client) RunKeepAlives(ctx context.Context) {
	clock := c.cfg.RoundClock
	wake := make(chan struct{}, 1)
	t := clock.AfterFunc(c.cfg.SessionTTL/4, func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	})
	defer t.Stop()
	last := clock.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.kick:
			t.Reset(max(0, last.Add(c.interval(c.live())).Sub(clock.Now())))
			continue
		case <-wake:
		}
		last = clock.Now()
		ss := c.live()
		interval := c.interval(ss)
		c.round(ctx, ss, interval)
		t.Reset(max(0, last.Add(interval).Sub(clock.Now())))
	}
}

// interval is a quarter of the shortest TTL of ss, and of
// Config.SessionTTL.
func (c *Client) interval(ss []*ShardSession) time.Duration {
	interval := c.cfg.SessionTTL / 4
	for _, s := range ss {
		interval = min(interval, s.session.ttl/4)
	}
	return interval
}

// kickKeepAlives tells the keepalive loop a session opened.
func (c *Client) kickKeepAlives() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// round sends one keepalive per shard for ss, the shards' calls
// concurrently, and returns when every call has been answered or has
// failed (each is bounded by interval).
//
// It first checks every session's deadline: a deadline timer is a Go
// timer, which after the machine was suspended fires late, while the
// lease clock (which counts suspended time) already says the lease is
// over. So a holder blocked on Done learns of it within a round of waking.
//
// A maximum hold's deadline is checked the same way, but only after a
// suspension (the lease clock moved on further than Go's since the last
// round): there may be many holds, and otherwise their timers are on time.
func (c *Client) round(ctx context.Context, ss []*ShardSession, interval time.Duration) {
	suspended := c.suspendedSinceLastRound()
	byShard := map[uint64][]*ShardSession{}
	for _, s := range ss {
		if s.CheckDeadline(); s.isLost() {
			continue
		}
		if suspended {
			s.checkHolds()
		}
		byShard[s.shard] = append(byShard[s.shard], s)
	}
	var wg sync.WaitGroup
	for shard, ss := range byShard {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.keepAlive(ctx, shard, ss, interval)
		}()
	}
	wg.Wait()
}

// keepAlive sends the keepalive of ss, sessions on shard, and applies the
// answer: expired sessions are lost, the others extended from the send
// time. A failed call changes nothing; the deadlines run on.
func (c *Client) keepAlive(ctx context.Context, shard uint64, ss []*ShardSession, interval time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, interval)
	defer cancel()
	ids := make([]uint64, len(ss))
	for i, s := range ss {
		ids[i] = s.id
	}
	sent := c.now()
	expired, err := c.cfg.KeepAlive(ctx, shard, ids)
	if err != nil {
		c.cfg.Log.Debug("keepalive failed", "shard", shard, "err", err)
		return
	}
	gone := map[uint64]bool{}
	for _, id := range expired {
		gone[id] = true
	}
	for _, s := range ss {
		if gone[s.id] {
			s.Lose(lose(LossExpired, fmt.Errorf("%w: the leader of shard %d no longer counts session %d as live", lockerr.LeaseExpired, shard, s.id)))
		} else {
			s.Extend(sent)
		}
	}
}

// suspendedSinceLastRound reports whether the lease clock, which counts
// time the machine spends suspended, moved on by more than a lease margin
// further than Go's monotonic clock since the last round. Only the
// keepalive loop calls it.
func (c *Client) suspendedSinceLastRound() bool {
	lease, mono := c.now(), time.Now()
	last := c.lastRound
	c.lastRound = roundReadings{lease: lease, mono: mono}
	if last.mono.IsZero() {
		return false
	}
	return lease.Sub(last.lease)-mono.Sub(last.mono) > c.cfg.LeaseMargin
}

// roundReadings are the clocks' readings at the last keepalive round.
type roundReadings struct{ lease, mono time.Time }

// checkHolds ends the holds of s whose maximum has passed on the lease
// clock, as their timers would have had they counted a suspension.
func (s *ShardSession) checkHolds() {
	s.mu.Lock()
	var hs []*Held
	for _, list := range s.held {
		for _, h := range list {
			if !h.holdDeadline.IsZero() {
				hs = append(hs, h)
			}
		}
	}
	s.mu.Unlock()
	for _, h := range hs {
		h.checkLease()
	}
}
