// Package layout is the cluster layout of lockmesh as pure code: which
// peers host which replicas of which shards, how a key picks its shard,
// and the controller's planning (the layout to aim for, the next replica
// move, the next leadership move).
//
// A [Placement] is agreed at bootstrap, replicated in the meta shard and
// cached in each peer's data dir; [Encode] and [Decode] are its one wire
// and disk format. A Placement is a value: a change is made on a copy from
// [Placement.Next] and proposed as the next epoch.
//
// Nothing here does I/O, reads a clock or starts a goroutine, and every
// result depends only on the arguments, never on map iteration order, so
// every peer that plans from the same layout plans the same thing. Package
// node asks peers for status, proposes layouts and changes Raft
// membership; this package only decides.
package layout
