package node

import (
	"context"
	"fmt"

	"github.com/lockmesh/lockmesh/lockfsm"
)

// Holder describes one holder or waiter of a key.
type Holder struct {
	// Peer is the name of the peer whose session holds or waits.
	Peer string
	// Session and Request identify the acquire attempt.
	Session, Request uint64
	// Token is the fencing token of a holder; 0 for waiters.
	Token uint64
}

// KeyInfo is a linearizable snapshot of one key's lock state.
type KeyInfo struct {
	Key     string
	Shard   uint64
	Holders []Holder
	Waiters []Holder // in FIFO order
}

// Inspect returns the current holders and waiters of key, read through the
// Raft log's read index (linearizable).
func (n *Node) Inspect(ctx context.Context, key string) (KeyInfo, error) {
	if err := lockfsm.ValidateKey(key); err != nil {
		return KeyInfo{}, fmt.Errorf("%w: %v", ErrInvalidKey, err)
	}
	if n.isClosed() {
		return KeyInfo{}, ErrClosed
	}
	p, err := n.waitReady(ctx)
	if err != nil {
		return KeyInfo{}, err
	}
	shard := p.shardOf(key)
	info := KeyInfo{Key: key, Shard: shard}
	for attempt := 0; ; attempt++ {
		a, err := n.read(ctx, shard, lockQuery{Kind: queryKey, Key: key})
		if err == nil {
			if a.KeyFound {
				info.Holders = holders(a.Key.Holders)
				info.Waiters = holders(a.Key.Waiters)
			}
			return info, nil
		}
		if !retryable(err) {
			return info, fmt.Errorf("inspect %q: %w", key, err)
		}
		if err := n.backoff(ctx, attempt); err != nil {
			return info, fmt.Errorf("inspect %q: %w", key, n.unavailable(shard, err, err))
		}
	}
}

func holders(hs []lockfsm.Holder) []Holder {
	out := make([]Holder, len(hs))
	for i, h := range hs {
		out[i] = Holder{Peer: h.Owner, Session: h.Session, Request: h.Req, Token: h.Token}
	}
	return out
}
