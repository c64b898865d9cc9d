package lease

import "errors"

// ErrTermNotRecorded means the shard's state has not yet recorded the
// leader's term, so the leader acknowledges nothing (rule 0): have the
// term recorded (Lapsed asks for it) and let the sender retry.
var ErrTermNotRecorded = errors.New("the leader's term is not recorded in the shard's state yet")

// ErrTermEnded means the shard's state has recorded a later term than the
// one the caller confirmed: a newer leader exists, so nothing is
// acknowledged. The sender should look for the new leader.
var ErrTermEnded = errors.New("the shard's state has recorded a later leader term")
