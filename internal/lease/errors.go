package lease

import "errors"

// ErrTermNotRecorded means the shard's state has not yet recorded the
// leader's term, so the leader acknowledges nothing (rule 0): have the
// term recorded (Lapsed asks for it) and let the sender retry.
var ErrTermNotRecorded = errors.New("the leader's term is not recorded in the shard's state yet")

// ErrNotLeader means the lease table does not have this peer leading the
// shard in the term the caller confirmed: Raft's report of that election
// has not reached the table yet, or the leadership has ended since (Raft
// reported a change, or the shard's state has recorded a later term).
// Nothing is acknowledged; the sender retries, or looks for the new leader.
var ErrNotLeader = errors.New("the lease table does not have this peer leading the shard in that term")
