// Package statuspage serves a peer's read-only status page over HTTP: an
// HTML page of the peer's status, the cluster's most contended keys and
// longest holds, and a key lookup, with the same answers as JSON
// (/status.json, /top.json, /key). It changes nothing: only GET and HEAD
// are served, and every answer comes from a Source, asked with a timeout.
//
// The page answers only requests whose Host internal/hostguard allows,
// and forbids inline code with its Content-Security-Policy: key names are
// user data. node.Handler is its public face and documents the routes;
// node converts its own types to this package's views (views.go), so the
// JSON's field names do not depend on node's types.
package statuspage

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
	"github.com/lockmesh/lockmesh/internal/lockerr"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// Source is what the page reads, already in the page's views. The
// handler calls it from the request's goroutines, up to three at once
// for one page, with a context that ends after 5 s; it need not return
// when that context ends (the page stops waiting for it), but should. An
// error wrapping lockerr.InvalidKey is the caller's mistake (400); any
// other is the cluster's trouble (503).
type Source interface {
	Status(ctx context.Context) (Status, error)
	Top(ctx context.Context, k int) (Top, error)
	Key(ctx context.Context, key string) (Key, error)
}

// New returns the status page's handler over src. It answers requests
// addressed to loopback, localhost and hosts (node.WithAllowedHosts) and
// refuses the rest with 421 before src is asked anything.
func New(src Source, hosts []string) http.Handler {
	return &handler{src: src, timeout: timeout, hosts: hosts}
}

const (
	// timeout bounds every request's calls into the cluster, so a
	// leaderless shard or a partition gives the operator an error to read
	// instead of a page that never loads.
	timeout = 5 * time.Second
	// topDefault and topMax are the default and the largest k of
	// /top.json: a page is for reading, and every key of k costs each
	// shard leader a reply.
	topDefault = 10
	topMax     = 100
	// csp lets the page run only its own script and stylesheet and talk
	// only to its own endpoints: key names are user data, so even if one
	// slipped past escaping it could not load or send anything.
	csp = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; " +
		"img-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)

//go:embed assets/index.html assets/app.js assets/app.css
var files embed.FS

// page is parsed once; it is a constant of the build, so a parse error
// is a bug found by any test, never an input.
var page = template.Must(template.New("index.html").Funcs(template.FuncMap{
	// inc numbers the waiters from 1, as people count a queue.
	"inc": func(i int) int { return i + 1 },
}).ParseFS(files, "assets/index.html"))

// assets are the page's script and stylesheet, served beside it so the
// Content-Security-Policy can forbid inline code.
var assets = map[string]string{
	"app.js":  "text/javascript; charset=utf-8",
	"app.css": "text/css; charset=utf-8",
}

// handler serves the status page and its JSON.
type handler struct {
	src     Source
	timeout time.Duration
	// hosts are the names besides loopback and localhost that requests
	// may address.
	hosts []string
}

// ServeHTTP routes by the path left after the mount point: with or
// without a leading slash, so http.StripPrefix works whether its prefix
// ends in a slash or not.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hdr := w.Header()
	hdr.Set("Cache-Control", "no-store")
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("Content-Security-Policy", csp)
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
			writeJSON(w, http.StatusMethodNotAllowed, errorBody{Error: msg})
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
		if ctype, ok := assets[route]; ok {
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
	b, err := files.ReadFile("assets/" + name)
	if err != nil {
		http.Error(w, fmt.Sprintf("status page asset %s missing from the build: %v", name, err), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", ctype)
	w.Write(b)
}

func (h *handler) serveStatus(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), h.timeout)
	defer cancel()
	st, err := askSource(ctx, h.timeout, "status", h.src.Status)
	if err != nil {
		writeJSON(w, errorCode(err), errorBody{Error: err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, st)
}

func (h *handler) serveTop(w http.ResponseWriter, r *http.Request) {
	k, err := topK(r.URL.Query())
	if err != nil {
		writeJSON(w, http.StatusBadRequest, errorBody{Error: err.Error()})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.timeout)
	defer cancel()
	top, err := askSource(ctx, h.timeout, "top", func(ctx context.Context) (Top, error) { return h.src.Top(ctx, k) })
	if err != nil {
		writeJSON(w, errorCode(err), errorBody{Error: err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, top)
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

func (h *handler) serveKey(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if !q.Has("k") {
		writeJSON(w, http.StatusBadRequest, errorBody{Error: "missing k: ask for a key as /key?k=KEY"})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.timeout)
	defer cancel()
	info, err := h.lookup(ctx, q.Get("k"))
	if err != nil {
		writeJSON(w, errorCode(err), errorBody{Error: err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, info)
}

// lookup checks key before it asks the cluster, so a key no lock can
// have is a 400 that costs no round trip. Its error wraps
// lockerr.InvalidKey, which is node.ErrInvalidKey, as Node.Inspect's does.
func (h *handler) lookup(ctx context.Context, key string) (Key, error) {
	if err := lockfsm.ValidateKey(key); err != nil {
		return Key{}, fmt.Errorf("%w: %v", lockerr.InvalidKey, err)
	}
	return askSource(ctx, h.timeout, "key lookup", func(ctx context.Context) (Key, error) { return h.src.Key(ctx, key) })
}

// askSource calls f and waits for it at most until ctx ends. A Source's
// calls should return when their context ends; the page does not rely on
// it, so one stuck call cannot hang the page (it is left to finish alone).
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
	if errors.Is(err, lockerr.InvalidKey) {
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

// pageData is what the HTML page renders: the same views as the JSON
// endpoints, so the server's first rendering and the script's refreshes
// show the same strings.
type pageData struct {
	Status    *Status
	StatusErr string
	Top       *Top
	TopErr    string
	// Key is the key asked for with ?k=, KeyInfo its answer and KeyErr
	// why there is none.
	Key     string
	KeyInfo *Key
	KeyErr  string
	// Updated is when the page was rendered, on the server's clock.
	Updated string
}

func (h *handler) serveIndex(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), h.timeout)
	defer cancel()
	q := r.URL.Query()
	data := pageData{Key: q.Get("k"), Updated: time.Now().Format("15:04:05")}
	// The three questions go to different shards and peers; asked
	// together, the page takes as long as the slowest, not their sum.
	var wg sync.WaitGroup
	var statusErr, topErr, keyErr error
	wg.Go(func() {
		st, err := askSource(ctx, h.timeout, "status", h.src.Status)
		if statusErr = err; err == nil {
			data.Status = &st
		}
	})
	wg.Go(func() {
		top, err := askSource(ctx, h.timeout, "top", func(ctx context.Context) (Top, error) { return h.src.Top(ctx, topDefault) })
		if topErr = err; err == nil {
			data.Top = &top
		}
	})
	// An empty k is the lookup form submitted blank: no question asked.
	if data.Key != "" {
		wg.Go(func() {
			info, err := h.lookup(ctx, data.Key)
			if keyErr = err; err == nil {
				data.KeyInfo = &info
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
	data.StatusErr, data.TopErr, data.KeyErr = errorText(statusErr), errorText(topErr), errorText(keyErr)
	var buf bytes.Buffer
	if err := page.Execute(&buf, data); err != nil {
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
