package peer

import (
	"time"

	"github.com/lockmesh/lockmesh/internal/replicas"
)

// A shard whose replica on this peer knows no leader for longer than an
// election takes has lost its quorum, or cannot reach it: locks on it
// wait. dragonboat logs that below what operators watch, so the peer
// says it: a warning once per outage, and an info line when the shard has
// a leader again, with how long it had none.

// leaderless follows the shards of this peer's replicas that know no
// leader. It is pure: its caller feeds it what it sees, and logs what it
// returns.
type leaderless struct {
	after  time.Duration        // how long without a leader is worth a warning
	since  map[uint64]time.Time // shard -> when it was first seen without a leader
	warned map[uint64]bool
}

// outage is a change worth a log line: a shard without a leader for long
// (Recovered false), or back with one after a warning.
type outage struct {
	Shard     uint64
	For       time.Duration
	Recovered bool
}

func newLeaderless(after time.Duration) *leaderless {
	return &leaderless{after: after, since: map[uint64]time.Time{}, warned: map[uint64]bool{}}
}

// observe records, at now, which of the shards listed know a leader
// (shard -> known), and returns what deserves a log line. A shard not
// listed any more (its replica moved away) is forgotten quietly.
func (l *leaderless) observe(now time.Time, known map[uint64]bool) []outage {
	var out []outage
	for shard, since := range l.since {
		k, listed := known[shard]
		switch {
		case !listed:
			delete(l.since, shard)
			delete(l.warned, shard)
		case k:
			if l.warned[shard] {
				out = append(out, outage{Shard: shard, For: now.Sub(since), Recovered: true})
			}
			delete(l.since, shard)
			delete(l.warned, shard)
		case !l.warned[shard] && now.Sub(since) >= l.after:
			l.warned[shard] = true
			out = append(out, outage{Shard: shard, For: now.Sub(since)})
		}
	}
	for shard, k := range known {
		if _, seen := l.since[shard]; !k && !seen {
			l.since[shard] = now
		}
	}
	return out
}

// quorumLoop logs the outages of this peer's lock replicas' shards, every
// second, until the peer stops.
func (n *Peer) quorumLoop() {
	l := newLeaderless(max(3*replicas.ElectionRTT*n.cfg.RTT, 5*time.Second)) // three elections, at least 5 s
	n.every(time.Second, func() {
		known := map[uint64]bool{}
		for _, ls := range n.LocalShards() {
			known[ls.Shard] = ls.LeaderKnown
		}
		for _, o := range l.observe(time.Now(), known) {
			if o.Recovered {
				n.log.Info("shard has a leader again", "shard", o.Shard, "without_leader", o.For.Round(time.Millisecond))
			} else {
				n.log.Warn("shard has no leader: its locks wait until a quorum of its replicas is back",
					"shard", o.Shard, "without_leader", o.For.Round(time.Millisecond))
			}
		}
	})
}
