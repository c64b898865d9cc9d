// Package replica holds the state machines lockmesh's replicas run under
// dragonboat: [Lock], the replica of a lock shard, which adapts
// lockfsm.State to dragonboat's IStateMachine, and [Meta], the replica of
// the meta shard, which holds the cluster's layout. Both fail-stop through
// a [Halter] at the first entry or snapshot they cannot read, rather than
// skip it and diverge from replicas that apply it.
//
// It reaches the rest of the peer only through what node hands it in a
// [LockConfig] and a [Halter] (the grant callback, the formats the
// cluster's feature level writes and the peer reads, the halt callback),
// so every rule here is tested without a cluster. node creates one state
// machine per replica it starts and reads it with a [Query] or a
// [StateReader].
package replica
