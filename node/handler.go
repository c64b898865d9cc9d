// The status page's source in node's types: statusSource (what Handler
// reads of a Node), pageSource (statuspage.Source over it) and the
// conversion of Status, Top and KeyInfo to the page's views.

package node

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/lockmesh/lockmesh/internal/statuspage"
)

// statusSource is what the status page reads. A Node is one; the tests
// use a fake, so the page is tested without a cluster.
type statusSource interface {
	Status(ctx context.Context) (Status, error)
	Top(ctx context.Context, k int) (Top, error)
	Inspect(ctx context.Context, key string) (KeyInfo, error)
}

// newStatusHandler is Handler over src.
func newStatusHandler(src statusSource, opts ...HandlerOption) http.Handler {
	var o handlerOptions
	for _, opt := range opts {
		opt(&o)
	}
	return statuspage.New(pageSource{src}, o.hosts)
}

// pageSource answers the status page's questions by asking a
// statusSource and converting its answers to views; errors pass through
// unchanged, so the page's codes see ErrInvalidKey.
type pageSource struct{ src statusSource }

var _ statuspage.Source = pageSource{}

func (p pageSource) Status(ctx context.Context) (statuspage.Status, error) {
	st, err := p.src.Status(ctx)
	if err != nil {
		return statuspage.Status{}, err
	}
	return statusViewOf(st), nil
}

func (p pageSource) Top(ctx context.Context, k int) (statuspage.Top, error) {
	t, err := p.src.Top(ctx, k)
	if err != nil {
		return statuspage.Top{}, err
	}
	return topViewOf(t), nil
}

func (p pageSource) Key(ctx context.Context, key string) (statuspage.Key, error) {
	info, err := p.src.Inspect(ctx, key)
	if err != nil {
		return statuspage.Key{}, err
	}
	return keyViewOf(info), nil
}

func statusViewOf(st Status) statuspage.Status {
	v := statuspage.Status{
		Peer: st.Peer, Release: st.Release, Cluster: statuspage.ClusterText(st.Cluster), Level: st.Level, Ready: st.Ready,
		Members: make([]statuspage.Member, 0, len(st.Members)),
		Shards:  make([]statuspage.Shard, 0, len(st.Shards)),
	}
	for _, m := range st.Members {
		if !m.Alive {
			v.PeersDown++
		}
		v.Members = append(v.Members, statuspage.Member{
			Name: m.Name, Alive: m.Alive, Level: m.Level,
			GossipAddr: m.GossipAddr, RaftAddr: m.RaftAddr, RPCAddr: m.RPCAddr,
			Cluster: statuspage.ClusterText(m.Cluster), ClientOnly: m.NoReplicas,
		})
	}
	for _, s := range st.Shards {
		if s.Leader == "" {
			v.Leaderless++
		}
		sv := statuspage.Shard{
			Shard: s.Shard, Leader: s.Leader, Replicas: make([]statuspage.Replica, 0, len(s.Replicas)),
			Counted: s.Counted, Sessions: s.Sessions, Keys: s.Keys, Holders: s.Holders, Waiters: s.Waiters,
		}
		for _, r := range s.Replicas {
			sv.Replicas = append(sv.Replicas, statuspage.Replica{
				Peer: r.Peer, Replica: r.Replica, Leader: r.Leader, Reported: r.Reported, Applied: r.Applied, Lag: r.Lag,
			})
		}
		v.Shards = append(v.Shards, sv)
	}
	return v
}

func topViewOf(t Top) statuspage.Top {
	v := statuspage.Top{
		Contended:    make([]statuspage.Contended, 0, len(t.Contended)),
		LongestHolds: make([]statuspage.LongHold, 0, len(t.LongestHolds)),
		Missing:      append(make([]uint64, 0, len(t.Missing)), t.Missing...),
	}
	for _, c := range t.Contended {
		cv := statuspage.Contended{
			Key: c.Key, Shard: c.Shard, Waiters: c.Waiters,
			OldestWaitMS: statuspage.Millis(c.OldestWait), OldestWait: statuspage.HumanDuration(c.OldestWait),
			Handoffs:    c.Handoffs,
			TotalWaitMS: statuspage.Millis(c.TotalWait), TotalWait: statuspage.HumanDuration(c.TotalWait),
			OvercountMS: statuspage.Millis(c.Overcount), Overcount: statuspage.HumanDuration(c.Overcount),
		}
		if c.Waiters > 0 && c.OldestWait <= 0 {
			cv.OldestWait = "unknown"
		}
		if !c.Since.IsZero() {
			cv.Since = c.Since.UTC().Format(time.RFC3339)
		}
		v.Contended = append(v.Contended, cv)
	}
	for _, l := range t.LongestHolds {
		v.LongestHolds = append(v.LongestHolds, statuspage.LongHold{
			Key: l.Key, Shard: l.Shard, Peer: l.Peer, Session: strconv.FormatUint(l.Session, 10), Token: l.Token,
			HeldForMS: statuspage.Millis(l.HeldFor), HeldFor: statuspage.AgeText(l.HeldFor, l.AtLeast), AtLeast: l.AtLeast,
		})
	}
	return v
}

func keyViewOf(info KeyInfo) statuspage.Key {
	return statuspage.Key{Key: info.Key, Shard: info.Shard, Holders: holderViews(info.Holders), Waiters: holderViews(info.Waiters)}
}

func holderViews(hs []Holder) []statuspage.Holder {
	out := make([]statuspage.Holder, 0, len(hs))
	for _, h := range hs {
		out = append(out, statuspage.Holder{
			Peer: h.Peer, Session: strconv.FormatUint(h.Session, 10), ShardSession: h.ShardSession,
			Request: h.Request, Token: h.Token,
			AgeMS: statuspage.Millis(h.Age), Age: statuspage.AgeText(h.Age, h.AtLeast), AtLeast: h.AtLeast,
			Kind: kindText(h),
		})
	}
	return out
}

// kindText is what the page says a hold is.
func kindText(h Holder) string {
	if h.Kind == "semaphore" {
		return fmt.Sprintf("%d of a semaphore", h.Permits)
	}
	return h.Kind
}
