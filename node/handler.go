package node

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lockmesh/lockmesh/internal/hostguard"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// statusSource is what the status page reads. A Node is one; the tests
// use a fake, so the page is tested without a cluster.
type statusSource interface {
	Status(ctx context.Context) (Status, error)
	Top(ctx context.Context, k int) (Top, error)
	Inspect(ctx context.Context, key string) (KeyInfo, error)
}

const (
	// statusTimeout bounds every request's calls into the cluster, so a
	// leaderless shard or a partition gives the operator an error to read
	// instead of a page that never loads.
	statusTimeout = 5 * time.Second
	// topDefault and topMax are the default and the largest k of
	// /top.json: a page is for reading, and every key of k costs each
	// shard leader a reply.
	topDefault = 10
	topMax     = 100
	// statusCSP lets the page run only its own script and stylesheet and
	// talk only to its own endpoints: key names are user data, so even if
	// one slipped past escaping it could not load or send anything.
	statusCSP = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; " +
		"img-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)

//go:embed statuspage/index.html statuspage/app.js statuspage/app.css
var statusFiles embed.FS

// statusPage is parsed once; it is a constant of the build, so a parse
// error is a bug found by any test, never an input.
var statusPage = template.Must(template.New("index.html").Funcs(template.FuncMap{
	// inc numbers the waiters from 1, as people count a queue.
	"inc": func(i int) int { return i + 1 },
}).ParseFS(statusFiles, "statuspage/index.html"))

// statusAssets are the page's script and stylesheet, served beside it so
// the Content-Security-Policy can forbid inline code.
var statusAssets = map[string]string{
	"app.js":  "text/javascript; charset=utf-8",
	"app.css": "text/css; charset=utf-8",
}

// statusHandler serves the status page and its JSON (see Node.Handler).
type statusHandler struct {
	src     statusSource
	timeout time.Duration
	// hosts are the names besides loopback and localhost that requests
	// may address (WithAllowedHosts).
	hosts []string
}

func newStatusHandler(src statusSource, opts ...HandlerOption) *statusHandler {
	var o handlerOptions
	for _, opt := range opts {
		opt(&o)
	}
	return &statusHandler{src: src, timeout: statusTimeout, hosts: o.hosts}
}

// ServeHTTP routes by the path left after the mount point: with or
// without a leading slash, so http.StripPrefix works whether its prefix
// ends in a slash or not.
func (h *statusHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hdr := w.Header()
	hdr.Set("Cache-Control", "no-store")
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("Content-Security-Policy", statusCSP)
	// Lookups put key names in the URL; keep them out of other sites' logs.
	hdr.Set("Referrer-Policy", "no-referrer")
	// Before anything is asked of the cluster: a page the operator visits
	// could otherwise point a name of its own at this listener (DNS
	// rebinding) and read the answers as same-origin.
	if !hostguard.Allowed(r.Host, h.hosts) {
		hostguard.Refuse(w, r.Host, "allowed with node.WithAllowedHosts")
		return
	}
	route := strings.TrimPrefix(r.URL.Path, "/")
	isJSON := route == "status.json" || route == "top.json" || route == "key"
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		hdr.Set("Allow", "GET, HEAD")
		msg := fmt.Sprintf("method %s not allowed: the lockmesh status page is read-only, use GET or HEAD", r.Method)
		if isJSON {
			writeJSON(w, http.StatusMethodNotAllowed, errorView{Error: msg})
		} else {
			http.Error(w, msg, http.StatusMethodNotAllowed)
		}
		return
	}
	switch route {
	case "":
		if to, ok := slashRedirect(r); ok {
			hdr.Set("Location", to)
			w.WriteHeader(http.StatusMovedPermanently)
			return
		}
		h.serveIndex(w, r)
	case "status.json":
		h.serveStatus(w, r)
	case "top.json":
		h.serveTop(w, r)
	case "key":
		h.serveKey(w, r)
	default:
		if ctype, ok := statusAssets[route]; ok {
			serveAsset(w, route, ctype)
			return
		}
		http.NotFound(w, r)
	}
}

// slashRedirect returns where to send a request for the page's mount
// point written without its trailing slash (StripPrefix("/lm", h) and a
// request for "/lm"): the page's links are relative, so they only resolve
// under "/lm/". The original path is in RequestURI, since StripPrefix
// rewrote URL.Path; the redirect is relative because the handler does not
// know where it is mounted.
func slashRedirect(r *http.Request) (string, bool) {
	if r.URL.Path != "" || r.RequestURI == "" {
		return "", false
	}
	orig, err := url.ParseRequestURI(r.RequestURI)
	if err != nil || orig.Path == "" || strings.HasSuffix(orig.Path, "/") {
		return "", false
	}
	to := path.Base(orig.Path) + "/"
	if r.URL.RawQuery != "" {
		to += "?" + r.URL.RawQuery
	}
	return to, true
}

func serveAsset(w http.ResponseWriter, name, ctype string) {
	b, err := statusFiles.ReadFile("statuspage/" + name)
	if err != nil {
		http.Error(w, fmt.Sprintf("status page asset %s missing from the build: %v", name, err), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", ctype)
	w.Write(b)
}

func (h *statusHandler) serveStatus(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), h.timeout)
	defer cancel()
	st, err := askSource(ctx, h.timeout, "status", h.src.Status)
	if err != nil {
		writeJSON(w, errorCode(err), errorView{Error: err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, statusViewOf(st))
}

func (h *statusHandler) serveTop(w http.ResponseWriter, r *http.Request) {
	k, err := topK(r.URL.Query())
	if err != nil {
		writeJSON(w, http.StatusBadRequest, errorView{Error: err.Error()})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.timeout)
	defer cancel()
	top, err := askSource(ctx, h.timeout, "top", func(ctx context.Context) (Top, error) { return h.src.Top(ctx, k) })
	if err != nil {
		writeJSON(w, errorCode(err), errorView{Error: err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, topViewOf(top))
}

// topK reads /top.json's k: topDefault when absent, else a whole number
// from 1 to topMax.
func topK(q url.Values) (int, error) {
	if !q.Has("k") {
		return topDefault, nil
	}
	s := q.Get("k")
	k, err := strconv.Atoi(s)
	if err != nil || k < 1 || k > topMax {
		return 0, fmt.Errorf("k=%q: want how many keys to list, a whole number from 1 to %d", s, topMax)
	}
	return k, nil
}

func (h *statusHandler) serveKey(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if !q.Has("k") {
		writeJSON(w, http.StatusBadRequest, errorView{Error: "missing k: ask for a key as /key?k=KEY"})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.timeout)
	defer cancel()
	info, err := h.inspect(ctx, q.Get("k"))
	if err != nil {
		writeJSON(w, errorCode(err), errorView{Error: err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, keyViewOf(info))
}

// inspect checks key before it asks the cluster, so a key no lock can
// have is a 400 that costs no round trip.
func (h *statusHandler) inspect(ctx context.Context, key string) (KeyInfo, error) {
	if err := lockfsm.ValidateKey(key); err != nil {
		return KeyInfo{}, fmt.Errorf("%w: %v", ErrInvalidKey, err)
	}
	return askSource(ctx, h.timeout, "key lookup", func(ctx context.Context) (KeyInfo, error) { return h.src.Inspect(ctx, key) })
}

// askSource calls f and waits for it at most until ctx ends. Node's
// methods return when their context ends; the page does not rely on it,
// so one stuck call cannot hang the page (it is left to finish alone).
func askSource[T any](ctx context.Context, timeout time.Duration, what string, f func(context.Context) (T, error)) (T, error) {
	type answer struct {
		v   T
		err error
	}
	done := make(chan answer, 1)
	go func() {
		v, err := f(ctx)
		done <- answer{v, err}
	}()
	var a answer
	select {
	case a = <-done:
	case <-ctx.Done():
		a.err = ctx.Err()
	}
	switch {
	case a.err == nil:
		return a.v, nil
	case errors.Is(a.err, context.DeadlineExceeded):
		return a.v, fmt.Errorf("%s: no answer within %v (a shard without a leader, or peers cut off?): %w", what, timeout, a.err)
	default:
		return a.v, fmt.Errorf("%s: %w", what, a.err)
	}
}

// errorCode is a request's status for err: the caller's mistake or the
// cluster's trouble.
func errorCode(err error) int {
	if errors.Is(err, ErrInvalidKey) {
		return http.StatusBadRequest
	}
	return http.StatusServiceUnavailable
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		http.Error(w, fmt.Sprintf("encoding the status as JSON: %v", err), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(code)
	w.Write(buf.Bytes())
}

// pageView is what the HTML page renders: the same views as the JSON
// endpoints, so the server's first rendering and the script's refreshes
// show the same strings.
type pageView struct {
	Status    *statusView
	StatusErr string
	Top       *topView
	TopErr    string
	// Key is the key asked for with ?k=, KeyInfo its answer and KeyErr
	// why there is none.
	Key     string
	KeyInfo *keyView
	KeyErr  string
	// Updated is when the page was rendered, on the server's clock.
	Updated string
}

func (h *statusHandler) serveIndex(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), h.timeout)
	defer cancel()
	q := r.URL.Query()
	page := pageView{Key: q.Get("k"), Updated: time.Now().Format("15:04:05")}
	// The three questions go to different shards and peers; asked
	// together, the page takes as long as the slowest, not their sum.
	var wg sync.WaitGroup
	var statusErr, topErr, keyErr error
	wg.Go(func() {
		st, err := askSource(ctx, h.timeout, "status", h.src.Status)
		if statusErr = err; err == nil {
			v := statusViewOf(st)
			page.Status = &v
		}
	})
	wg.Go(func() {
		top, err := askSource(ctx, h.timeout, "top", func(ctx context.Context) (Top, error) { return h.src.Top(ctx, topDefault) })
		if topErr = err; err == nil {
			v := topViewOf(top)
			page.Top = &v
		}
	})
	// An empty k is the lookup form submitted blank: no question asked.
	if page.Key != "" {
		wg.Go(func() {
			info, err := h.inspect(ctx, page.Key)
			if keyErr = err; err == nil {
				v := keyViewOf(info)
				page.KeyInfo = &v
			}
		})
	}
	wg.Wait()
	code := http.StatusOK
	for _, err := range []error{keyErr, statusErr, topErr} {
		if err != nil {
			code = max(code, errorCode(err))
		}
	}
	page.StatusErr, page.TopErr, page.KeyErr = errorText(statusErr), errorText(topErr), errorText(keyErr)
	var buf bytes.Buffer
	if err := statusPage.Execute(&buf, page); err != nil {
		http.Error(w, fmt.Sprintf("rendering the status page: %v", err), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	w.Write(buf.Bytes())
}

func errorText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// The views below give the JSON its field names (snake_case), so the
// node types stay free of tags and can change without breaking scripts
// that read the page. Durations come twice: in milliseconds (µs
// precision) for programs and as a short human string for people. Random
// 64-bit ids (cluster, session) are strings, as JavaScript's numbers
// cannot hold them exactly.

type errorView struct {
	Error string `json:"error"`
}

type statusView struct {
	Peer    string `json:"peer"`
	Release string `json:"release"`
	// Cluster is the cluster id in hex, "" while unknown.
	Cluster string       `json:"cluster"`
	Level   uint8        `json:"level"`
	Ready   bool         `json:"ready"`
	Members []memberView `json:"members"`
	Shards  []shardView  `json:"shards"`
}

type memberView struct {
	Name       string `json:"name"`
	Alive      bool   `json:"alive"`
	Level      uint8  `json:"level"`
	GossipAddr string `json:"gossip_addr"`
	RaftAddr   string `json:"raft_addr"`
	RPCAddr    string `json:"rpc_addr"`
	Cluster    string `json:"cluster"`
	ClientOnly bool   `json:"client_only"`
}

type shardView struct {
	Shard    uint64        `json:"shard"`
	Leader   string        `json:"leader"`
	Replicas []replicaView `json:"replicas"`
	Counted  bool          `json:"counted"`
	Sessions int           `json:"sessions"`
	Keys     int           `json:"keys"`
	Holders  int           `json:"holders"`
	Waiters  int           `json:"waiters"`
}

type replicaView struct {
	Peer     string `json:"peer"`
	Replica  uint64 `json:"replica"`
	Leader   bool   `json:"leader"`
	Reported bool   `json:"reported"`
	Applied  uint64 `json:"applied"`
	Lag      uint64 `json:"lag"`
}

type topView struct {
	Contended    []contendedView `json:"contended"`
	LongestHolds []longHoldView  `json:"longest_holds"`
	Missing      []uint64        `json:"missing"`
}

type contendedView struct {
	Key          string  `json:"key"`
	Shard        uint64  `json:"shard"`
	Waiters      int     `json:"waiters"`
	OldestWaitMS float64 `json:"oldest_wait_ms"`
	OldestWait   string  `json:"oldest_wait"`
	Handoffs     uint64  `json:"handoffs"`
	TotalWaitMS  float64 `json:"total_wait_ms"`
	TotalWait    string  `json:"total_wait"`
	OvercountMS  float64 `json:"overcount_ms"`
	Overcount    string  `json:"overcount"`
	// Since is RFC 3339, "" when unknown.
	Since string `json:"since"`
}

type longHoldView struct {
	Key       string  `json:"key"`
	Shard     uint64  `json:"shard"`
	Peer      string  `json:"peer"`
	Session   string  `json:"session"`
	Token     uint64  `json:"token"`
	HeldForMS float64 `json:"held_for_ms"`
	// HeldFor starts with "≥" when AtLeast.
	HeldFor string `json:"held_for"`
	AtLeast bool   `json:"at_least"`
}

type keyView struct {
	Key     string       `json:"key"`
	Shard   uint64       `json:"shard"`
	Holders []holderView `json:"holders"`
	// Waiters are in FIFO order: the first is granted next.
	Waiters []holderView `json:"waiters"`
}

type holderView struct {
	Peer         string `json:"peer"`
	Session      string `json:"session"`
	ShardSession uint64 `json:"shard_session"`
	Request      uint64 `json:"request"`
	Token        uint64 `json:"token"`
	// AgeMS is 0 and Age "unknown" when the answering replica did not
	// know the age; Age starts with "≥" when AtLeast.
	AgeMS   float64 `json:"age_ms"`
	Age     string  `json:"age"`
	AtLeast bool    `json:"at_least"`
}

func statusViewOf(st Status) statusView {
	v := statusView{
		Peer: st.Peer, Release: st.Release, Cluster: clusterText(st.Cluster), Level: st.Level, Ready: st.Ready,
		Members: make([]memberView, 0, len(st.Members)),
		Shards:  make([]shardView, 0, len(st.Shards)),
	}
	for _, m := range st.Members {
		v.Members = append(v.Members, memberView{
			Name: m.Name, Alive: m.Alive, Level: m.Level,
			GossipAddr: m.GossipAddr, RaftAddr: m.RaftAddr, RPCAddr: m.RPCAddr,
			Cluster: clusterText(m.Cluster), ClientOnly: m.NoReplicas,
		})
	}
	for _, s := range st.Shards {
		sv := shardView{
			Shard: s.Shard, Leader: s.Leader, Replicas: make([]replicaView, 0, len(s.Replicas)),
			Counted: s.Counted, Sessions: s.Sessions, Keys: s.Keys, Holders: s.Holders, Waiters: s.Waiters,
		}
		for _, r := range s.Replicas {
			sv.Replicas = append(sv.Replicas, replicaView{
				Peer: r.Peer, Replica: r.Replica, Leader: r.Leader, Reported: r.Reported, Applied: r.Applied, Lag: r.Lag,
			})
		}
		v.Shards = append(v.Shards, sv)
	}
	return v
}

func clusterText(id uint64) string {
	if id == 0 {
		return ""
	}
	return strconv.FormatUint(id, 16)
}

func topViewOf(t Top) topView {
	v := topView{
		Contended:    make([]contendedView, 0, len(t.Contended)),
		LongestHolds: make([]longHoldView, 0, len(t.LongestHolds)),
		Missing:      append(make([]uint64, 0, len(t.Missing)), t.Missing...),
	}
	for _, c := range t.Contended {
		cv := contendedView{
			Key: c.Key, Shard: c.Shard, Waiters: c.Waiters,
			OldestWaitMS: millis(c.OldestWait), OldestWait: humanDuration(c.OldestWait),
			Handoffs:    c.Handoffs,
			TotalWaitMS: millis(c.TotalWait), TotalWait: humanDuration(c.TotalWait),
			OvercountMS: millis(c.Overcount), Overcount: humanDuration(c.Overcount),
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
		v.LongestHolds = append(v.LongestHolds, longHoldView{
			Key: l.Key, Shard: l.Shard, Peer: l.Peer, Session: strconv.FormatUint(l.Session, 10), Token: l.Token,
			HeldForMS: millis(l.HeldFor), HeldFor: ageText(l.HeldFor, l.AtLeast), AtLeast: l.AtLeast,
		})
	}
	return v
}

func keyViewOf(info KeyInfo) keyView {
	return keyView{Key: info.Key, Shard: info.Shard, Holders: holderViews(info.Holders), Waiters: holderViews(info.Waiters)}
}

func holderViews(hs []Holder) []holderView {
	out := make([]holderView, 0, len(hs))
	for _, h := range hs {
		out = append(out, holderView{
			Peer: h.Peer, Session: strconv.FormatUint(h.Session, 10), ShardSession: h.ShardSession,
			Request: h.Request, Token: h.Token,
			AgeMS: millis(h.Age), Age: ageText(h.Age, h.AtLeast), AtLeast: h.AtLeast,
		})
	}
	return out
}

// ageText is how long a hold or wait has lasted, for people: "unknown"
// for a zero age that is not a lower bound (the replica did not know),
// and "≥" before an age that is only a lower bound.
func ageText(d time.Duration, atLeast bool) string {
	switch {
	case atLeast:
		return "≥" + humanDuration(d)
	case d <= 0:
		return "unknown"
	default:
		return humanDuration(d)
	}
}

// millis is d in milliseconds with microsecond precision: enough to
// compare waits, short enough to read.
func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// humanDuration writes d with two or three significant figures, the way
// an operator reads it at a glance: "850µs", "12ms", "1.2s", "3m4s",
// "2h5m", "3d4h". Negative durations (clocks stepped back) read "0s".
func humanDuration(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Millisecond:
		return d.Round(time.Microsecond).String()
	case d < 10*time.Millisecond:
		return d.Round(100 * time.Microsecond).String()
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		d = d.Round(100 * time.Millisecond)
	case d < time.Hour:
		d = d.Round(time.Second)
	case d < 48*time.Hour:
		d = d.Round(time.Minute)
	default:
		d = d.Round(time.Hour)
		days, hours := d/(24*time.Hour), (d%(24*time.Hour))/time.Hour
		if hours == 0 {
			return fmt.Sprintf("%dd", days)
		}
		return fmt.Sprintf("%dd%dh", days, hours)
	}
	// Rounding can carry into the next unit (59.96s is 1m0s); drop the
	// zero tails Duration.String writes.
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
