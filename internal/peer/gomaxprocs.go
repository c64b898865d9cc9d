package peer

import "github.com/lockmesh/lockmesh/internal/procs"

// hintGOMAXPROCS says once, at start, when a peer hosting replicas runs
// with fewer Ps than suit it (see internal/procs for why). The library
// never changes GOMAXPROCS itself: that is the whole process's setting.
func (n *Peer) hintGOMAXPROCS() {
	if n.cfg.NoReplicas {
		return
	}
	if p, low := procs.Low(); low {
		n.log.Info("GOMAXPROCS is low for a peer whose fsyncs block scheduler threads; "+
			"set the GOMAXPROCS environment variable, or call runtime.GOMAXPROCS in main, to the suggested value or more",
			"gomaxprocs", p, "suggested", procs.Min)
	}
}
