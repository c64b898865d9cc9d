package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/lockmesh/lockmesh/node"
)

// runChild runs a peer or an observer until SIGINT or SIGTERM, and
// returns the exit code.
func runChild(cfg config, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Before anything starts: a SIGUSR1 that arrives early must not kill
	// the process (its default action) but ask for a resignation.
	resign := make(chan os.Signal, 1)
	signal.Notify(resign, syscall.SIGUSR1)
	defer signal.Stop(resign)

	n, err := node.Start(ctx, cfg.node)
	if err != nil && ctx.Err() != nil {
		return 0 // signalled while joining
	}
	if err != nil {
		fmt.Fprintf(stderr, "election: %v\n", err)
		return 1
	}
	defer n.Close()
	select {
	case <-n.Ready():
		fmt.Fprintf(stdout, "ready %s gossip=%s\n", n.Name(), n.GossipAddr())
	case <-ctx.Done():
	}
	if ctx.Err() == nil {
		if cfg.role == rolePeer {
			if cfg.reportShardLeader > 0 {
				go reportShardLeader(ctx, n, cfg.election, cfg.reportShardLeader, stdout)
			}
			campaign(ctx, n, cfg, resign, stdout, stderr)
		} else {
			observe(ctx, n, cfg.election, stdout, stderr)
		}
	}
	stop() // a second signal kills the process if Close hangs
	if err := n.Close(); err != nil {
		fmt.Fprintf(stderr, "election: close: %v\n", err)
		return 1
	}
	return 0
}

// errStepDown is what the leader's function returns when SIGUSR1 asks it
// to resign: RunElected then resigns, and the peer campaigns again.
var errStepDown = errors.New("asked to resign (SIGUSR1)")

// campaign runs for the election, proclaiming the peer's name, until ctx
// ends: node.RunElected, again after a resignation asked for by SIGUSR1,
// and with a new Session after one was lost.
func campaign(ctx context.Context, n *node.Node, cfg config, resign <-chan os.Signal, stdout, stderr io.Writer) {
	name := n.Name()
	for ctx.Err() == nil {
		s, err := n.NewSession(ctx)
		if err != nil {
			fmt.Fprintf(stderr, "election: new session: %v\n", err)
			sleep(ctx, time.Second)
			continue
		}
		fmt.Fprintf(stdout, "candidate peer=%s session=%d\n", name, s.ID())
		for ctx.Err() == nil {
			var term uint64
			qctx, stopQueued := context.WithCancel(ctx)
			go reportQueued(qctx, n, cfg.election, s.ID(), stdout)
			err = node.RunElected(ctx, s.Election(cfg.election), []byte(name), func(ctx context.Context, ld *node.Leadership) error {
				term = ld.Term()
				return lead(ctx, ld, name, cfg.reportLeading, resign, stdout)
			})
			stopQueued()
			if !errors.Is(err, errStepDown) {
				break
			}
			// Resigned on request: RunElected returns errStepDown itself
			// once the resignation committed, joined with the
			// resignation's error otherwise. Campaign again through the
			// same Session, at the back of the queue.
			if err == errStepDown {
				fmt.Fprintf(stdout, "resigned term=%d peer=%s at=%d\n", term, name, time.Now().UnixNano())
			} else {
				fmt.Fprintf(stdout, "resign-failed term=%d peer=%s err=%v\n", term, name, err)
			}
		}
		// RunElected resigned or withdrew before it returned.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = s.Close(cctx)
		cancel()
		switch {
		case ctx.Err() != nil:
		case s.Err() != nil:
			// The Session was lost (its lease ran out: a pause, a
			// partition): a new one campaigns again at once.
			fmt.Fprintf(stdout, "session-lost peer=%s err=%v\n", name, err)
		default:
			// The cluster refused the campaign (below feature level 4,
			// closing): try again in a while.
			fmt.Fprintf(stdout, "campaign-failed peer=%s err=%v\n", name, err)
			sleep(ctx, time.Second)
		}
	}
}

// lead is the leader's work: it prints an elected line, a leading line
// every report while the leadership holds, and how it ended. It returns
// errStepDown on SIGUSR1, nil otherwise.
func lead(ctx context.Context, ld *node.Leadership, name string, report time.Duration, resign <-chan os.Signal, stdout io.Writer) error {
	// A SIGUSR1 from before this term is not for it.
	select {
	case <-resign:
	default:
	}
	fmt.Fprintf(stdout, "elected term=%d peer=%s at=%d\n", ld.Term(), name, time.Now().UnixNano())
	var tick <-chan time.Time
	if report > 0 {
		t := time.NewTicker(report)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			// ctx is the leadership's: it ended, or the peer is stopping.
			if err := ld.Err(); err != nil {
				fmt.Fprintf(stdout, "lost term=%d peer=%s at=%d err=%v\n", ld.Term(), name, time.Now().UnixNano(), err)
			} else {
				fmt.Fprintf(stdout, "resigning term=%d peer=%s at=%d\n", ld.Term(), name, time.Now().UnixNano())
			}
			return nil
		case <-resign:
			fmt.Fprintf(stdout, "resigning term=%d peer=%s at=%d\n", ld.Term(), name, time.Now().UnixNano())
			return errStepDown
		case <-tick:
			// The time first, then the check: the leadership held at a
			// moment no earlier than the time printed.
			at := time.Now().UnixNano()
			if ld.Err() != nil {
				continue // ctx is cancelled too: reported as lost
			}
			fmt.Fprintf(stdout, "leading term=%d peer=%s at=%d\n", ld.Term(), name, at)
		}
	}
}

// reportQueued prints a queued line once the Session whose ID is session
// shows among the election's waiters (candidates), with its place in the
// queue, 1 for the next to be elected. It polls the linearizable Inspect
// until then, until the Session leads, or until ctx ends.
func reportQueued(ctx context.Context, n *node.Node, election string, session uint64, stdout io.Writer) {
	for ctx.Err() == nil {
		info, err := n.Inspect(ctx, election)
		if err == nil {
			for _, h := range info.Holders {
				if h.Session == session {
					return // elected: lead prints that
				}
			}
			for i, w := range info.Waiters {
				if w.Session == session {
					fmt.Fprintf(stdout, "queued peer=%s place=%d at=%d\n", n.Name(), i+1, time.Now().UnixNano())
					return
				}
			}
		}
		sleep(ctx, 20*time.Millisecond)
	}
}

// reportShardLeader prints a shardleader line when the peer that leads
// the Raft shard holding the election changed, as this peer sees it
// (Placement: for a shard it hosts, its own replica's view), looking
// every interval until ctx ends; the first line says who leads at the
// start. A deposed shard leader that was paused (SIGSTOP) names itself
// until its replica hears of the new leader.
func reportShardLeader(ctx context.Context, n *node.Node, election string, every time.Duration, stdout io.Writer) {
	shard, err := n.ShardOf(ctx, election)
	if err != nil {
		return // ctx ended or the node closed; an invalid name was refused by the flags
	}
	last := ""
	for ctx.Err() == nil {
		pctx, cancel := context.WithTimeout(ctx, max(every, time.Second))
		placement, _ := n.Placement(pctx) // nil on an error: looked up again next time
		cancel()
		for _, si := range placement {
			if si.Shard != shard {
				continue
			}
			leader := si.Leader
			if leader == "" {
				leader = "none"
			}
			if leader != last {
				fmt.Fprintf(stdout, "shardleader shard=%d peer=%s at=%d\n", shard, leader, time.Now().UnixNano())
				last = leader
			}
		}
		sleep(ctx, every)
	}
}

// observe prints every change of the election's leader until ctx ends.
// An observation that ends with an error is started again; its first
// event is printed as a resync, since changes in between may be missed.
func observe(ctx context.Context, n *node.Node, election string, stdout, stderr io.Writer) {
	again := false
	for ctx.Err() == nil {
		events, err := n.Observe(ctx, election)
		if err != nil {
			fmt.Fprintf(stderr, "election: observe: %v\n", err)
			sleep(ctx, time.Second)
			continue
		}
		for ev := range events {
			if ev.Err != nil {
				fmt.Fprintf(stdout, "observe-ended index=%d err=%v\n", ev.Index, ev.Err)
				again = true
				break
			}
			fmt.Fprintln(stdout, eventLine(ev, again))
			again = false
		}
		sleep(ctx, 100*time.Millisecond)
	}
}

// eventLine is the observer's line for ev.
func eventLine(ev node.LeaderEvent, resync bool) string {
	s := ""
	if ev.Resync || resync {
		s = "resync "
	}
	at := time.Now().UnixNano()
	if ev.Leader == nil {
		return fmt.Sprintf("%svacant index=%d at=%d", s, ev.Index, at)
	}
	return fmt.Sprintf("%sleader term=%d value=%s index=%d at=%d", s, ev.Leader.Term, printable(ev.Leader.Value), ev.Index, at)
}

// printable is v as one field of a line: as it is if it is printable
// ASCII without spaces or quotes, quoted otherwise.
func printable(v []byte) string {
	for _, c := range v {
		if c <= ' ' || c > '~' || c == '"' {
			return strconv.Quote(string(v))
		}
	}
	if len(v) == 0 {
		return `""`
	}
	return string(v)
}

// sleep waits for d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// lineWriter serialises writes from several goroutines; each Fprintf of a
// line is one Write, so lines never interleave.
type lineWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (lw *lineWriter) Write(p []byte) (int, error) {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	return lw.w.Write(p)
}
