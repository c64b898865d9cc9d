package node

import (
	"flag"
	"testing"
)

// soakFor enables the soak tier: each nemesis runs, fault after fault, for
// this long. Examples, all nemeses or one:
//
//	go test ./node -run Soak -v -timeout 60m -lockmesh.soak=2m
//	go test ./node -run 'Soak/^disk-stall$' -v -timeout 10m -lockmesh.soak=2m
var soakFor = flag.Duration("lockmesh.soak", 0, "run each nemesis for this long (soak tier; 0 skips it)")

func TestSoakNemeses(t *testing.T) {
	if *soakFor <= 0 {
		t.Skip("soak tier: set -lockmesh.soak=2m to run it")
	}
	var total, bad, ran int
	for _, nm := range nemeses {
		t.Run(nm.name, func(t *testing.T) {
			ran++
			r := runNemesis(t, nm, *soakFor, nm.opts)
			total += r.ops
			bad += len(r.violations)
			reportViolations(t, r)
		})
	}
	t.Logf("soak: %d ops checked over %d nemeses of %v each, %d violations", total, ran, *soakFor, bad)
}
