package replica

import "github.com/lockmesh/lockmesh/lockfsm"

// Sessions is a lock shard's sessions as the local replica has applied
// them, read without a Raft round: what node's authorization checks
// (authz.Sessions) ask about a request's sessions. An owner never
// changes once a session is open, and a replica that lags at worst does
// not know a session yet (the state machine then answers for it).
type Sessions struct {
	Shard uint64
	// Read runs a StateReader on the local replica of a shard: the
	// NodeHost's StaleRead.
	Read func(shard uint64, query any) (any, error)
	// RequireCapped is what Capped answers: OpenSessions must carry
	// lockfsm.Command.Capped (authz.Sessions).
	RequireCapped bool
}

// Owner returns the owner of session id; false when the replica does not
// know it, or cannot be read (not hosted, halted).
func (s Sessions) Owner(id uint64) (string, bool) {
	v, err := s.Read(s.Shard, StateReader(func(st *lockfsm.State) any {
		info, ok := st.Session(id)
		if !ok {
			return nil
		}
		return info.Owner
	}))
	owner, ok := v.(string)
	return owner, err == nil && ok
}

// Count returns how many sessions the shard has, and how many of them
// owner owns, from the counts the state keeps for the session caps: O(1),
// not a pass over the sessions. 0, 0 when the replica cannot be read.
func (s Sessions) Count(owner string) (total, owned int) {
	v, err := s.Read(s.Shard, StateReader(func(st *lockfsm.State) any {
		total, owned := st.SessionCount(owner)
		return [2]int{total, owned}
	}))
	c, _ := v.([2]int)
	if err != nil {
		return 0, 0
	}
	return c[0], c[1]
}

// Capped reports RequireCapped.
func (s Sessions) Capped() bool { return s.RequireCapped }
