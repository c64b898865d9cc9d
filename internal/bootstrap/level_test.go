package bootstrap

import (
	"testing"

	"github.com/lockmesh/lockmesh/internal/level"
	"github.com/lockmesh/lockmesh/mesh"
)

// member is an alive gossip member that speaks levels 1 to top.
func member(top level.Level) mesh.Member {
	return mesh.Member{State: mesh.StateAlive, Meta: mesh.Meta{MinLevel: 1, MaxLevel: top}}
}

func TestLevels(t *testing.T) {
	for _, c := range []struct {
		lo, hi, level level.Level
		want          bool
	}{{0, 0, 1, true}, {0, 0, 2, false}, {1, 2, 2, true}, {2, 3, 1, false}, {1, 1, 2, false}} {
		if got := Speaks(mesh.Meta{MinLevel: c.lo, MaxLevel: c.hi}, c.level); got != c.want {
			t.Errorf("Speaks(%d..%d, %d) = %v, want %v", c.lo, c.hi, c.level, got, c.want)
		}
	}
	ms := []mesh.Member{member(2), member(0)}
	if got := NewLevel(2, ms); got != 1 {
		t.Errorf("NewLevel with a member of version 0 = %d, want 1", got)
	}
	if got := NewLevel(1, ms[:1]); got != 1 {
		t.Errorf("NewLevel above this peer's top = %d, want 1", got)
	}
}
