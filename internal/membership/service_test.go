package membership

import (
	"bytes"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// TestWireFormat pins the membership messages to the encoding peers of
// earlier releases send and read (node's statusResp, configChangeReq,
// membershipResp, shardReq and transferReq, copied here): a rolling
// upgrade runs both.
func TestWireFormat(t *testing.T) {
	type statusResp struct {
		Replicas map[uint64]uint64 `msgpack:"r"`
		Leaders  map[uint64]uint64 `msgpack:"l"`
		Leading  []uint64          `msgpack:"x"`
		Level    uint8             `msgpack:"v,omitempty"`
	}
	type configChangeReq struct {
		Shard      uint64 `msgpack:"s"`
		Add        bool   `msgpack:"a"`
		Replica    uint64 `msgpack:"r"`
		NodeHostID string `msgpack:"h"`
	}
	type membershipResp struct {
		Members []uint64 `msgpack:"m"`
		Removed []uint64 `msgpack:"r"`
	}
	type shardReq struct {
		Shard uint64 `msgpack:"s"`
	}
	type transferReq struct {
		Shard  uint64 `msgpack:"s"`
		Target uint64 `msgpack:"t"`
	}
	for _, tc := range []struct {
		name     string
		now, was any
	}{
		{"status", PeerStatus{Replicas: map[uint64]uint64{1: 4}, Leaders: map[uint64]uint64{1: 5}, Leading: []uint64{2}, Level: 2},
			statusResp{Replicas: map[uint64]uint64{1: 4}, Leaders: map[uint64]uint64{1: 5}, Leading: []uint64{2}, Level: 2}},
		{"status of a release before levels", PeerStatus{}, statusResp{}},
		{"config change", MembershipChange{Shard: 3, Add: true, Replica: 9, NodeHostID: "nh"},
			configChangeReq{Shard: 3, Add: true, Replica: 9, NodeHostID: "nh"}},
		{"membership", Membership{Members: []uint64{1, 2}, Removed: []uint64{3}},
			membershipResp{Members: []uint64{1, 2}, Removed: []uint64{3}}},
		{"shard", ShardRequest{Shard: 2}, shardReq{Shard: 2}},
		{"transfer", TransferRequest{Shard: 2, Target: 7}, transferReq{Shard: 2, Target: 7}},
	} {
		now, err := encode(tc.now)
		if err != nil {
			t.Fatal(err)
		}
		was, err := msgpack.Marshal(tc.was)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(now, was) {
			t.Errorf("%s: encodes as %x, earlier releases as %x", tc.name, now, was)
		}
	}
}
