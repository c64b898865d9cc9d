// Package raftauth decides which Raft messages that arrive at a peer's
// Raft port reach dragonboat. dragonboat trusts every message it is
// given: it panics, in step and apply workers no recover reaches, on
// messages it only makes locally and on entries it cannot apply, and it
// commits whatever a Propose carries. So every message is checked where
// it is accepted, as RPC requests are (internal/authz), before dragonboat
// sees it; the rules are pure functions of the sender, the message and
// what the accepting peer knows (View, Logs), tested without a cluster.
//
// The sender is the set of names its verified TLS certificate carries
// (authz.Caller); without RaftTLS it is anonymous, and every rule that
// needs no identity still applies, so that no message from anyone crashes
// the peer or writes an entry dragonboat cannot apply.
//
// The rules, for each message of a batch (a refused message is dropped,
// the others go on):
//
//  1. Only the types peers send each other pass (Network). Election,
//     LeaderHeartbeat, CheckQuorum, BatchedReadIndex, LocalTick,
//     Unreachable, SnapshotStatus, ConfigChangeEvent, LogQuery and
//     InstallSnapshot are made by dragonboat inside a peer, and it panics
//     on several of them from the network; Quiesce, RateLimit, Ping and
//     Pong belong to features lockmesh does not enable.
//  2. Its To is this peer's replica of its ShardID, and its From is
//     another replica the layout gives that shard; with identity, the
//     layout gives From to the sender's name.
//  3. Terms: a request (Propose, ReadIndex, LeaderTransfer) and a
//     SnapshotReceived carry term 0, as dragonboat sends them; every
//     other message a term from 1 to MaxTermJump above the term this
//     replica last wrote (Logs.TermBound), and never above MaxTerm.
//     Term 0 on a vote request panics dragonboat; a term near 2^64
//     overflows at the next election. A replica that has written no term
//     yet (a new one) takes any term up to MaxTerm. With PreVote, a
//     replica's term moves by one per election it takes part in, so no
//     peer is MaxTermJump elections ahead of another, while a sender that
//     forges terms needs 2^43 accepted messages to bring a shard to
//     MaxTerm. Indexes (LogTerm, LogIndex, Commit) are at most MaxIndex.
//  4. Only Replicate and Propose carry entries, and no message carries a
//     snapshot (snapshots travel as chunks).
//  5. A Replicate follows an entry of a term (LogTerm 0 only before the
//     first entry: dragonboat reads the term of an index beyond its log
//     as 0, and would append or commit beyond its end), and its entries
//     are contiguous from LogIndex+1, with terms that do not decrease,
//     from LogTerm (at least 1) to at most the message's term,
//     and each is one dragonboat can apply (Appliable): dragonboat's
//     conflict search assumes contiguous entries and panics on a
//     conflict it takes for a committed entry.
//  6. A Heartbeat's Commit is lowered to what this replica's log is known
//     to hold (Logs.CommitBound): dragonboat panics on a commit beyond
//     its log. A leader never sends more, so this changes only forgeries.
//  7. A ReplicateResp acknowledges at most what this replica has written
//     or sent (Logs.AckBound): an acknowledgement beyond the log makes
//     the leader read entries it does not have.
//  8. A LeaderTransfer names a replica of the shard as its target.
//  9. A Propose carries only entries lockmesh makes: payloads its state
//     machines read, which the sender may propose by the same rules as a
//     forwarded RPC proposal (View.Proposal), or a membership change.
//  10. A batch's SourceAddress, which dragonboat records as the address
//     of the replicas its messages come from, is the NodeHostID the
//     layout gives each of them, or is cleared: nobody redirects the
//     Raft traffic of a replica by naming another address.
//
// A snapshot chunk passes when rule 2 holds for its ShardID, ReplicaID
// (its To) and From.
//
// What this cannot do: a member that owns a replica may still lie in the
// Raft protocol itself (Raft tolerates crashes, not lies), as may any
// local process on a plaintext loopback cluster, which has no identity to
// check. Such a sender can disrupt the shards it replicates; these rules
// keep it from crashing the peer through the message shapes above and
// from proposing what authorization refuses.
package raftauth

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/lni/dragonboat/v4/client"
	pb "github.com/lni/dragonboat/v4/raftpb"

	"github.com/lockmesh/lockmesh/internal/authz"
)

// ErrRefused is wrapped by every refusal.
var ErrRefused = errors.New("raft message refused")

// ErrMisrouted is wrapped, with ErrRefused, by the refusals of messages
// a correct peer sends from a view of the cluster older or newer than
// this peer's: for a shard whose replica here has not started (a restart)
// or has moved, or from a replica this peer's copy of the layout does not
// list yet. They are dropped as dragonboat drops messages for replicas it
// does not run, and counted, but are no sign of a hostile sender.
var ErrMisrouted = errors.New("not for a replica here")

// Bounds of rule 3.
const (
	MaxTerm     = 1 << 63
	MaxTermJump = 1 << 20
	MaxIndex    = 1 << 62
)

// View is what the accepting peer knows when it decides. Its methods are
// called on the goroutine of the connection a message arrived on,
// concurrently with each other, and must not block.
type View interface {
	// Local returns the id of this peer's running replica of shard.
	Local(shard uint64) (replica uint64, ok bool)
	// Host returns the name and NodeHostID of the member the layout
	// places replica of shard on.
	Host(shard, replica uint64) (name, nodeHostID string, ok bool)
	// Proposal decides whether c may propose payload, the command of one
	// entry (dragonboat's encoding header stripped), on shard: it reads
	// as this peer's state machine would read it, and authorization
	// accepts it from c.
	Proposal(c authz.Caller, shard uint64, payload []byte) error
}

func refused(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrRefused, fmt.Sprintf(format, args...))
}

func misrouted(format string, args ...any) error {
	return fmt.Errorf("%w, %w: %s", ErrRefused, ErrMisrouted, fmt.Sprintf(format, args...))
}

// Network reports whether peers send messages of type t to each other
// (rule 1).
func Network(t pb.MessageType) bool {
	switch t {
	case pb.Replicate, pb.ReplicateResp,
		pb.RequestVote, pb.RequestVoteResp, pb.RequestPreVote, pb.RequestPreVoteResp,
		pb.Heartbeat, pb.HeartbeatResp,
		pb.ReadIndex, pb.ReadIndexResp,
		pb.TimeoutNow, pb.LeaderTransfer, pb.Propose, pb.SnapshotReceived, pb.NoOP:
		return true
	}
	return false
}

// termless reports whether dragonboat sends messages of type t with term
// 0 (rule 3).
func termless(t pb.MessageType) bool {
	return t == pb.Propose || t == pb.ReadIndex || t == pb.LeaderTransfer || t == pb.SnapshotReceived
}

// Filter applies the rules with what a peer knows. It is the Raft
// transport's raftnet.Config.Gate.
type Filter struct {
	View View
	Logs *Logs

	refused atomic.Uint64 // messages and chunks refused so far
}

// Refused is the number of messages and chunks f has refused.
func (f *Filter) Refused() uint64 { return f.refused.Load() }

// Sent records an outbound batch in f.Logs.
func (f *Filter) Sent(b *pb.MessageBatch) { f.Logs.Sent(b) }

// Batch keeps in b.Requests the messages that pass, in their order (a
// Heartbeat's commit possibly lowered, rule 6), clears a SourceAddress
// that rule 10 refuses, and returns the refusal of each message dropped,
// but for misrouted ones (ErrMisrouted), which it only counts, and of the
// source address. names are the sender's verified certificate names, nil
// without TLS.
func (f *Filter) Batch(names []string, b *pb.MessageBatch) []error {
	c := authz.Caller{Names: names}
	var errs []error
	kept := b.Requests[:0]
	for i := range b.Requests {
		m := b.Requests[i]
		if err := f.Message(c, &m); err != nil {
			f.refused.Add(1)
			if !errors.Is(err, ErrMisrouted) {
				errs = append(errs, err)
			}
			continue
		}
		kept = append(kept, m)
	}
	clear(b.Requests[len(kept):])
	b.Requests = kept
	if err := f.source(b); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// source applies rule 10: dragonboat records a batch's SourceAddress as
// the address of every replica its messages come from, so it must be the
// NodeHostID the layout gives each of them; if not, it is cleared (the
// messages still pass: their replicas' addresses come from the shard's
// membership).
func (f *Filter) source(b *pb.MessageBatch) error {
	if b.SourceAddress == "" {
		return nil
	}
	for i := range b.Requests {
		m := &b.Requests[i]
		if _, id, ok := f.View.Host(m.ShardID, m.From); !ok || id != b.SourceAddress {
			src := b.SourceAddress
			b.SourceAddress = ""
			return refused("batch from %q carrying a message of replica %d of shard %d, which is %q's: its source address is ignored", src, m.From, m.ShardID, id)
		}
	}
	return nil
}

// Message applies the rules to m from c, lowering a Heartbeat's commit
// (rule 6) and noting a Replicate that passes in f.Logs.
func (f *Filter) Message(c authz.Caller, m *pb.Message) error {
	if !Network(m.Type) {
		return refused("%s is not a message peers send each other", m.Type)
	}
	if err := f.route(c, m.ShardID, m.To, m.From); err != nil {
		return fmt.Errorf("%s: %w", m.Type, err)
	}
	if termless(m.Type) {
		if m.Term != 0 {
			return refused("%s with term %d: dragonboat sends it with none", m.Type, m.Term)
		}
	} else if b := f.Logs.TermBound(m.ShardID, m.To); m.Term == 0 || m.Term > b {
		return refused("%s with term %d, outside [1, %d]", m.Type, m.Term, b)
	}
	if m.LogTerm > MaxTerm || m.LogIndex > MaxIndex || m.Commit > MaxIndex {
		return refused("%s with log term %d, log index %d, commit %d: above %d", m.Type, m.LogTerm, m.LogIndex, m.Commit, uint64(MaxIndex))
	}
	if len(m.Entries) > 0 && m.Type != pb.Replicate && m.Type != pb.Propose {
		return refused("%s carrying %d entries", m.Type, len(m.Entries))
	}
	if !pb.IsEmptySnapshot(m.Snapshot) || m.Snapshot.Index != 0 {
		return refused("%s carrying a snapshot", m.Type)
	}
	switch m.Type {
	case pb.Replicate:
		if err := replicated(m); err != nil {
			return err
		}
		f.Logs.passed(m.ShardID, m.To, m)
	case pb.Heartbeat:
		if b := f.Logs.CommitBound(m.ShardID, m.To); m.Commit > b {
			m.Commit = b
		}
	case pb.ReplicateResp:
		if b := f.Logs.AckBound(m.ShardID, m.To); !m.Reject && m.LogIndex > b {
			return refused("ReplicateResp acknowledging index %d; this replica's log ends at %d", m.LogIndex, b)
		}
	case pb.LeaderTransfer:
		if _, _, ok := f.View.Host(m.ShardID, m.Hint); !ok || m.Hint == 0 {
			return refused("LeaderTransfer to replica %d, which the layout does not give shard %d", m.Hint, m.ShardID)
		}
	case pb.Propose:
		return f.proposed(c, m)
	}
	return nil
}

// Chunk applies rule 2 to a snapshot chunk from the sender of names.
func (f *Filter) Chunk(names []string, ch *pb.Chunk) error {
	if err := f.route(authz.Caller{Names: names}, ch.ShardID, ch.ReplicaID, ch.From); err != nil {
		f.refused.Add(1)
		return fmt.Errorf("snapshot chunk: %w", err)
	}
	return nil
}

// route applies rule 2.
func (f *Filter) route(c authz.Caller, shard, to, from uint64) error {
	if to == 0 || from == 0 || from == to {
		return refused("from replica %d of shard %d, to %d", from, shard, to)
	}
	local, ok := f.View.Local(shard)
	if !ok {
		return misrouted("this peer runs no replica of shard %d", shard)
	}
	if to != local {
		return misrouted("addressed to replica %d of shard %d; this peer's is %d", to, shard, local)
	}
	host, _, ok := f.View.Host(shard, from)
	if !ok {
		return misrouted("from replica %d, which this peer's layout does not give shard %d", from, shard)
	}
	if !c.Anonymous() && !c.Is(host) {
		return refused("from replica %d of shard %d, which is %q's, not %s's", from, shard, host, c)
	}
	return nil
}

// replicated applies rule 5 to a Replicate.
func replicated(m *pb.Message) error {
	if m.LogIndex > 0 && m.LogTerm == 0 {
		// dragonboat reads the term of an index beyond its log as 0, so
		// this would match any log and append or commit past its end.
		return refused("Replicate after index %d of term 0", m.LogIndex)
	}
	term := max(m.LogTerm, 1)
	for i := range m.Entries {
		e := &m.Entries[i]
		if want := m.LogIndex + uint64(i) + 1; e.Index != want {
			return refused("Replicate after index %d: entry %d has index %d, want %d", m.LogIndex, i, e.Index, want)
		}
		if e.Term < term || e.Term > m.Term {
			return refused("Replicate of term %d: entry %d has term %d after term %d", m.Term, e.Index, e.Term, term)
		}
		term = e.Term
		if err := Appliable(e); err != nil {
			return fmt.Errorf("Replicate: entry %d: %w", e.Index, err)
		}
	}
	return nil
}

// proposed applies rule 9 to a Propose.
func (f *Filter) proposed(c authz.Caller, m *pb.Message) error {
	if len(m.Entries) == 0 {
		return refused("Propose without entries")
	}
	for i := range m.Entries {
		e := &m.Entries[i]
		if e.Index != 0 || e.Term != 0 {
			return refused("Propose: entry %d has index %d and term %d; a proposal's are set by the leader", i, e.Index, e.Term)
		}
		if err := Appliable(e); err != nil {
			return fmt.Errorf("Propose: entry %d: %w", i, err)
		}
		switch {
		case e.Type == pb.ConfigChangeEntry:
			// Only a member's replica proposes one (rule 2), for a change
			// the RPC that asked for it authorized.
		case e.Type == pb.EncodedEntry && e.ClientID != client.NotSessionManagedClientID:
			if err := f.View.Proposal(c, m.ShardID, e.Cmd[1:]); err != nil {
				return fmt.Errorf("Propose on shard %d: %w", m.ShardID, err)
			}
		default:
			return refused("Propose: entry %d of type %s from client %d: lockmesh proposes none", i, e.Type, e.ClientID)
		}
	}
	return nil
}

// Appliable reports why dragonboat could not apply e without panicking,
// if it could not: an application entry without a client session must be
// empty (the leader's blank entry), one with a session must use a no-op
// session (lockmesh registers none) and carry a proposal key; an encoded entry has dragonboat's
// uncompressed version-0 header (lockmesh compresses nothing); a
// membership change decodes and adds or removes a voting replica.
func Appliable(e *pb.Entry) error {
	switch e.Type {
	case pb.ApplicationEntry:
		if e.ClientID == client.NotSessionManagedClientID && len(e.Cmd) > 0 {
			return refused("application entry of %d bytes without a client session", len(e.Cmd))
		}
	case pb.EncodedEntry:
		if len(e.Cmd) == 0 || e.Cmd[0] != 0 {
			return refused("encoded entry without dragonboat's uncompressed version-0 header")
		}
		if e.ClientID == client.NotSessionManagedClientID {
			return refused("encoded entry of %d bytes without a client session", len(e.Cmd))
		}
	case pb.ConfigChangeEntry:
		var cc pb.ConfigChange
		if err := unmarshal(&cc, e.Cmd); err != nil {
			return refused("membership change that does not decode: %v", err)
		}
		if (cc.Type != pb.AddNode && cc.Type != pb.RemoveNode) || cc.ReplicaID == 0 {
			return refused("membership change %s of replica %d: lockmesh makes only AddNode and RemoveNode of a replica", cc.Type, cc.ReplicaID)
		}
		return nil
	default:
		return refused("entry of type %s", e.Type)
	}
	if e.ClientID != client.NotSessionManagedClientID {
		if e.SeriesID != client.NoOPSeriesID {
			return refused("entry of client %d, series %d: lockmesh proposes only through no-op sessions", e.ClientID, e.SeriesID)
		}
		if e.Key == 0 {
			// dragonboat's apply panics ("key is 0") on it.
			return refused("entry of client %d with proposal key 0", e.ClientID)
		}
	}
	return nil
}

// unmarshal decodes b into m, turning a panic of the generated decoder
// into an error.
func unmarshal(m interface{ Unmarshal([]byte) error }, b []byte) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("decoder panicked: %v", r)
		}
	}()
	return m.Unmarshal(b)
}
