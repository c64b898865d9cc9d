//go:build lockmesh_broken_termfence

package peer

func init() { brokenTermFence = true }
