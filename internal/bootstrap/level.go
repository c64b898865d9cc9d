package bootstrap

import (
	"github.com/lockmesh/lockmesh/internal/level"
	"github.com/lockmesh/lockmesh/mesh"
)

// Speaks reports whether a peer with metadata m speaks l. A MaxLevel of 0
// reads as 1, as everywhere levels are compared (NewLevel).
func Speaks(m mesh.Meta, l level.Level) bool {
	lo, hi := m.Levels()
	return lo <= l && l <= max(hi, level.Positional)
}

// NewLevel is the level a cluster of members starts at, or is raised to:
// the newest they all speak, and at most top, the newest this peer speaks.
func NewLevel(top level.Level, members []mesh.Member) level.Level {
	l := top
	for _, m := range members {
		l = min(l, max(m.Meta.MaxLevel, level.Positional))
	}
	return l
}
