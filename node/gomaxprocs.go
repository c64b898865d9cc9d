package node

import (
	"os"
	"runtime"
)

// MinGOMAXPROCS is the GOMAXPROCS a peer process runs best with on a small
// machine; see RaiseGOMAXPROCS.
const MinGOMAXPROCS = 8

// RaiseGOMAXPROCS raises the Go scheduler's GOMAXPROCS to at least
// MinGOMAXPROCS unless the GOMAXPROCS environment variable is set, and
// returns the value in effect. It changes the whole process, so the
// library never calls it; applications whose main job is a peer may.
//
// Why: a peer's Raft log fsyncs block the goroutine's scheduler thread in
// the kernel, and its work moves between many short-lived goroutines (the
// Raft step, commit and apply workers, the batchers, the RPC connections).
// With GOMAXPROCS equal to the cores of a small machine, a goroutine coming
// back from an fsync or woken by the network waits in Go's run queue behind
// the others while a core sits in iowait. With more Ps than cores the
// kernel interleaves them instead. Measured on 2 cores, 3 peers in one
// process, fsync on (docs/BENCHMARKS.md): lock+unlock at 64 callers went
// from about 2.4k to 5k ops/s with GOMAXPROCS 8 instead of 2, and the c=1
// op p50 from 1.7 to 1.5 ms.
func RaiseGOMAXPROCS() int {
	cur, low := lowGOMAXPROCS()
	if !low {
		return cur
	}
	runtime.GOMAXPROCS(MinGOMAXPROCS)
	return MinGOMAXPROCS
}

// lowGOMAXPROCS returns the GOMAXPROCS in effect and whether
// RaiseGOMAXPROCS would raise it: below MinGOMAXPROCS and not set in the
// environment.
func lowGOMAXPROCS() (cur int, low bool) {
	cur = runtime.GOMAXPROCS(0)
	return cur, cur < MinGOMAXPROCS && os.Getenv("GOMAXPROCS") == ""
}

// hintGOMAXPROCS says once, at start, when a peer hosting replicas runs
// with fewer Ps than RaiseGOMAXPROCS would set.
func (n *Node) hintGOMAXPROCS() {
	if n.cfg.NoReplicas {
		return
	}
	if p, low := lowGOMAXPROCS(); low {
		n.log.Info("GOMAXPROCS is low for a peer whose fsyncs block scheduler threads; set GOMAXPROCS or call node.RaiseGOMAXPROCS", "gomaxprocs", p, "suggested", MinGOMAXPROCS)
	}
}
