package leader

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/lease"
	"github.com/lockmesh/lockmesh/internal/lockerr"
	"github.com/lockmesh/lockmesh/internal/router"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// Leader-side leases: the keepalives this peer serves as a shard's
// leader, and the terms and expiries it proposes.

// ServeKeepAlive runs on the leader of a shard for keepalives of the
// sessions of one peer. The caller has authorized the request (node checks
// that the sender owns the sessions). An answer with Leader set means this
// peer does not lead the shard; an error coded lockerr.CodeBusy asks the
// sender to retry.
func (s *Sessions) ServeKeepAlive(ctx context.Context, req router.KeepAliveRequest) (router.KeepAliveResponse, error) {
	received := s.cfg.Now()
	p := s.host.Placement()
	if p == nil || !s.host.Hosts(req.Shard) {
		return router.KeepAliveResponse{}, lockerr.RPC(lockerr.CodeNotHosted, "peer %s hosts no replica of shard %d", s.cfg.Name, req.Shard)
	}
	self, _ := s.host.LocalReplica(req.Shard)
	leaderID, term, valid, err := s.host.LeaderID(req.Shard)
	if err != nil || !valid {
		return router.KeepAliveResponse{}, lockerr.RPC(lockerr.CodeBusy, "shard %d has no leader yet", req.Shard)
	}
	if leaderID != self {
		hint := "?" // not empty: an empty Leader means "acknowledged"
		if name, ok := p.ReplicaPeer(req.Shard, leaderID); ok {
			hint = name
		}
		return router.KeepAliveResponse{Leader: hint}, nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.host.ProposalTimeout())
	defer cancel()
	// Rule 1: confirm leadership and catch up the local replica first.
	st, err := s.host.ReadSessions(ctx, req.Shard)
	if err != nil {
		return router.KeepAliveResponse{}, lockerr.RPC(lockerr.CodeBusy, "shard %d: confirm leadership: %v", req.Shard, err)
	}
	if _, term2, valid, err := s.host.LeaderID(req.Shard); err != nil || !valid || term2 != term {
		return router.KeepAliveResponse{}, lockerr.RPC(lockerr.CodeBusy, "shard %d: leadership changed during keepalive", req.Shard)
	}
	_, lost, err := s.leases.Ack(req.Shard, term, st, req.Sessions, received)
	switch {
	case errors.Is(err, lease.ErrTermNotRecorded):
		// Rule 0: the expiry loop records the term; the sender retries.
		s.wake()
		return router.KeepAliveResponse{}, lockerr.RPC(lockerr.CodeBusy, "shard %d: the leader of term %d has not recorded its term yet (state has %d)", req.Shard, term, st.Term)
	case err != nil:
		return router.KeepAliveResponse{}, lockerr.RPC(lockerr.CodeBusy, "shard %d, leader term %d (state has %d): %v", req.Shard, term, st.Term, err)
	}
	return router.KeepAliveResponse{Expired: lost}, nil
}

// expiryLoop runs the leader side of leases on every shard this peer
// leads: it records a new leader's term (rule 0) and expires the sessions
// whose keepalives stopped for longer than the TTL. It wakes every
// TTL/20 and when this peer becomes a leader.
func (s *Sessions) expiryLoop(ctx context.Context) {
	t := time.NewTicker(max(s.cfg.SessionTTL/20, s.cfg.RTT))
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-s.kick:
		case <-ctx.Done():
			return
		}
		s.expireLapsed(ctx)
	}
}

// expireLapsed does what the lease table decides for every lock shard this
// peer leads: record the leader's term, or expire the lapsed sessions with
// ExpireSession stamped with the term that decided it.
func (s *Sessions) expireLapsed(ctx context.Context) {
	for _, shard := range s.leases.Led() {
		if shard == layout.MetaShard {
			continue // the meta shard holds the layout, not sessions
		}
		st, err := s.host.StaleSessions(shard)
		if err != nil {
			continue
		}
		d := s.leases.Lapsed(shard, st, s.cfg.Now())
		if d.RecordTerm {
			s.goFunc(func() { s.recordTerm(ctx, shard, d.Term) })
		}
		if len(d.Sessions) > 0 {
			s.goFunc(func() { s.expireSessions(ctx, shard, d.Term, d.Sessions) })
		}
		if len(d.Holds) > 0 {
			s.goFunc(func() { s.expireHolds(ctx, shard, d.Term, d.Holds) })
		}
	}
}

// maxExpiries bounds the expiry proposals (ExpireSession, ExpireHold) of
// one shard's round in flight at once; those in flight together share
// Raft entries.
const maxExpiries = 16

// expireSessions proposes the expiry, decided in term, of sessions of
// shard, at most maxExpiries at once: one goroutine per shard and round,
// not one per session, however many lapse together (a peer holding
// thousands of sessions died).
func (s *Sessions) expireSessions(ctx context.Context, shard, term uint64, sessions []lockfsm.SessionInfo) {
	cmds := make([]lockfsm.Command, len(sessions))
	for i, si := range sessions {
		s.log.Info("expiring session", "shard", shard, "term", term, "session", si.ID, "owner", si.Owner, "held", si.Held, "waiting", si.Waiting)
		cmds[i] = lockfsm.Command{Op: lockfsm.OpExpireSession, Session: si.ID, Term: term}
	}
	s.proposeExpiries(ctx, shard, cmds)
}

// expireHolds proposes, decided in term, the end of holds of shard that
// were held for their maximum, as expireSessions does.
func (s *Sessions) expireHolds(ctx context.Context, shard, term uint64, holds []lockfsm.HoldInfo) {
	cmds := make([]lockfsm.Command, len(holds))
	for i, h := range holds {
		s.log.Info("ending a hold at its maximum", "shard", shard, "term", term, "session", h.Session, "req", h.Req, "max_hold", lease.Millis(h.MaxHoldMillis))
		cmds[i] = lockfsm.Command{Op: lockfsm.OpExpireHold, Session: h.Session, Target: h.Req, Term: term}
	}
	s.proposeExpiries(ctx, shard, cmds)
}

// proposeExpiries proposes cmds on shard, at most maxExpiries at once,
// within a session TTL, and logs those refused because the term that
// decided them has ended.
func (s *Sessions) proposeExpiries(ctx context.Context, shard uint64, cmds []lockfsm.Command) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.SessionTTL)
	defer cancel()
	slots := make(chan struct{}, maxExpiries)
	var wg sync.WaitGroup
	for _, cmd := range cmds {
		slots <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			res, err := s.host.Apply(ctx, shard, cmd)
			if err == nil && res.Status == lockfsm.StatusStaleTerm {
				s.log.Info("expiry refused: decided in a term that has ended", "shard", shard, "op", cmd.Op, "session", cmd.Session, "err", res.Err)
			}
		}()
	}
	wg.Wait()
}

// recordTerm commits LeaderTerm for term on shard (rule 0), as long as this
// peer still leads the shard in that term. The expiry loop proposes it
// again if this try does not land.
func (s *Sessions) recordTerm(ctx context.Context, shard, term uint64) {
	defer s.leases.RecordingDone(shard, term)
	ctx, cancel := context.WithTimeout(ctx, s.host.ProposalTimeout())
	defer cancel()
	res, err := s.host.Apply(ctx, shard, lockfsm.Command{Op: lockfsm.OpLeaderTerm, Term: term})
	if err != nil {
		s.log.Debug("record leader term", "shard", shard, "term", term, "err", err)
		return
	}
	if res.Status == lockfsm.StatusOK {
		s.log.Debug("leader term recorded", "shard", shard, "term", term)
		// Keepalives refused meanwhile are retried by their senders.
	}
}
