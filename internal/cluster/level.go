package cluster

import (
	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/mesh"
)

// LevelOf is the feature level layout p records (layout.LevelOf): layouts
// written before levels existed have none and are level 1, and so is a nil
// layout.
func LevelOf(p *layout.Placement) uint8 { return layout.LevelOf(p) }

// Speaks reports whether a peer with metadata m speaks level. A Version of
// 0 reads as 1, as everywhere levels are compared (NewLevel).
func Speaks(m mesh.Meta, level uint8) bool {
	lo, hi := m.Versions()
	return lo <= level && level <= max(hi, 1)
}

// NewLevel is the level a cluster of members starts at, or is raised to:
// the newest they all speak, and at most top, the newest this peer speaks.
func NewLevel(top uint8, members []mesh.Member) uint8 {
	level := top
	for _, m := range members {
		level = min(level, max(m.Meta.Version, 1))
	}
	return level
}
