package lockfsm

import (
	"fmt"
)

// All-or-nothing groups of acquires (Command.Group): granted whole in one
// entry, refused whole, or queued whole at the tails of their keys' queues.

// groupReady reports whether every attempt of sess's group (first, size)
// waits at the head of its key's queue and can be granted there.
func (s *State) groupReady(sess *session, first uint64, size uint16) bool {
	for req := first; req < first+uint64(size); req++ {
		at := sess.reqs[req]
		if at == nil || at.state != ReqWaiting {
			return false
		}
		k := s.keys[at.key]
		if w := k.waiters(); w[0].session != sess.id || w[0].req != req || !s.canGrant(k, at) {
			return false
		}
	}
	return true
}

// acquireGroup applies the group of Acquires that starts at cmds[0] and
// writes their results; it returns how many commands it consumed. The
// group is cmds[0] and the commands after it that continue it (same
// Session and Group, the next Req, an Acquire), up to Group of them; if
// fewer continue it, or they are not all new and valid, every one gets
// the refusal and nothing changes. A group is granted whole in this entry
// when every key is free for it, else refused whole (Wait false), else
// queued whole, each attempt at the tail of its key's queue; it is then
// granted when all its attempts stand at their queues' heads and can be
// granted there (handOff), in one entry.
func (a *applier) acquireGroup(cmds []Command, results []Result) int {
	first := &cmds[0]
	n := 1
	for n < len(cmds) && n < int(first.Group) {
		c := &cmds[n]
		if c.Op != OpAcquire || c.Session != first.Session || c.Group != first.Group || c.Req != first.Req+uint64(n) {
			break
		}
		n++
	}
	refuse := func(r Result) int {
		for i := range n {
			results[i] = r
		}
		return n
	}
	switch {
	case first.Group < 2 || first.Group > MaxGroup:
		return refuse(invalid(fmt.Sprintf("Acquire: a group of %d; groups hold 2 to %d acquires", first.Group, MaxGroup)))
	case n < int(first.Group):
		return refuse(invalid(fmt.Sprintf("Acquire: group of %d at request %d has only %d acquires in its entry", first.Group, first.Req, n)))
	case first.Req > first.Req+uint64(n-1):
		return refuse(invalid("Acquire: group request ids overflow"))
	}
	sess := a.s.sessions[first.Session]
	if sess == nil {
		return refuse(Result{Status: StatusNoSession})
	}
	if first.Ack > sess.ack {
		sess.ack = first.Ack
		sess.prune()
	}
	group := cmds[:n]
	if sess.reqs[first.Req] != nil {
		// A retry: every attempt answers from its record.
		for i := range group {
			at := sess.reqs[group[i].Req]
			if at == nil || at.size != first.Group || at.first(group[i].Req) != first.Req {
				results[i] = invalid(fmt.Sprintf("Acquire: request id %d does not continue the group at %d as recorded", group[i].Req, first.Req))
				continue
			}
			results[i] = repeat(at, &group[i])
		}
		return n
	}
	keys := make([]*lockKey, n)
	for i := range group {
		c := &group[i]
		if c.Wait != first.Wait {
			return refuse(invalid("Acquire: the acquires of a group must all wait or all not"))
		}
		if err := ValidateKey(c.Key); err != nil {
			return refuse(invalid("Acquire: " + err.Error()))
		}
		if c.Req == 0 {
			return refuse(invalid("Acquire: request id must be > 0"))
		}
		if len(c.Value) > MaxValueLen {
			return refuse(invalid(fmt.Sprintf("Acquire: value is %d bytes, longer than the limit of %d", len(c.Value), MaxValueLen)))
		}
		if c.Req < sess.ack || sess.reqs[c.Req] != nil {
			return refuse(invalid(fmt.Sprintf("Acquire: group request id %d is used or below the acknowledged id %d", c.Req, sess.ack)))
		}
		for j := range i {
			if group[j].Key == c.Key {
				return refuse(invalid(fmt.Sprintf("Acquire: key %q twice in one group", c.Key)))
			}
		}
		k, res, ok := a.s.checkAcquire(c)
		if !ok {
			return refuse(res)
		}
		keys[i] = k
	}

	ats := make([]*attempt, n)
	free := true
	for i := range group {
		c := &group[i]
		ats[i] = newAttempt(c)
		ats[i].size, ats[i].offset = first.Group, uint8(i)
		if keys[i] == nil {
			keys[i] = newLockKey(limitOf(c), roleOf(c.Kind))
			a.s.keys[c.Key] = keys[i]
		}
		free = free && len(keys[i].waiters()) == 0 && a.s.canGrant(keys[i], ats[i])
	}
	for i := range group {
		sess.reqs[group[i].Req] = ats[i]
	}
	switch {
	case free:
		for i := range group {
			a.s.noteLive(sess.id, &group[i])
			a.grant(group[i].Key, keys[i], sess, group[i].Req, ats[i], false)
			results[i] = Result{Status: StatusGranted, Token: ats[i].token}
		}
	case !first.Wait:
		for i := range group {
			sess.finish(group[i].Req, ats[i], ReqRejected)
			results[i] = Result{Status: StatusLocked}
			if group[i].Flags&FlagDetail != 0 {
				results[i].Holders = a.s.holders(keys[i].holders(), maxDetailHolders)
			}
			a.dropIfIdle(group[i].Key, keys[i])
		}
	default:
		if first.Flags&FlagDeadlock != 0 {
			reqs := make([]uint64, len(group))
			for i := range group {
				reqs[i] = group[i].Req
			}
			if why := a.s.deadlock(sess, reqs, ats); why != "" {
				for i := range group {
					sess.finish(group[i].Req, ats[i], ReqRejected)
					results[i] = Result{Status: StatusDeadlock, Err: fmt.Sprintf("Acquire of a group at %q: waiting would deadlock: %s", first.Key, why)}
					a.dropIfIdle(group[i].Key, keys[i])
				}
				return n
			}
		}
		for i := range group {
			a.s.noteLive(sess.id, &group[i])
			a.enqueue(keys[i], sess, group[i].Req, ats[i])
			results[i] = Result{Status: StatusQueued}
		}
	}
	return n
}

// Units splits a batch into what must stay together: each command on its
// own, but the commands of a group (Command.Group) as one unit, as
// acquireGroup will read them. A router that re-batches forwarded
// commands keeps each unit whole and in order.
func Units(cmds []Command) [][]Command {
	var units [][]Command
	for i := 0; i < len(cmds); {
		n := 1
		if c := &cmds[i]; c.Op == OpAcquire && c.Group > 1 {
			for n < int(c.Group) && i+n < len(cmds) {
				m := &cmds[i+n]
				if m.Op != OpAcquire || m.Session != c.Session || m.Group != c.Group || m.Req != c.Req+uint64(n) {
					break
				}
				n++
			}
		}
		units = append(units, cmds[i:i+n:i+n])
		i += n
	}
	return units
}
