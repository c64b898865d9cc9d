// The page's views (the JSON's field names and the HTML page's data) and
// the text helpers that format durations and ids for them.

package statuspage

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The views give the JSON its field names (snake_case), so node's types
// stay free of tags and can change without breaking scripts that read the
// page; the HTML page renders the same views. Durations come twice: in
// milliseconds (µs precision, Millis) for programs and as a short human
// string (HumanDuration, AgeText) for people. Random 64-bit ids (cluster,
// session) are strings, as JavaScript's numbers cannot hold them exactly.

// errorBody is every JSON error's answer.
type errorBody struct {
	Error string `json:"error"`
}

// Status is /status.json: one peer's view of the mesh and the shards.
type Status struct {
	Peer    string `json:"peer"`
	Release string `json:"release"`
	// Cluster is the cluster id in hex (ClusterText), "" while unknown.
	Cluster string `json:"cluster"`
	Level   uint8  `json:"level"`
	Ready   bool   `json:"ready"`
	// PeersDown counts the peers the layout lists that gossip does not
	// see alive, and Leaderless the lock shards without a known leader:
	// the page's summary of an outage.
	PeersDown  int      `json:"peers_down"`
	Leaderless int      `json:"shards_without_leader"`
	Members    []Member `json:"members"`
	Shards     []Shard  `json:"shards"`
}

// Member is one peer of the mesh as Status lists it.
type Member struct {
	Name       string `json:"name"`
	Alive      bool   `json:"alive"`
	Level      uint8  `json:"level"`
	GossipAddr string `json:"gossip_addr"`
	RaftAddr   string `json:"raft_addr"`
	RPCAddr    string `json:"rpc_addr"`
	Cluster    string `json:"cluster"`
	ClientOnly bool   `json:"client_only"`
}

// Shard is one shard as Status lists it: its leader, replicas and counts
// (the counts mean something only when Counted).
type Shard struct {
	Shard    uint64    `json:"shard"`
	Leader   string    `json:"leader"`
	Replicas []Replica `json:"replicas"`
	Counted  bool      `json:"counted"`
	Sessions int       `json:"sessions"`
	Keys     int       `json:"keys"`
	Holders  int       `json:"holders"`
	Waiters  int       `json:"waiters"`
}

// Replica is one replica of a Shard and how far it has applied the log.
type Replica struct {
	Peer     string `json:"peer"`
	Replica  uint64 `json:"replica"`
	Leader   bool   `json:"leader"`
	Reported bool   `json:"reported"`
	Applied  uint64 `json:"applied"`
	Lag      uint64 `json:"lag"`
}

// Top is /top.json: the most contended keys, the longest holds and the
// shards that did not answer.
type Top struct {
	Contended    []Contended `json:"contended"`
	LongestHolds []LongHold  `json:"longest_holds"`
	Missing      []uint64    `json:"missing"`
}

// Contended is one of Top's most waited-for keys.
type Contended struct {
	Key          string  `json:"key"`
	Shard        uint64  `json:"shard"`
	Waiters      int     `json:"waiters"`
	OldestWaitMS float64 `json:"oldest_wait_ms"`
	OldestWait   string  `json:"oldest_wait"`
	Handoffs     uint64  `json:"handoffs"`
	TotalWaitMS  float64 `json:"total_wait_ms"`
	TotalWait    string  `json:"total_wait"`
	OvercountMS  float64 `json:"overcount_ms"`
	Overcount    string  `json:"overcount"`
	// Since is RFC 3339, "" when unknown.
	Since string `json:"since"`
}

// LongHold is one of Top's longest-held locks.
type LongHold struct {
	Key       string  `json:"key"`
	Shard     uint64  `json:"shard"`
	Peer      string  `json:"peer"`
	Session   string  `json:"session"`
	Token     uint64  `json:"token"`
	HeldForMS float64 `json:"held_for_ms"`
	// HeldFor starts with "≥" when AtLeast.
	HeldFor string `json:"held_for"`
	AtLeast bool   `json:"at_least"`
}

// Key is /key: a key's holders and waiters.
type Key struct {
	Key     string   `json:"key"`
	Shard   uint64   `json:"shard"`
	Holders []Holder `json:"holders"`
	// Waiters are in FIFO order: the first is granted next.
	Waiters []Holder `json:"waiters"`
}

// Holder is one holder or waiter of a Key.
type Holder struct {
	Peer         string `json:"peer"`
	Session      string `json:"session"`
	ShardSession uint64 `json:"shard_session"`
	Request      uint64 `json:"request"`
	Token        uint64 `json:"token"`
	// AgeMS is 0 and Age "unknown" when the answering replica did not
	// know the age; Age starts with "≥" when AtLeast.
	AgeMS   float64 `json:"age_ms"`
	Age     string  `json:"age"`
	AtLeast bool    `json:"at_least"`
	// Kind is what the hold is: "mutex", "read", "write", or a
	// semaphore's permits ("3 of a semaphore").
	Kind string `json:"kind"`
}

// ClusterText is a cluster id as the page shows it: hex, "" for 0 (not
// known yet).
func ClusterText(id uint64) string {
	if id == 0 {
		return ""
	}
	return strconv.FormatUint(id, 16)
}

// AgeText is how long a hold or wait has lasted, for people: "unknown"
// for a zero age that is not a lower bound (the replica did not know),
// and "≥" before an age that is only a lower bound.
func AgeText(d time.Duration, atLeast bool) string {
	switch {
	case atLeast:
		return "≥" + HumanDuration(d)
	case d <= 0:
		return "unknown"
	default:
		return HumanDuration(d)
	}
}

// Millis is d in milliseconds with microsecond precision: enough to
// compare waits, short enough to read.
func Millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// HumanDuration writes d with two or three significant figures, the way
// an operator reads it at a glance: "850µs", "12ms", "1.2s", "3m4s",
// "2h5m", "3d4h". Negative durations (clocks stepped back) read "0s".
func HumanDuration(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Millisecond:
		return d.Round(time.Microsecond).String()
	case d < 10*time.Millisecond:
		return d.Round(100 * time.Microsecond).String()
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		d = d.Round(100 * time.Millisecond)
	case d < time.Hour:
		d = d.Round(time.Second)
	case d < 48*time.Hour:
		d = d.Round(time.Minute)
	default:
		d = d.Round(time.Hour)
		days, hours := d/(24*time.Hour), (d%(24*time.Hour))/time.Hour
		if hours == 0 {
			return fmt.Sprintf("%dd", days)
		}
		return fmt.Sprintf("%dd%dh", days, hours)
	}
	// Rounding can carry into the next unit (59.96s is 1m0s); drop the
	// zero tails Duration.String writes.
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
