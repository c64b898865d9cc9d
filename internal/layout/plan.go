package layout

import (
	"slices"

	"github.com/lockmesh/lockmesh/mesh"
)

// Desired spreads RF replicas of every shard of p over the eligible peers
// (all of them if fewer) with as few moves as possible: it keeps the
// current replicas on eligible peers, fills missing ones on the least
// loaded peers (rendezvous order breaking ties), trims extras from the
// most loaded, then moves replicas from the most to the least loaded peer
// until counts differ by at most one. It returns shard id -> the peers
// that should host it. The result depends only on p and the set and order
// of eligible; with no eligible peer it is empty.
func Desired(p *Placement, eligible []string) map[uint64][]string {
	out := map[uint64][]string{}
	if len(eligible) == 0 {
		return out
	}
	shards := p.ShardIDs()
	rf := min(p.RF, len(eligible))
	count := map[string]int{}
	for _, name := range eligible {
		count[name] = 0
	}
	for _, shard := range shards {
		for _, name := range p.HostNames(shard) {
			if _, ok := count[name]; ok {
				out[shard] = append(out[shard], name)
				count[name]++
			}
		}
	}
	least := func(candidates []string) string {
		best := ""
		for _, name := range candidates {
			if best == "" || count[name] < count[best] {
				best = name
			}
		}
		return best
	}
	for _, shard := range shards {
		for len(out[shard]) < rf {
			var free []string
			for _, name := range mesh.Replicas(shard, eligible, len(eligible)) {
				if !slices.Contains(out[shard], name) {
					free = append(free, name)
				}
			}
			name := least(free)
			out[shard] = append(out[shard], name)
			count[name]++
		}
		for len(out[shard]) > rf {
			most := out[shard][0]
			for _, name := range out[shard] {
				if count[name] > count[most] {
					most = name
				}
			}
			out[shard] = slices.DeleteFunc(out[shard], func(n string) bool { return n == most })
			count[most]--
		}
	}
	sorted := slices.Clone(eligible)
	slices.Sort(sorted)
	for range len(shards) * rf {
		hi, lo := sorted[0], sorted[0]
		for _, name := range sorted {
			if count[name] > count[hi] {
				hi = name
			}
			if count[name] < count[lo] {
				lo = name
			}
		}
		if count[hi]-count[lo] <= 1 {
			break
		}
		moved := false
		for _, shard := range shards {
			if slices.Contains(out[shard], hi) && !slices.Contains(out[shard], lo) {
				i := slices.Index(out[shard], hi)
				out[shard][i] = lo
				count[hi]--
				count[lo]++
				moved = true
				break
			}
		}
		if !moved {
			break
		}
	}
	return out
}

// ReplicaFloor is the fewest replicas a planned change may leave a shard
// with: the replication factor, or every live listed peer when there are
// fewer. alive holds the names of the peers that are up. Draining peers
// count: their replicas stay until others can take them, so a Leave that
// would take shards below RF waits instead. Only a dead peer takes a shard
// below it.
func ReplicaFloor(p *Placement, alive map[string]bool) int {
	live := 0
	for _, pe := range p.Peers {
		if alive[pe.Name] {
			live++
		}
	}
	return min(p.RF, live)
}

// PlanMove picks the next step that takes shard toward want, the peers
// Desired gives it, given the peers that are up (alive) and the floor
// from ReplicaFloor. At most one of add and remove is set:
//
//   - first, a replica on a dead peer that want does not keep, to remove
//     (adding a member while one is dead would raise the quorum while a
//     member cannot vote);
//   - else a peer in want without a replica, to add one on;
//   - else, only once the shard has more replicas than want and than
//     floor, a surplus replica to remove.
//
// So a plan never takes a shard below floor except by removing a dead
// peer's replica. Neither set means the shard is where it should be.
func PlanMove(p *Placement, shard uint64, want []string, alive map[string]bool, floor int) (add string, remove *Replica) {
	cur := p.Replicas[shard]
	for _, r := range cur {
		if !alive[r.Peer] && !slices.Contains(want, r.Peer) {
			return "", &r
		}
	}
	for _, name := range want {
		if !p.Hosts(shard, name) {
			return name, nil
		}
	}
	if len(cur) <= max(len(want), floor) {
		return "", nil
	}
	for _, r := range cur {
		if !slices.Contains(want, r.Peer) {
			return "", &r
		}
	}
	return "", nil
}
