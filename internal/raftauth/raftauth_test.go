package raftauth

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/lni/dragonboat/v4/client"
	pb "github.com/lni/dragonboat/v4/raftpb"

	"github.com/lockmesh/lockmesh/internal/authz"
)

// fakeView: this peer ("a") runs replica 1 of shard 2; "b" hosts
// replica 2 and "c" replica 3. Shard 9 is not hosted here.
type fakeView struct {
	proposal func(c authz.Caller, payload []byte) error
}

func (fakeView) Local(shard uint64) (uint64, bool) { return 1, shard == 2 }

func (fakeView) Host(shard, replica uint64) (string, string, bool) {
	if shard != 2 {
		return "", "", false
	}
	switch replica {
	case 1:
		return "a", "nh-a", true
	case 2:
		return "b", "nh-b", true
	case 3:
		return "c", "nh-c", true
	}
	return "", "", false
}

func (v fakeView) Proposal(c authz.Caller, _ uint64, payload []byte) error {
	if v.proposal != nil {
		return v.proposal(c, payload)
	}
	if string(payload) == "forbidden" {
		return fmt.Errorf("%w: nope", authz.ErrForbidden)
	}
	return nil
}

func newFilter() *Filter { return &Filter{View: fakeView{}, Logs: &Logs{}} }

var anonymous authz.Caller

// msg is a well-formed message of type t from replica 2 to replica 1 of
// shard 2.
func msg(t pb.MessageType) pb.Message {
	m := pb.Message{Type: t, ShardID: 2, From: 2, To: 1, Term: 5}
	if termless(t) {
		m.Term = 0
	}
	return m
}

func encoded(payload string) pb.Entry {
	return pb.Entry{Type: pb.EncodedEntry, ClientID: 77, Key: 9, Cmd: append([]byte{0}, payload...)}
}

func configChange(t *testing.T, cc pb.ConfigChange) pb.Entry {
	b, err := cc.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return pb.Entry{Type: pb.ConfigChangeEntry, Cmd: b}
}

func TestRules(t *testing.T) {
	b := []string{"b"}
	tests := []struct {
		rule  string
		names []string
		m     func() pb.Message
		pass  bool
	}{
		// rule 1
		{"1: replicate passes", nil, func() pb.Message { return msg(pb.Replicate) }, true},
		{"1: heartbeat passes", nil, func() pb.Message { return msg(pb.Heartbeat) }, true},
		{"1: vote passes", nil, func() pb.Message { return msg(pb.RequestVote) }, true},
		{"1: prevote passes", nil, func() pb.Message { return msg(pb.RequestPreVote) }, true},
		{"1: read index passes", nil, func() pb.Message { return msg(pb.ReadIndex) }, true},
		{"1: snapshot received passes", nil, func() pb.Message { return msg(pb.SnapshotReceived) }, true},
		{"1: Election", nil, func() pb.Message { return msg(pb.Election) }, false},
		{"1: LeaderHeartbeat", nil, func() pb.Message { return msg(pb.LeaderHeartbeat) }, false},
		{"1: CheckQuorum", nil, func() pb.Message { return msg(pb.CheckQuorum) }, false},
		{"1: BatchedReadIndex", nil, func() pb.Message { return msg(pb.BatchedReadIndex) }, false},
		{"1: LocalTick", nil, func() pb.Message { return msg(pb.LocalTick) }, false},
		{"1: Unreachable", nil, func() pb.Message { return msg(pb.Unreachable) }, false},
		{"1: SnapshotStatus", nil, func() pb.Message { return msg(pb.SnapshotStatus) }, false},
		{"1: ConfigChangeEvent", nil, func() pb.Message { return msg(pb.ConfigChangeEvent) }, false},
		{"1: LogQuery", nil, func() pb.Message { return msg(pb.LogQuery) }, false},
		{"1: InstallSnapshot", nil, func() pb.Message { return msg(pb.InstallSnapshot) }, false},
		{"1: Quiesce", nil, func() pb.Message { return msg(pb.Quiesce) }, false},
		{"1: unknown type", nil, func() pb.Message { return msg(pb.MessageType(99)) }, false},
		// rule 2
		{"2: not hosted shard", nil, func() pb.Message { m := msg(pb.Heartbeat); m.ShardID = 9; return m }, false},
		{"2: To 0", nil, func() pb.Message { m := msg(pb.Heartbeat); m.To = 0; return m }, false},
		{"2: To another replica", nil, func() pb.Message { m := msg(pb.Heartbeat); m.To = 2; return m }, false},
		{"2: From 0", nil, func() pb.Message { m := msg(pb.Heartbeat); m.From = 0; return m }, false},
		{"2: From itself", nil, func() pb.Message { m := msg(pb.Heartbeat); m.From = 1; return m }, false},
		{"2: From unknown", nil, func() pb.Message { m := msg(pb.Heartbeat); m.From = 7; return m }, false},
		{"2: sender's own replica", b, func() pb.Message { return msg(pb.Heartbeat) }, true},
		{"2: another member's replica", b, func() pb.Message { m := msg(pb.Heartbeat); m.From = 3; return m }, false},
		{"2: a non-member", []string{"mallory"}, func() pb.Message { return msg(pb.Heartbeat) }, false},
		// rule 3
		{"3: term 0 on a vote", nil, func() pb.Message { m := msg(pb.RequestPreVote); m.Term = 0; return m }, false},
		{"3: term 0 on a heartbeat", nil, func() pb.Message { m := msg(pb.Heartbeat); m.Term = 0; return m }, false},
		{"3: term beyond MaxTerm", nil, func() pb.Message { m := msg(pb.Heartbeat); m.Term = MaxTerm + 1; return m }, false},
		{"3: term on a request", nil, func() pb.Message { m := msg(pb.ReadIndex); m.Term = 3; return m }, false},
		{"3: huge log index", nil, func() pb.Message { m := msg(pb.RequestVote); m.LogIndex = 1 << 63; return m }, false},
		// rule 4
		{"4: entries on a heartbeat", nil, func() pb.Message {
			m := msg(pb.Heartbeat)
			m.Entries = []pb.Entry{{Index: 1, Term: 1}}
			return m
		}, false},
		{"4: a snapshot on a replicate", nil, func() pb.Message { m := msg(pb.Replicate); m.Snapshot.Index = 4; return m }, false},
		// rule 5
		{"5: contiguous entries", nil, func() pb.Message {
			m := msg(pb.Replicate)
			m.LogIndex, m.LogTerm = 10, 4
			m.Entries = []pb.Entry{{Index: 11, Term: 4}, {Index: 12, Term: 5, Type: pb.EncodedEntry, ClientID: 3, Key: 8, Cmd: []byte{0, 1}}}
			return m
		}, true},
		{"5: a gap", nil, func() pb.Message {
			m := msg(pb.Replicate)
			m.LogIndex, m.LogTerm = 10, 4
			m.Entries = []pb.Entry{{Index: 11, Term: 4}, {Index: 13, Term: 4}}
			return m
		}, false},
		{"5: entries from index 1 after 10", nil, func() pb.Message {
			m := msg(pb.Replicate)
			m.LogIndex, m.LogTerm = 10, 4
			m.Entries = []pb.Entry{{Index: 1, Term: 4}}
			return m
		}, false},
		{"5: term going down", nil, func() pb.Message {
			m := msg(pb.Replicate)
			m.LogIndex, m.LogTerm = 10, 4
			m.Entries = []pb.Entry{{Index: 11, Term: 5}, {Index: 12, Term: 4}}
			return m
		}, false},
		{"5: after an index of term 0", nil, func() pb.Message {
			m := msg(pb.Replicate)
			m.LogIndex, m.Commit = 24, 24
			return m
		}, false},
		{"5: first entries", nil, func() pb.Message {
			m := msg(pb.Replicate)
			m.Entries = []pb.Entry{{Index: 1, Term: 2}, {Index: 2, Term: 5}}
			return m
		}, true},
		{"5: an entry of term 0", nil, func() pb.Message {
			m := msg(pb.Replicate)
			m.Entries = []pb.Entry{{Index: 1, Term: 0}}
			return m
		}, false},
		{"5: entry term above the message's", nil, func() pb.Message {
			m := msg(pb.Replicate)
			m.Entries = []pb.Entry{{Index: 1, Term: 6}}
			return m
		}, false},
		{"5: payload without a session", nil, func() pb.Message {
			m := msg(pb.Replicate)
			m.Entries = []pb.Entry{{Index: 1, Term: 5, Cmd: []byte("x")}}
			return m
		}, false},
		{"5: compressed entry", nil, func() pb.Message {
			m := msg(pb.Replicate)
			m.Entries = []pb.Entry{{Index: 1, Term: 5, Type: pb.EncodedEntry, ClientID: 3, Cmd: []byte{1 << 1, 1}}}
			return m
		}, false},
		// rule 8
		{"8: transfer to a replica", nil, func() pb.Message { m := msg(pb.LeaderTransfer); m.Hint = 3; return m }, true},
		{"8: transfer to nobody", nil, func() pb.Message { return msg(pb.LeaderTransfer) }, false},
		{"8: transfer to a stranger", nil, func() pb.Message { m := msg(pb.LeaderTransfer); m.Hint = 8; return m }, false},
		// rule 9
		{"9: authorized proposal", b, func() pb.Message {
			m := msg(pb.Propose)
			m.Entries = []pb.Entry{encoded("ok")}
			return m
		}, true},
		{"9: refused proposal", b, func() pb.Message {
			m := msg(pb.Propose)
			m.Entries = []pb.Entry{encoded("ok"), encoded("forbidden")}
			return m
		}, false},
		{"9: empty proposal", nil, func() pb.Message { return msg(pb.Propose) }, false},
		{"9: client 0 with a payload", nil, func() pb.Message {
			m := msg(pb.Propose)
			m.Entries = []pb.Entry{{Type: pb.EncodedEntry, Cmd: []byte{0, 'x'}}}
			return m
		}, false},
		{"9: application entry with a payload", nil, func() pb.Message {
			m := msg(pb.Propose)
			m.Entries = []pb.Entry{{ClientID: 4, Cmd: []byte("x")}}
			return m
		}, false},
		{"9: registered session", nil, func() pb.Message {
			m := msg(pb.Propose)
			e := encoded("ok")
			e.SeriesID = client.SeriesIDFirstProposal
			m.Entries = []pb.Entry{e}
			return m
		}, false},
		{"9: proposal key 0", nil, func() pb.Message {
			m := msg(pb.Propose)
			e := encoded("ok")
			e.Key = 0
			m.Entries = []pb.Entry{e}
			return m
		}, false},
		{"9: indexed proposal", nil, func() pb.Message {
			m := msg(pb.Propose)
			e := encoded("ok")
			e.Index = 3
			m.Entries = []pb.Entry{e}
			return m
		}, false},
		{"9: membership change", nil, func() pb.Message {
			m := msg(pb.Propose)
			m.Entries = []pb.Entry{configChange(t, pb.ConfigChange{Type: pb.AddNode, ReplicaID: 4, Address: "nh"})}
			return m
		}, true},
		{"9: witness", nil, func() pb.Message {
			m := msg(pb.Propose)
			m.Entries = []pb.Entry{configChange(t, pb.ConfigChange{Type: pb.AddWitness, ReplicaID: 4})}
			return m
		}, false},
		{"9: membership change that does not decode", nil, func() pb.Message {
			m := msg(pb.Propose)
			m.Entries = []pb.Entry{{Type: pb.ConfigChangeEntry, Cmd: []byte{0xff, 0xff, 0xff}}}
			return m
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.rule, func(t *testing.T) {
			m := tt.m()
			err := newFilter().Message(authz.Caller{Names: tt.names}, &m)
			if tt.pass && err != nil {
				t.Fatalf("refused: %v", err)
			}
			if !tt.pass {
				if err == nil {
					t.Fatal("passed")
				}
				if !errors.Is(err, ErrRefused) && !errors.Is(err, authz.ErrForbidden) {
					t.Fatalf("refusal %v wraps neither ErrRefused nor authz.ErrForbidden", err)
				}
			}
		})
	}
}

// TestProposalPayload: the view sees a proposal's payload without
// dragonboat's header byte, and the sender as the connection named it.
func TestProposalPayload(t *testing.T) {
	var got []string
	f := &Filter{Logs: &Logs{}, View: fakeView{proposal: func(c authz.Caller, p []byte) error {
		got = append(got, fmt.Sprintf("%v:%s", c.Names, p))
		return nil
	}}}
	m := msg(pb.Propose)
	m.Entries = []pb.Entry{encoded("one"), encoded("two")}
	if err := f.Message(authz.Caller{Names: []string{"b"}}, &m); err != nil {
		t.Fatal(err)
	}
	if want := "[b]:one [b]:two"; strings.Join(got, " ") != want {
		t.Fatalf("view saw %q, want %q", got, want)
	}
}

// TestBatchKeepsWhatPasses: a batch loses only its refused messages, in
// order, and counts them.
func TestBatchKeepsWhatPasses(t *testing.T) {
	f := newFilter()
	b := pb.MessageBatch{Requests: []pb.Message{msg(pb.Heartbeat), msg(pb.Election), msg(pb.RequestVote), msg(pb.LocalTick)}}
	errs := f.Batch(nil, &b)
	if len(errs) != 2 || f.Refused() != 2 {
		t.Fatalf("%d refusals, %d counted; want 2", len(errs), f.Refused())
	}
	if len(b.Requests) != 2 || b.Requests[0].Type != pb.Heartbeat || b.Requests[1].Type != pb.RequestVote {
		t.Fatalf("kept %v", b.Requests)
	}
}

// Rule 10: a batch's source address is kept only when it is the
// NodeHostID of every message's sender replica.
func TestSourceAddress(t *testing.T) {
	for _, tt := range []struct {
		source string
		from   []uint64
		keep   bool
	}{
		{"nh-b", []uint64{2}, true},
		{"nh-b", []uint64{2, 2}, true},
		{"", []uint64{2}, true},
		{"nh-c", []uint64{2}, false},
		{"nh-b", []uint64{2, 3}, false},
		{"127.0.0.1:1", []uint64{2}, false},
	} {
		b := pb.MessageBatch{SourceAddress: tt.source}
		for _, from := range tt.from {
			m := msg(pb.Heartbeat)
			m.From = from
			b.Requests = append(b.Requests, m)
		}
		errs := newFilter().Batch(nil, &b)
		if kept := b.SourceAddress == tt.source; kept != tt.keep || len(b.Requests) != len(tt.from) || (len(errs) == 0) != tt.keep {
			t.Errorf("source %q from %v: source now %q, %d messages, refusals %v; want kept %v", tt.source, tt.from, b.SourceAddress, len(b.Requests), errs, tt.keep)
		}
	}
}

// A correct peer with a stale view (a shard not started here yet, a
// moved replica, a replica this layout does not list yet) is counted but
// not reported: it is no sign of a hostile sender.
func TestMisroutedCountedNotReported(t *testing.T) {
	f := newFilter()
	notHere, moved, unlisted := msg(pb.Heartbeat), msg(pb.Heartbeat), msg(pb.Heartbeat)
	notHere.ShardID, moved.To, unlisted.From = 9, 5, 7
	b := pb.MessageBatch{Requests: []pb.Message{notHere, moved, unlisted}}
	if errs := f.Batch(nil, &b); len(errs) != 0 || f.Refused() != 3 || len(b.Requests) != 0 {
		t.Fatalf("reported %v, counted %d, kept %d; want none reported, 3 counted, none kept", errs, f.Refused(), len(b.Requests))
	}
	other := msg(pb.Heartbeat)
	other.From = 3
	b = pb.MessageBatch{Requests: []pb.Message{other}}
	if errs := f.Batch([]string{"b"}, &b); len(errs) != 1 || errors.Is(errs[0], ErrMisrouted) {
		t.Fatalf("a member claiming another's replica: %v, want one refusal reported", errs)
	}
}

// TestChunk: a snapshot chunk follows rule 2.
func TestChunk(t *testing.T) {
	for _, tt := range []struct {
		names []string
		c     pb.Chunk
		pass  bool
	}{
		{nil, pb.Chunk{ShardID: 2, ReplicaID: 1, From: 2}, true},
		{[]string{"b"}, pb.Chunk{ShardID: 2, ReplicaID: 1, From: 2}, true},
		{[]string{"c"}, pb.Chunk{ShardID: 2, ReplicaID: 1, From: 2}, false},
		{nil, pb.Chunk{ShardID: 2, ReplicaID: 3, From: 2}, false},
		{nil, pb.Chunk{ShardID: 9, ReplicaID: 1, From: 2}, false},
		{nil, pb.Chunk{ShardID: 2, ReplicaID: 1, From: 9}, false},
	} {
		if err := newFilter().Chunk(tt.names, &tt.c); (err == nil) != tt.pass {
			t.Errorf("chunk %+v from %v: %v, want pass %v", tt.c, tt.names, err, tt.pass)
		}
	}
}

// BenchmarkFilterBatch is the filter's cost for a batch as a loaded
// leader sends it: a Replicate of 8 entries, a heartbeat and an
// acknowledgement.
func BenchmarkFilterBatch(b *testing.B) {
	f := newFilter()
	f.Logs.Started(2, 1, 5, 30, 40)
	rep := msg(pb.Replicate)
	rep.LogIndex, rep.LogTerm = 40, 5
	for i := range 8 {
		e := encoded("0123456789abcdef0123456789abcdef")
		e.Index, e.Term = 41+uint64(i), 5
		rep.Entries = append(rep.Entries, e)
	}
	hb := msg(pb.Heartbeat)
	hb.Commit = 40
	ack := msg(pb.ReplicateResp)
	ack.LogIndex = 40
	msgs := []pb.Message{rep, hb, ack}
	batch := pb.MessageBatch{Requests: make([]pb.Message, 3)}
	b.ReportAllocs()
	for b.Loop() {
		batch.Requests = batch.Requests[:3]
		copy(batch.Requests, msgs)
		if errs := f.Batch(nil, &batch); len(errs) > 0 {
			b.Fatal(errs)
		}
	}
}
