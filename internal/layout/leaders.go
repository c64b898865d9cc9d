package layout

import "slices"

// LeaderMove is one leadership transfer: the leader of Shard, on peer
// From, hands its leadership to Target, the replica of Shard on peer To.
type LeaderMove struct {
	Shard    uint64
	From, To string
	Target   uint64
}

// LeaderCounts counts the shards each peer leads, given leaders (shard
// id -> id of the replica leading it). Each of peers is in the result, 0
// if it leads nothing, and so is any other listed peer that leads a
// shard; a leader replica p does not list is not counted.
func LeaderCounts(p *Placement, peers []string, leaders map[uint64]uint64) map[string]int {
	count, _ := leadership(p, peers, leaders)
	return count
}

// leadership returns LeaderCounts and, by peer, the shards it leads in
// increasing order.
func leadership(p *Placement, peers []string, leaders map[uint64]uint64) (map[string]int, map[string][]uint64) {
	count := map[string]int{}
	for _, name := range peers {
		count[name] = 0
	}
	ledBy := map[string][]uint64{}
	for shard, id := range leaders {
		if pe, ok := p.PeerByReplica(id); ok {
			count[pe.Name]++
			ledBy[pe.Name] = append(ledBy[pe.Name], shard)
		}
	}
	for _, shards := range ledBy {
		slices.Sort(shards)
	}
	return count, ledBy
}

// PlanLeaderMove picks one leadership transfer that evens out how many
// shards each of peers (the peers that may lead: up and not draining)
// leads, given leaders (shard id -> id of the replica leading it, for the
// shards whose leader is known). It moves a shard from the peer leading
// the most to one leading at least two fewer that hosts a replica of it;
// failing that, from a peer in between to the least loaded one, when the
// most loaded can then give that peer one in turn. It reports false when
// leadership is balanced as far as replicas allow (or fewer than two
// peers).
//
// When a peer could give several shards, turn picks where among them the
// choice starts, so a caller that passes a new turn each time does not
// retry for ever a transfer that does not take (a target still catching
// up) while other shards could move. The result depends only on the
// arguments.
func PlanLeaderMove(p *Placement, peers []string, leaders map[uint64]uint64, turn int) (LeaderMove, bool) {
	if len(peers) < 2 {
		return LeaderMove{}, false
	}
	count, ledBy := leadership(p, peers, leaders)
	byCount := slices.Clone(peers)
	slices.SortStableFunc(byCount, func(a, b string) int { return count[b] - count[a] })
	move := func(from, to string, shard uint64) (LeaderMove, bool) {
		target, _ := p.ReplicaID(shard, to)
		return LeaderMove{Shard: shard, From: from, To: to, Target: target}, true
	}
	canGive := func(from, to string) (uint64, bool) {
		shards := ledBy[from]
		if len(shards) == 0 {
			return 0, false
		}
		start := turn % len(shards)
		if start < 0 {
			start += len(shards)
		}
		for i := range shards {
			if shard := shards[(start+i)%len(shards)]; p.Hosts(shard, to) {
				return shard, true
			}
		}
		return 0, false
	}
	// The most loaded peer that can hand a shard to a peer leading at
	// least two fewer.
	for _, most := range byCount {
		for i := len(byCount) - 1; i >= 0; i-- {
			least := byCount[i]
			if count[most]-count[least] < 2 {
				break
			}
			if shard, ok := canGive(most, least); ok {
				return move(most, least, shard)
			}
		}
	}
	// No direct move: let a peer one above the least loaded give it a
	// shard, if the most loaded can then give that peer one next round.
	most, least := byCount[0], byCount[len(byCount)-1]
	if count[most]-count[least] >= 2 {
		for _, mid := range byCount {
			if mid == most || count[mid] <= count[least] {
				continue
			}
			if _, ok := canGive(most, mid); !ok {
				continue
			}
			if shard, ok := canGive(mid, least); ok {
				return move(mid, least, shard)
			}
		}
	}
	return LeaderMove{}, false
}
