package raftauth

import (
	"testing"

	pb "github.com/lni/dragonboat/v4/raftpb"
)

// FuzzFilter decodes arbitrary bytes as a message batch, as raftnet does,
// passes it through the filter (anonymous and as member "b"), and checks
// that nothing panics and that every message kept obeys the rules whose
// breach crashes dragonboat: a type peers send, addressed to the local
// replica from another, a term within the bound, contiguous appliable
// entries only on Replicate and Propose, and a heartbeat commit within
// what the log holds.
func FuzzFilter(f *testing.F) {
	seed := func(msgs ...pb.Message) {
		b := pb.MessageBatch{Requests: msgs}
		body, err := b.Marshal()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(body)
	}
	seed(msg(pb.Heartbeat), msg(pb.Election))
	r := msg(pb.Replicate)
	r.LogIndex, r.LogTerm = 3, 2
	r.Entries = []pb.Entry{{Index: 4, Term: 5}, encoded("x")}
	seed(r)
	p := msg(pb.Propose)
	p.Entries = []pb.Entry{encoded("ok"), {Type: pb.EncodedEntry, Cmd: []byte{0, 1}}}
	seed(p, msg(pb.LeaderTransfer))
	f.Fuzz(func(t *testing.T, body []byte) {
		var b pb.MessageBatch
		if unmarshal(&b, body) != nil {
			return
		}
		for _, names := range [][]string{nil, {"b"}} {
			fl := newFilter()
			fl.Logs.Started(2, 1, 5, 30, 40)
			c := b
			c.Requests = append([]pb.Message(nil), b.Requests...)
			fl.Batch(names, &c)
			for _, m := range c.Requests {
				if !Network(m.Type) || m.ShardID != 2 || m.To != 1 || m.From == 0 || m.From == 1 {
					t.Fatalf("kept %s shard %d %d->%d", m.Type, m.ShardID, m.From, m.To)
				}
				if names != nil && m.From != 2 {
					t.Fatalf("kept a message of %v from replica %d", names, m.From)
				}
				if !termless(m.Type) && (m.Term == 0 || m.Term > 5+MaxTermJump) {
					t.Fatalf("kept %s of term %d", m.Type, m.Term)
				}
				if m.Type == pb.Heartbeat && m.Commit > 40 {
					t.Fatalf("kept a heartbeat committing %d beyond the log's 40", m.Commit)
				}
				if len(m.Entries) > 0 && m.Type != pb.Replicate && m.Type != pb.Propose {
					t.Fatalf("kept %s with entries", m.Type)
				}
				for i, e := range m.Entries {
					if err := Appliable(&e); err != nil {
						t.Fatalf("kept an entry dragonboat cannot apply: %v", err)
					}
					if m.Type == pb.Replicate && (e.Index != m.LogIndex+uint64(i)+1 || e.Term == 0 || e.Term > m.Term) {
						t.Fatalf("kept a Replicate with entry %d at index %d term %d", i, e.Index, e.Term)
					}
				}
			}
		}
	})
}
