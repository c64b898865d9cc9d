package peer

import (
	"slices"
	"testing"
	"time"
)

// A shard without a leader is worth one warning once it has had none for
// as long as the rule says, and an info line when it has one again; a
// short election is worth nothing, nor is a replica that moved away.
func TestLeaderlessWarnsOncePerOutage(t *testing.T) {
	t0 := time.Unix(1000, 0)
	l := newLeaderless(3 * time.Second)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	sorted := func(os []outage) []outage {
		slices.SortFunc(os, func(a, b outage) int { return int(a.Shard) - int(b.Shard) })
		return os
	}
	steps := []struct {
		at    int
		known map[uint64]bool
		want  []outage
	}{
		{0, map[uint64]bool{1: true, 2: false, 3: false}, nil},
		{1, map[uint64]bool{1: true, 2: true, 3: false}, nil}, // 2: a short election
		{3, map[uint64]bool{1: true, 2: true, 3: false}, []outage{{Shard: 3, For: 3 * time.Second}}},
		{4, map[uint64]bool{1: false, 2: true, 3: false}, nil}, // warned once
		{9, map[uint64]bool{1: false, 2: true, 3: true}, []outage{{Shard: 1, For: 5 * time.Second}, {Shard: 3, For: 9 * time.Second, Recovered: true}}},
		{10, map[uint64]bool{2: true}, nil}, // 1 moved away: forgotten quietly
		{20, map[uint64]bool{1: false, 2: true}, nil},
	}
	for _, s := range steps {
		if got := sorted(l.observe(at(s.at), s.known)); !slices.Equal(got, s.want) {
			t.Fatalf("at %ds: %+v, want %+v", s.at, got, s.want)
		}
	}
}
