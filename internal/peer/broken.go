package peer

// brokenTermFence is set only in a binary built with the build tag
// lockmesh_broken_termfence (broken_termfence.go): it switches the term
// fence of expiries off (Hooks.UnsafeSkipExpiryTerm) in every peer the
// binary starts, so that the multi-process checkers can show they see the
// double grants the fence prevents, where test hooks cannot reach. It
// switches the Raft port's filter off too (Hooks.UnsafeNoRaftFilter):
// the filter drops a deposed leader's ExpireSession forwarded over Raft,
// a second fence that would hide the first one's absence. No release is
// built with it, and no Config field can set it.
var brokenTermFence = false
