package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// TestMetrics runs three peers with -http and has them take turns on one
// key, then checks what an operator's Prometheus would scrape from
// /metrics: the acquire and hold histograms moved by exactly the rounds a
// peer locked, the shards have leaders and count leader changes,
// dragonboat's Raft metrics follow lockmesh's in one valid exposition,
// the exporter named everything as grafana_test.go's exportedNames says
// (the names the dashboard may use), and no series anywhere carries the
// key. It also reads the status page's JSON under /debug/lockmesh/.
func TestMetrics(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the program and runs 3 peer processes")
	}
	// The checker must be able to fail: a leak it does not see here it
	// would not see in a scrape either.
	parser := expfmt.NewTextParser(model.UTF8Validation)
	leaky, err := parser.TextToMetricFamilies(strings.NewReader(leakyExposition))
	if err != nil {
		t.Fatal(err)
	}
	if leaks := keyLeaks(exposition{body: leakyExposition, fams: leaky}, []string{"acct/42"}); len(leaks) != 2 {
		t.Fatalf("keyLeaks found %q in an exposition with a key label and a key value, want 2 leaks", leaks)
	}

	bin := buildPeer(t)
	deadline := time.Now().Add(2 * time.Minute)
	c := newCluster(t, bin)
	servers := []string{"m1", "m2", "m3"}
	args, joinAllBut := c.layout(t, servers, nil, "5s")
	// A key no metric could contain by chance, so finding it anywhere in
	// a scrape means a metric carries it.
	const key = "metrics-test-key-7f3a9c"
	const rounds = 10
	for _, s := range servers {
		// Port 0, so the peer picks the port and the test learns it from
		// the http line. On 127.0.0.2, not 127.0.0.1: layout's ports
		// are free ports on 127.0.0.1 that each peer binds only when it
		// starts, and a port 0 listener on 127.0.0.1 may be given one of
		// them first (bind picks from the same pool), so a peer would
		// find its gossip port taken.
		//
		// Each peer locks key rounds times, holding it 50ms: while one
		// holds it the others queue, so grants are handoffs to waiters.
		// -lock-on-usr1 holds them back until the first scrape is taken.
		args[s] = append(args[s], "-http", "127.0.0.2:0", "-lock", key, "-loop", strconv.Itoa(rounds),
			"-hold", "50ms", "-lock-on-usr1")
	}
	httpAddr := map[string]string{}
	c.observe(func(e event) {
		if rest, ok := strings.CutPrefix(e.line, "http "); ok {
			name, addr, _ := strings.Cut(rest, " addr=")
			if name != e.p.name || addr == "" {
				t.Fatalf("%s printed %q, want \"http %s addr=HOST:PORT\"", e.p.name, e.line, e.p.name)
			}
			httpAddr[name] = addr
		}
	})
	started := time.Now()
	procs := c.startServers(servers, args, joinAllBut)
	for _, s := range servers {
		if httpAddr[s] == "" || strings.HasSuffix(httpAddr[s], ":0") {
			t.Fatalf("%s printed ready but no http line with the port it listens on (got %q)", s, httpAddr[s])
		}
	}
	t.Logf("3 peers ready %v after start; http on %v", time.Since(started).Round(time.Millisecond), httpAddr)

	scraper := &http.Client{Timeout: 10 * time.Second}
	m1 := httpAddr["m1"]
	before := scrape(t, scraper, m1)

	for _, s := range servers {
		if err := procs[s].cmd.Process.Signal(syscall.SIGUSR1); err != nil {
			t.Fatalf("SIGUSR1 %s: %v", s, err)
		}
	}
	load := time.Now()
	for released := 0; released < rounds*len(servers); released++ {
		c.await(time.Until(deadline), fmt.Sprintf("%d releases of %s", rounds*len(servers), key), func(e event) bool {
			return e.line == "released "+key
		})
	}
	t.Logf("%d rounds of %s on 3 peers took %v", rounds*len(servers), key, time.Since(load).Round(time.Millisecond))

	after := scrape(t, scraper, m1)
	// m1 locked exactly rounds times, and each of its grants ended in an
	// Unlock, all before the scrape (the histograms are recorded before
	// Lock and Unlock return).
	granted := map[string]string{"primitive": "mutex", "result": "granted"}
	if d := histCount(after.fams, "lockmesh_acquire_duration_seconds", granted) -
		histCount(before.fams, "lockmesh_acquire_duration_seconds", granted); d != rounds {
		t.Errorf("m1's lockmesh_acquire_duration_seconds_count{result=\"granted\"} rose by %v during the load, want %d (its Lock calls)", d, rounds)
	}
	mutex := map[string]string{"primitive": "mutex"}
	if d := histCount(after.fams, "lockmesh_hold_duration_seconds", mutex) -
		histCount(before.fams, "lockmesh_hold_duration_seconds", mutex); d != rounds {
		t.Errorf("m1's lockmesh_hold_duration_seconds_count rose by %v during the load, want %d (its Unlock calls)", d, rounds)
	}
	if !slices.ContainsFunc(series(after.fams, "lockmesh_shard_has_leader"), func(m *dto.Metric) bool {
		return label(m, "shard") != "" && m.GetGauge().GetValue() == 1
	}) {
		t.Errorf("m1 reports no shard with lockmesh_shard_has_leader 1:\n%s", grep(after.body, "has_leader"))
	}
	if len(series(after.fams, "lockmesh_shard_leader_changes_total")) == 0 {
		t.Errorf("m1 has no lockmesh_shard_leader_changes_total series, though its replicas saw their first leaders")
	}
	if !slices.ContainsFunc(after.names, func(n string) bool { return strings.HasPrefix(n, "dragonboat_") }) {
		t.Errorf("m1's /metrics has no dragonboat_ series: Raft metrics are not appended")
	}

	// Go's profiles are served next to the metrics: the goroutine dump
	// names the running peer's own goroutines (internal/peer, behind the
	// node).
	if body := get(t, scraper, "http://"+m1+"/debug/pprof/goroutine?debug=1"); !strings.Contains(body, "lockmesh/lockmesh/internal/peer.") {
		t.Errorf("m1's /debug/pprof/goroutine does not list the peer's goroutines:\n%.500s", body)
	}

	// Every peer: the key nowhere, and every lockmesh_ name one the
	// dashboard may use. Together the three peers lead every shard, so
	// they report every kind of instrument (histogram, counter,
	// observable counter, gauge, unit "1" gauge) that the load reached.
	scraped := map[string]bool{}
	waits := 0.0
	for _, s := range servers {
		sc := after
		if s != "m1" {
			sc = scrape(t, scraper, httpAddr[s])
		}
		if leaks := keyLeaks(sc, []string{key}); len(leaks) > 0 {
			t.Errorf("%s's /metrics carries the key: %q", s, leaks)
		}
		for _, n := range sc.names {
			scraped[n] = true
			if strings.HasPrefix(n, "lockmesh_") && !exportedNames[n] {
				t.Errorf("%s exports %s, which grafana_test.go's exportedNames does not list: the exporter's naming rules are not the ones the dashboard assumes", s, n)
			}
		}
		waits += histCount(sc.fams, "lockmesh_wait_duration_seconds", mutex)
	}
	for _, n := range []string{
		"lockmesh_acquire_duration_seconds_bucket", "lockmesh_acquire_duration_seconds_count", "lockmesh_acquire_duration_seconds_sum",
		"lockmesh_proposal_duration_seconds_bucket", "lockmesh_raft_log_sync_duration_seconds_count",
		"lockmesh_shard_leader_changes_total", "lockmesh_raft_entries_total", "lockmesh_raft_commands_total",
		"lockmesh_shard_waiters", "lockmesh_shard_holders", "lockmesh_shard_sessions", "lockmesh_gossip_members",
		"lockmesh_shard_has_leader",
	} {
		if !scraped[n] {
			t.Errorf("no peer exports %s", n)
		}
	}
	// Three peers taking turns 50ms at a time queue behind each other.
	if waits == 0 {
		t.Errorf("no peer recorded a wait (lockmesh_wait_duration_seconds_count is 0 everywhere) while three peers took turns on %s", key)
	}
	t.Logf("waits recorded on the 3 peers: %v", waits)

	checkStatusPage(t, scraper, m1, servers)

	// SIGTERM shuts the HTTP server down with the node, and the peer
	// exits 0 with nothing to complain about.
	p := procs["m1"]
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
		if code := p.cmd.ProcessState.ExitCode(); code != 0 {
			t.Errorf("m1 exited with %d after SIGTERM, want 0", code)
		}
		if p.stderr.contains("peer: http") {
			t.Errorf("m1 reported an HTTP shutdown error:\n%s", p.stderr.tail(20))
		}
	case <-time.After(15 * time.Second):
		t.Errorf("m1 did not exit within 15s of SIGTERM")
	}
}

// checkStatusPage reads the status page's JSON through the -http mount
// and checks that it lists the peers, and that / leads to the page.
func checkStatusPage(t *testing.T, client *http.Client, addr string, peers []string) {
	t.Helper()
	resp, err := client.Get("http://" + addr + "/debug/lockmesh/status.json")
	if err != nil {
		t.Fatalf("status.json: %v", err)
	}
	defer resp.Body.Close()
	var st struct {
		Members []struct {
			Name  string `json:"name"`
			Alive bool   `json:"alive"`
		} `json:"members"`
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status.json: %s: %s", resp.Status, b)
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatalf("status.json: %v", err)
	}
	var alive []string
	for _, m := range st.Members {
		if m.Alive {
			alive = append(alive, m.Name)
		}
	}
	if !slices.Equal(alive, peers) || len(st.Members) != len(peers) {
		t.Errorf("status.json lists members %+v, want %v, all alive", st.Members, peers)
	}

	noFollow := *client
	noFollow.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err = noFollow.Get("http://" + addr + "/")
	if err != nil {
		t.Fatalf("GET /: %v", err)
	}
	resp.Body.Close()
	if loc := resp.Header.Get("Location"); resp.StatusCode/100 != 3 || loc != "/debug/lockmesh/" {
		t.Errorf("GET / answered %s to %q, want a redirect to /debug/lockmesh/", resp.Status, loc)
	}
}

// exposition is one scrape of /metrics.
type exposition struct {
	body  string
	fams  map[string]*dto.MetricFamily
	names []string // sample names, in order of first appearance
}

// get returns the body of a GET of url, failing t unless it is 200 OK.
func get(t *testing.T, client *http.Client, url string) string {
	t.Helper()
	resp, err := client.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s %v: %.300s", url, resp.Status, err, b)
	}
	return string(b)
}

// scrape gets addr's /metrics, as a Prometheus server asking for
// OpenMetrics or text would, and checks that the whole body, lockmesh's
// and dragonboat's metrics together, is one valid text exposition.
func scrape(t *testing.T, client *http.Client, addr string) exposition {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	// Prometheus 3's default scrape_protocols.
	req.Header.Set("Accept", "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1")
	req.Header.Set("Accept-Encoding", "gzip")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape %s: %s: %s", addr, resp.Status, b)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
		t.Fatalf("scrape %s: Content-Type %q, want the text format, the one Raft's lines are appended in", addr, ct)
	}
	body := string(b)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("scrape %s: not a valid text exposition: %v\n%s", addr, err, body)
	}
	names, err := sampleNames(body)
	if err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	return exposition{body: body, fams: fams, names: names}
}

// sampleNames returns the sample names of a text exposition in order,
// and an error if a family's lines are not all together: the text
// format wants each family once, which expfmt's parser does not check
// for untyped samples like dragonboat's.
func sampleNames(body string) ([]string, error) {
	var names []string
	seen := map[string]bool{}    // sample names
	families := map[string]int{} // family -> line of its block
	family, typed := "", ""
	for i, line := range strings.Split(body, "\n") {
		if f, ok := strings.CutPrefix(line, "# TYPE "); ok {
			typed, _, _ = strings.Cut(f, " ")
			continue
		}
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		end := strings.IndexAny(line, "{ ")
		if end <= 0 {
			return nil, fmt.Errorf("line %d is no sample: %q", i+1, line)
		}
		name := line[:end]
		if !seen[name] {
			seen[name] = true
			names = append(names, name)
		}
		fam := name
		if typed != "" && (name == typed || strings.HasPrefix(name, typed+"_") &&
			slices.Contains([]string{"_bucket", "_sum", "_count", "_total"}, name[len(typed):])) {
			fam = typed
		}
		if fam == family {
			continue
		}
		if at, again := families[fam]; again {
			return nil, fmt.Errorf("family %s at line %d and again at line %d: %q", fam, at+1, i+1, line)
		}
		families[fam], family = i, fam
	}
	return names, nil
}

// keyLeaks returns the labels of e named like a key ("key",
// "lockmesh_key", ...) and the lines of e that contain any of keys, in a
// label value, a name or a help text.
func keyLeaks(e exposition, keys []string) []string {
	var leaks []string
	for _, f := range e.fams {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if strings.Contains(strings.ToLower(l.GetName()), "key") {
					leaks = append(leaks, fmt.Sprintf("%s{%s=%q}", f.GetName(), l.GetName(), l.GetValue()))
				}
			}
		}
	}
	for _, line := range strings.Split(e.body, "\n") {
		if slices.ContainsFunc(keys, func(k string) bool { return strings.Contains(line, k) }) {
			leaks = append(leaks, line)
		}
	}
	return leaks
}

// leakyExposition has a key label and a key in a label value.
const leakyExposition = `# TYPE lockmesh_shard_keys gauge
lockmesh_shard_keys{shard="1"} 3
lockmesh_acquire_duration_seconds_count{lockmesh_key="a",result="granted"} 1
lockmesh_wait_duration_seconds_count{primitive="acct/42"} 1
`

// series returns the samples of family name.
func series(fams map[string]*dto.MetricFamily, name string) []*dto.Metric {
	if f, ok := fams[name]; ok {
		return f.GetMetric()
	}
	return nil
}

// histCount sums the sample counts of histogram name's series that have
// every label of match.
func histCount(fams map[string]*dto.MetricFamily, name string, match map[string]string) float64 {
	total := 0.0
	for _, m := range series(fams, name) {
		ok := true
		for k, v := range match {
			ok = ok && label(m, k) == v
		}
		if ok {
			total += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return total
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// grep returns the lines of body that contain s.
func grep(body, s string) string {
	var out []string
	for _, line := range strings.Split(body, "\n") {
		if strings.Contains(line, s) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
