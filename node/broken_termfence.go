//go:build lockmesh_broken_termfence

package node

func init() { brokenTermFence = true }
