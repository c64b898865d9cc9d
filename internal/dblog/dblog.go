// Package dblog routes dragonboat's process-wide logger to a *slog.Logger,
// at levels that keep a healthy cluster's routine Raft events (elections,
// leader transfers, retried requests, peers restarting) below Warn: Warn
// and Error are for what an operator must act on. node installs it when a
// peer starts.
package dblog

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/lni/dragonboat/v4/logger"
)

// dragonboat's logger is process-wide and can be installed once; it writes
// through the logger of the first node started in the process, at the
// levels dbLevel gives each line. That is the first Config.Logger after
// defaults, so a first node without one discards dragonboat's lines for
// the whole process. Later nodes' Loggers are never used for dragonboat:
// their NodeHosts' lines go to the first node's Logger, untagged by peer
// (node's start passes cfg.Logger, not the node's logger with its peer
// attribute), and the first Logger stays installed after its node
// closes. node's Config.Logger documents this for users; tests swap
// dbLogger with SwapForTest.
//
// pebble, dragonboat's log store, does not log through this factory: its
// few lines (background errors) go to the standard log package.
var (
	dbLoggerOnce sync.Once
	dbLogger     atomic.Pointer[slog.Logger]
)

// Install makes dragonboat log through l, unless an earlier Install gave
// it a logger: the first one stays for the life of the process. It is
// safe for concurrent use.
func Install(l *slog.Logger) {
	dbLogger.CompareAndSwap(nil, l)
	dbLoggerOnce.Do(func() {
		logger.SetLoggerFactory(func(pkg string) logger.ILogger { return &dbLog{pkg: pkg} })
	})
}

// SwapForTest makes dragonboat's lines go to l (none if l is nil) in place
// of the installed logger, and returns the logger it replaces, which the
// test puts back with another SwapForTest when done. Only tests call it:
// l nil plays a process in which no node has started yet, so the next
// Install takes effect. It does not install the factory itself.
func SwapForTest(l *slog.Logger) *slog.Logger { return dbLogger.Swap(l) }

// levelTrace is below slog.LevelDebug: dragonboat's own debug lines, which
// a handler at Debug does not show.
const levelTrace = slog.LevelDebug - 4

// dbRule sets the level of dragonboat's lines from one of its loggers (pkg,
// the name dragonboat gives logger.GetLogger) whose format string contains
// substr.
type dbRule struct {
	pkg    string
	substr string
	level  slog.Level
}

// dbRules are dragonboat's routine warnings and errors: events every
// healthy cluster has (elections, votes, leader transfers, requests dropped
// while a shard has no leader and retried by lockmesh, connections to a
// peer that is restarting, config changes lockmesh retries). They are Info
// when they say what the cluster did, Debug when they are one step of it.
// Every warning or error not listed keeps dragonboat's level: it is
// something an operator should look at (a peer too slow to keep up with
// its ticks, a deployment id or version mismatch, corrupt input, a failed
// snapshot).
var dbRules = []dbRule{
	// Elections: a real campaign and its outcome are Info; a pre-vote
	// (which a restarted or cut-off replica repeats until it hears the
	// leader) and each vote are Debug.
	{"raft", "became PreVote candidate", slog.LevelDebug},
	{"raft", "became candidate", slog.LevelInfo},
	{"raft", "after receiving higher term", slog.LevelInfo}, // "become follower", "become followerKE"
	{"raft", "campaign skipped, pending config change", slog.LevelInfo},
	// A leader that heard from no quorum for an election timeout steps
	// down (CheckQuorum). Every restart does this on the restarting peer:
	// while it closes, and just after, when it wins an election before
	// the others' connections to it are back. A real partition shows in
	// lock calls failing with ErrUnavailable.
	{"raft", "has lost quorum", slog.LevelInfo},
	{"raft", "sent RequestPreVote", slog.LevelDebug},
	{"raft", "sent RequestVote", slog.LevelDebug},
	{"raft", "received %s rejection from", slog.LevelDebug},
	{"raft", "received %s from", slog.LevelDebug},
	{"raft", "with higher term", slog.LevelDebug},
	{"raft", "cast preVote", slog.LevelDebug},
	{"raft", "rejected preVote", slog.LevelDebug},
	{"raft", "cast vote", slog.LevelDebug},
	{"raft", "rejected vote", slog.LevelDebug},
	{"raft", "preVotes and %d rejections", slog.LevelDebug},
	{"raft", "votes and %d rejections", slog.LevelDebug},
	{"raft", "dropped RequestVote at term", slog.LevelDebug},
	{"raft", "RequestVoteResp from nonVoting", slog.LevelDebug},
	{"raft", "RequestPreVoteResp from nonVoting", slog.LevelDebug},
	// Requests that meet no leader, or a leader handing over, are retried.
	{"raft", "no leader", slog.LevelDebug},
	{"raft", "dropped proposal, leader transferring", slog.LevelDebug},
	{"raft", "dropped ReadIndex, not ready", slog.LevelDebug},
	{"raft", "dropped config change, pending change", slog.LevelDebug},
	{"raft", "dropped rate limit msg", slog.LevelDebug},
	{"raft", "no remote for", slog.LevelDebug},
	// The controller balances leaders; a transfer may meet another.
	{"raft", "LeaderTransfer ignored, leader transfer is ongoing", slog.LevelDebug},
	{"raft", "LeaderTransfer with target pointing to itself", slog.LevelDebug},
	{"raft", "is not active, sending snapshot is skipped", slog.LevelInfo},
	{"raft", "restore aborted, ss.Index <= committed", slog.LevelInfo},

	// lockmesh reads its lease table with StaleRead on purpose; dragonboat
	// warns once per process that such reads are not linearizable.
	{"dragonboat", "StaleRead called", slog.LevelDebug},
	// A replica moved or restarted: messages to its old id, proposals to
	// a stopped replica (retried), work cut short by a stop.
	{"dragonboat", "message sent to %s but received by", slog.LevelDebug},
	{"dragonboat", "dropped proposal, shard stopped", slog.LevelDebug},
	{"dragonboat", "save snapshot aborted", slog.LevelInfo},
	{"dragonboat", "aborted OpenOnDiskStateMachine", slog.LevelInfo},
	{"dragonboat", "aborted recovery", slog.LevelInfo},
	{"dragonboat", "taking snapshot, ignored new snapshot req", slog.LevelDebug},
	{"dragonboat", "ignored task.StreamSnapshot", slog.LevelInfo},
	{"dragonboat", "is not ready to stream snapshot", slog.LevelInfo},

	// A peer that is down or restarting: one Info line when it becomes
	// unreachable, the failed connections and sends under it at Debug.
	// lockmesh's membership decides when a peer is dead (DeadAfter).
	{"transport", "became unreachable", slog.LevelInfo},
	{"transport", "connect and process failed", slog.LevelDebug},
	{"transport", "failed to get a connection to", slog.LevelDebug},
	{"transport", "send batch failed", slog.LevelDebug},
	{"transport", "circuit breaker for %s is not ready", slog.LevelDebug},
	{"transport", "failed to get the header", slog.LevelDebug},
	{"transport", "failed to close the connection", slog.LevelDebug},
	{"transport", "stream snapshot to %s stopped", slog.LevelInfo},
	{"transport", "removing unclaimed chunks", slog.LevelInfo},
	{"transport", "node removed, ignored chunk", slog.LevelInfo},

	// Config changes the controller retries or that raced another.
	{"rsm", " rej ", slog.LevelInfo},

	// lockmesh's own start-up warning names every unprotected link.
	{"config", "mutual TLS disabled", slog.LevelDebug},
	{"logdb", "limited high to", slog.LevelDebug},
	{"pebblekv", "running in pebble memfs test mode", slog.LevelDebug},
}

// dbLevel is the slog level of a line dragonboat's logger pkg logs at
// level with format: the first matching rule's, else dragonboat's own,
// with its info lines (replica starts, snapshots, every leader elected on
// every shard) at Debug and its debug lines below that.
func dbLevel(pkg string, level logger.LogLevel, format string) slog.Level {
	for _, r := range dbRules {
		if r.pkg == pkg && strings.Contains(format, r.substr) {
			return r.level
		}
	}
	return dbDefaultLevel(level)
}

// dbRuleMax is the highest level a rule gives (every rule says a line is
// routine): a line's level is at most this or its default level.
const dbRuleMax = slog.LevelInfo

// dbDefaultLevel is the level of a line no rule matches.
func dbDefaultLevel(level logger.LogLevel) slog.Level {
	switch level {
	case logger.CRITICAL, logger.ERROR:
		return slog.LevelError
	case logger.WARNING:
		return slog.LevelWarn
	case logger.INFO:
		return slog.LevelDebug
	default:
		return levelTrace
	}
}

type dbLog struct{ pkg string }

func (d *dbLog) log(level logger.LogLevel, format string, args []any) {
	l := dbLogger.Load()
	// Skip the rule scan when no level the line could get is shown (the
	// default discard logger, or a Warn handler and a routine line).
	if l == nil || !l.Enabled(context.Background(), max(dbDefaultLevel(level), dbRuleMax)) {
		return
	}
	lv := dbLevel(d.pkg, level, format)
	if !l.Enabled(context.Background(), lv) {
		return
	}
	l.Log(context.Background(), lv, fmt.Sprintf(format, args...), "component", "raft", "pkg", d.pkg)
}

func (d *dbLog) SetLevel(logger.LogLevel)            {}
func (d *dbLog) Debugf(format string, args ...any)   { d.log(logger.DEBUG, format, args) }
func (d *dbLog) Infof(format string, args ...any)    { d.log(logger.INFO, format, args) }
func (d *dbLog) Warningf(format string, args ...any) { d.log(logger.WARNING, format, args) }
func (d *dbLog) Errorf(format string, args ...any)   { d.log(logger.ERROR, format, args) }
func (d *dbLog) Panicf(format string, args ...any) {
	d.log(logger.CRITICAL, format, args)
	panic(fmt.Sprintf(format, args...))
}
