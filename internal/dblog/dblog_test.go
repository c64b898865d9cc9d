package dblog

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/lni/dragonboat/v4/logger"
)

// dragonboatLines are format strings dragonboat v4 logs (copied from its
// source), with the level each must come out at: routine events Info or
// Debug, what an operator must act on Warn or Error.
var dragonboatLines = []struct {
	pkg    string
	level  logger.LogLevel
	format string
	want   slog.Level
}{
	// Elections and leader changes.
	{"raft", logger.WARNING, "%s became PreVote candidate", slog.LevelDebug},
	{"raft", logger.WARNING, "%s became candidate", slog.LevelInfo},
	{"raft", logger.WARNING, "%s become follower after receiving higher term from %s", slog.LevelInfo},
	{"raft", logger.WARNING, "%s become followerKE after receiving higher term from %s", slog.LevelInfo},
	{"raft", logger.WARNING, "%s campaign skipped, pending config change", slog.LevelInfo},
	{"raft", logger.WARNING, "%s has lost quorum", slog.LevelInfo},
	{"raft", logger.WARNING, "%s sent RequestPreVote to %s", slog.LevelDebug},
	{"raft", logger.WARNING, "%s sent RequestVote to %s", slog.LevelDebug},
	{"raft", logger.WARNING, "%s received %s rejection from %s", slog.LevelDebug},
	{"raft", logger.WARNING, "%s received %s from %s", slog.LevelDebug},
	{"raft", logger.WARNING, "%s received %s with higher term (%d) from %s", slog.LevelDebug},
	{"raft", logger.WARNING, "%s cast preVote from %s index %d term %d, log term: %d", slog.LevelDebug},
	{"raft", logger.WARNING, "%s rejected preVote %s index %d term %d,logterm %d, utd %t", slog.LevelDebug},
	{"raft", logger.WARNING, "%s cast vote from %s index %d term %d, log term: %d", slog.LevelDebug},
	{"raft", logger.WARNING, "%s rejected vote %s index%d term%d,logterm%d,grant%v,utd%v", slog.LevelDebug},
	{"raft", logger.WARNING, "%s received %d preVotes and %d rejections, quorum is %d", slog.LevelDebug},
	{"raft", logger.WARNING, "%s received %d votes and %d rejections, quorum is %d", slog.LevelDebug},
	{"raft", logger.WARNING, "%s dropped RequestVote at term %d from %s, leader available", slog.LevelDebug},
	{"raft", logger.WARNING, "dropped RequestVoteResp from nonVoting", slog.LevelDebug},
	{"raft", logger.WARNING, "dropped RequestPreVoteResp from nonVoting", slog.LevelDebug},
	{"raft", logger.INFO, "%s became leader", slog.LevelDebug},
	// Requests while there is no leader, or one handing over.
	{"raft", logger.WARNING, "%s dropped proposal, no leader", slog.LevelDebug},
	{"raft", logger.WARNING, "%s dropped ReadIndex, no leader", slog.LevelDebug},
	{"raft", logger.WARNING, "%s dropped read index, no leader", slog.LevelDebug},
	{"raft", logger.WARNING, "%s dropped LeaderTransfer, no leader", slog.LevelDebug},
	{"raft", logger.WARNING, "%s dropped proposal, leader transferring", slog.LevelDebug},
	{"raft", logger.WARNING, "%s dropped ReadIndex, not ready", slog.LevelDebug},
	{"raft", logger.WARNING, "%s dropped config change, pending change", slog.LevelDebug},
	{"raft", logger.WARNING, "%s dropped rate limit msg, rl disabled", slog.LevelDebug},
	{"raft", logger.WARNING, "%s no remote for %s", slog.LevelDebug},
	{"raft", logger.WARNING, "LeaderTransfer ignored, leader transfer is ongoing", slog.LevelDebug},
	{"raft", logger.WARNING, "received LeaderTransfer with target pointing to itself", slog.LevelDebug},
	{"raft", logger.WARNING, "%s, %s is not active, sending snapshot is skipped", slog.LevelInfo},
	{"raft", logger.WARNING, "%s, restore aborted, ss.Index <= committed", slog.LevelInfo},
	// Replicas moving, restarting, stopping.
	{"dragonboat", logger.WARNING, "StaleRead called, linearizability not guaranteed for stale read", slog.LevelDebug},
	{"dragonboat", logger.WARNING, "ignored a %s message sent to %s but received by %s", slog.LevelDebug},
	{"dragonboat", logger.WARNING, "%s dropped proposal, shard stopped", slog.LevelDebug},
	{"dragonboat", logger.WARNING, "%s save snapshot aborted, %v", slog.LevelInfo},
	{"dragonboat", logger.WARNING, "%s aborted OpenOnDiskStateMachine", slog.LevelInfo},
	{"dragonboat", logger.WARNING, "%s aborted recovery", slog.LevelInfo},
	{"dragonboat", logger.WARNING, "%s taking snapshot, ignored new snapshot req", slog.LevelDebug},
	{"dragonboat", logger.WARNING, "%s ignored task.StreamSnapshot", slog.LevelInfo},
	{"dragonboat", logger.WARNING, "%s is not ready to stream snapshot", slog.LevelInfo},
	// A peer restarting.
	{"transport", logger.WARNING, "%s became unreachable, affected %d nodes", slog.LevelInfo},
	{"transport", logger.WARNING, "breaker %s to %s failed, connect and process failed: %s", slog.LevelDebug},
	{"transport", logger.ERROR, "Nodehost %s failed to get a connection to %s, %v", slog.LevelDebug},
	{"transport", logger.ERROR, "send batch failed, target %s (%v), %d", slog.LevelDebug},
	{"transport", logger.ERROR, "send batch failed, taret node %s (%v), %d", slog.LevelDebug},
	{"transport", logger.WARNING, "circuit breaker for %s is not ready", slog.LevelDebug},
	{"transport", logger.ERROR, "failed to get the header", slog.LevelDebug},
	{"transport", logger.ERROR, "failed to close the connection %v", slog.LevelDebug},
	{"transport", logger.WARNING, "stream snapshot to %s stopped", slog.LevelInfo},
	{"transport", logger.WARNING, "removing unclaimed chunks %s", slog.LevelInfo},
	{"transport", logger.WARNING, "node removed, ignored chunk %s", slog.LevelInfo},
	// Config changes retried or raced.
	{"rsm", logger.WARNING, "%s rej out-of-order ConfChange ccid %d (%d), type %s", slog.LevelInfo},
	{"rsm", logger.WARNING, "%s rej add exist ccid %d (%d) %s (%s)", slog.LevelInfo},
	{"rsm", logger.WARNING, "%s rej add removed ccid %d (%d), %s", slog.LevelInfo},
	{"config", logger.WARNING, "mutual TLS disabled, communication is insecure", slog.LevelDebug},
	{"logdb", logger.WARNING, "%s limited high to %d in logReader.entriesLocked", slog.LevelDebug},
	{"pebblekv", logger.WARNING, "running in pebble memfs test mode", slog.LevelDebug},
	{"dragonboat", logger.INFO, "%s applied snapshot", slog.LevelDebug},
	{"raft", logger.DEBUG, "%s is trying to connect to %s", levelTrace},

	// What an operator must look at keeps dragonboat's level.
	{"raft", logger.WARNING, "unknown LeaderTransfer target", slog.LevelWarn},
	{"raft", logger.WARNING, "%s snapshot failed, %s is now in wait state", slog.LevelWarn},
	{"dragonboat", logger.WARNING, "%s had %d LocalTick msgs in one batch", slog.LevelWarn},
	{"dragonboat", logger.WARNING, "dropped an incoming message", slog.LevelWarn},
	{"dragonboat", logger.ERROR, "failed to remove shard %s", slog.LevelError},
	{"transport", logger.WARNING, "deployment id does not match %d vs %d, message dropped", slog.LevelWarn},
	{"transport", logger.WARNING, "binary compatibility version not match %d vs %d", slog.LevelWarn},
	{"transport", logger.ERROR, "header crc check failed", slog.LevelError},
	{"transport", logger.ERROR, "invalid payload checksum", slog.LevelError},
	{"transport", logger.WARNING, "stream snapshot to %s failed", slog.LevelWarn},
	{"rsm", logger.WARNING, "session with client id %d evicted, overloaded", slog.LevelWarn},
	{"rsm", logger.ERROR, "%s snapshotter.Save failed %v", slog.LevelError},
	{"logdb", logger.WARNING, "%s failed to get anything from logreader", slog.LevelWarn},
	{"config", logger.WARNING, "ElectionRTT is not a magnitude larger than HeartbeatRTT", slog.LevelWarn},
	{"dragonboat", logger.CRITICAL, "to field not set, %s", slog.LevelError},
	// A rule applies to its own package only.
	{"transport", logger.WARNING, "%s became candidate", slog.LevelWarn},
}

func TestDragonboatLevels(t *testing.T) {
	for _, c := range dragonboatLines {
		if got := dbLevel(c.pkg, c.level, c.format); got != c.want {
			t.Errorf("[%s] %q logged at %v: got %v, want %v", c.pkg, c.format, c.level, got, c.want)
		}
	}
}

// Every rule matches a line dragonboat logs: a rule with a typo in its
// substring would otherwise leave its line at Warn unnoticed.
func TestDragonboatRulesMatchRealLines(t *testing.T) {
	for _, r := range dbRules {
		matched := false
		for _, c := range dragonboatLines {
			if c.pkg == r.pkg && strings.Contains(c.format, r.substr) {
				matched = true
				break
			}
		}
		if !matched {
			t.Errorf("rule [%s] %q matches none of dragonboat's lines", r.pkg, r.substr)
		}
	}
}

// dbLog skips the rule scan for a line whose default level and dbRuleMax
// are both hidden: that is right only while no rule gives a higher level.
func TestDragonboatRulesStayAtOrBelowRuleMax(t *testing.T) {
	for _, r := range dbRules {
		if r.level > dbRuleMax {
			t.Errorf("rule %q/%q gives %v, above dbRuleMax %v", r.pkg, r.substr, r.level, dbRuleMax)
		}
	}
}

// dragonboat's lines go to the Logger of the first node started in the
// process, never to a later node's (as node's Config.Logger documents).
func TestDragonboatLoggerIsTheFirstNodes(t *testing.T) {
	old := SwapForTest(nil) // as if no node had started yet
	t.Cleanup(func() { SwapForTest(old) })

	first, second := &recorder{}, &recorder{}
	Install(slog.New(first))
	Install(slog.New(second))
	const marker = "a line only this test logs"
	(&dbLog{pkg: "dragonboat"}).Errorf("[%05d:%05d] %s", 3, 2, marker)

	if n := first.count(marker); n != 1 {
		t.Errorf("first node's Logger got the line %d times, want once", n)
	}
	if n := second.count(marker); n != 0 {
		t.Errorf("second node's Logger got the first's dragonboat line %d times, want never", n)
	}
}

// recorder is a slog.Handler that keeps every record.
type recorder struct {
	mu      sync.Mutex
	records []slog.Record
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *recorder) WithGroup(string) slog.Handler            { return r }

func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.records = append(r.records, rec.Clone())
	return nil
}

// count is the number of records whose message contains substr.
func (r *recorder) count(substr string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, rec := range r.records {
		if strings.Contains(rec.Message, substr) {
			n++
		}
	}
	return n
}
