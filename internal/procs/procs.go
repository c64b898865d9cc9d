// Package procs sizes the Go scheduler for a process whose main job is a
// lockmesh peer. It changes the whole process, so the library never calls
// it; the examples and commands do, in main.
package procs

import (
	"os"
	"runtime"
)

// Min is the GOMAXPROCS a peer process runs best with on a small machine.
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
const Min = 8

// Raise raises GOMAXPROCS to at least Min unless the GOMAXPROCS environment
// variable is set, and returns the value in effect afterwards. Call it
// early in main, before starting peers.
func Raise() int {
	cur, low := Low()
	if !low {
		return cur
	}
	runtime.GOMAXPROCS(Min)
	return Min
}

// Low returns the GOMAXPROCS in effect and whether Raise would raise it:
// below Min and not set in the environment.
func Low() (cur int, low bool) {
	cur = runtime.GOMAXPROCS(0)
	return cur, cur < Min && os.Getenv("GOMAXPROCS") == ""
}
