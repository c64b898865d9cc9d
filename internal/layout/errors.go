package layout

import "fmt"

// IdentityError says that the layout lists this peer's name under another
// NodeHostID: the peer's data dir was wiped or replaced, so the replica ids
// the layout gives the name belong to Raft logs that are gone. Started with
// empty logs, those replicas could form a quorum with a lagging member and
// lose committed grants, so the peer must not run them. Its message is
// worded for the operator of a node (it names node.Config fields).
type IdentityError struct {
	Name   string // the peer's name
	Listed string // the NodeHostID the layout lists under Name
	Local  string // the NodeHostID of this peer's data dir
}

func (e *IdentityError) Error() string {
	return fmt.Sprintf("the cluster layout lists peer %s with NodeHostID %s but this data dir has %s: "+
		"the data dir was wiped or replaced; this peer will be admitted as a new peer once the cluster "+
		"has replaced the old one (DeadAfter, default 30s), or start it under a new Name",
		e.Name, e.Listed, e.Local)
}
