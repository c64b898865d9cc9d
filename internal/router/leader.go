package router

// The leader cache: which peer leads each shard, as far as this peer has
// heard. It is only a hint for where to send first; a wrong entry costs
// one redirected or failed try, never correctness.

// SetLeader records name as shard's leader.
func (r *Router) SetLeader(shard uint64, name string) {
	r.leaderMu.Lock()
	r.leaders[shard] = name
	r.leaderMu.Unlock()
}

// ForgetLeader drops name as shard's known leader, if it still is.
func (r *Router) ForgetLeader(shard uint64, name string) {
	r.leaderMu.Lock()
	if r.leaders[shard] == name {
		delete(r.leaders, shard)
	}
	r.leaderMu.Unlock()
}

// Leader returns the last leader recorded for shard, or "".
func (r *Router) Leader(shard uint64) string {
	r.leaderMu.Lock()
	defer r.leaderMu.Unlock()
	return r.leaders[shard]
}

// LeaderGuess names the peer most likely leading shard: what the local
// replica says if this peer hosts one, else the last known leader while
// the layout still has it hosting the shard, else "".
func (r *Router) LeaderGuess(shard uint64) string {
	p := r.host.Placement()
	if p == nil {
		return ""
	}
	if r.host.Hosts(shard) {
		if id, ok := r.host.LocalLeader(shard); ok {
			if name, ok := p.ReplicaPeer(shard, id); ok {
				return name
			}
		}
	}
	// A hint from an answer: only while the layout still has the named
	// peer hosting the shard (it may have left since).
	if name := r.Leader(shard); name != "" && p.Hosts(shard, name) {
		return name
	}
	return ""
}
