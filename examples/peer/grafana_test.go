package main

import (
	"cmp"
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// exportedNames are the Prometheus names the OpenTelemetry Prometheus
// exporter gives lockmesh's instruments (node/telemetry.go), by its rules:
// dots become underscores; unit "s" adds _seconds and unit "1" adds
// _ratio, while a unit in braces ("{session}") adds nothing; a histogram
// comes as _bucket, _count and _sum; a counter, observable or not, gets
// _total. TestMetrics checks every lockmesh_ name of a real scrape
// against this list, so it follows the exporter, and TestGrafanaDashboard
// lets the dashboard use no other.
var exportedNames = func() map[string]bool {
	names := map[string]bool{}
	prom := func(otel string) string { return strings.ReplaceAll(otel, ".", "_") }
	for _, h := range []string{ // unit s
		"lockmesh.acquire.duration", "lockmesh.wait.duration", "lockmesh.hold.duration",
		"lockmesh.keepalive.duration", "lockmesh.proposal.duration", "lockmesh.raft.log.sync.duration",
	} {
		for _, suffix := range []string{"_seconds_bucket", "_seconds_count", "_seconds_sum"} {
			names[prom(h)+suffix] = true
		}
	}
	for _, c := range []string{ // counters and observable counters
		"lockmesh.lease.lost", "lockmesh.lease.lost.locks", "lockmesh.shard.leader.changes",
		"lockmesh.raft.entries", "lockmesh.raft.commands", "lockmesh.shard.grants",
	} {
		names[prom(c)+"_total"] = true
	}
	for _, g := range []string{ // observable gauges with a unit in braces
		"lockmesh.shard.sessions", "lockmesh.shard.keys", "lockmesh.shard.holders",
		"lockmesh.shard.waiters", "lockmesh.gossip.members",
	} {
		names[prom(g)] = true
	}
	names[prom("lockmesh.shard.has_leader")] = true // no unit
	return names
}()

// dashboardLabels are the labels a dashboard query may group or filter
// by: the instruments' attributes (none of them a key), the histogram
// buckets' le, and the target labels Prometheus adds.
var dashboardLabels = []string{"primitive", "result", "shard", "error", "path", "reason", "state", "le", "job", "instance"}

// TestGrafanaDashboard checks docs/grafana/lockmesh.json: it is a
// dashboard Grafana can import with the Prometheus data source picked at
// import (${DS_PROMETHEUS}), every panel has a title and a query, and
// every query reads only series the exporter produces and groups only by
// labels they have. It starts no peer.
func TestGrafanaDashboard(t *testing.T) {
	b, err := os.ReadFile("../../docs/grafana/lockmesh.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Inputs []struct {
			Name, Type, PluginID string
		} `json:"__inputs"`
		Title         string
		UID           string
		SchemaVersion int
		Templating    struct {
			List []struct {
				Name       string
				Datasource json.RawMessage
			}
		}
		Panels []panel
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("docs/grafana/lockmesh.json: %v", err)
	}
	if d.Title == "" || d.UID == "" || d.SchemaVersion < 36 {
		t.Errorf("title %q, uid %q, schemaVersion %d: want a title, a uid and schemaVersion 36 or later", d.Title, d.UID, d.SchemaVersion)
	}
	if !slices.ContainsFunc(d.Inputs, func(in struct{ Name, Type, PluginID string }) bool {
		return in.Name == "DS_PROMETHEUS" && in.Type == "datasource" && in.PluginID == "prometheus"
	}) {
		t.Errorf("__inputs %+v: want DS_PROMETHEUS, a prometheus datasource, so the import asks for it", d.Inputs)
	}
	for _, v := range d.Templating.List {
		if v.Datasource != nil && !strings.Contains(string(v.Datasource), "${DS_PROMETHEUS}") {
			t.Errorf("variable %s reads datasource %s, want ${DS_PROMETHEUS}", v.Name, v.Datasource)
		}
	}

	var panels []panel
	for _, p := range d.Panels {
		panels = append(panels, p)
		panels = append(panels, p.Panels...) // inside a collapsed row
	}
	ids := map[int]string{}
	queried := 0
	for _, p := range panels {
		if p.Type == "row" {
			continue
		}
		if p.Title == "" {
			t.Errorf("panel %d has no title", p.ID)
		}
		if other, dup := ids[p.ID]; dup {
			t.Errorf("panels %q and %q share id %d", other, p.Title, p.ID)
		}
		ids[p.ID] = p.Title
		if !strings.Contains(string(p.Datasource), "${DS_PROMETHEUS}") {
			t.Errorf("panel %q reads datasource %s, want ${DS_PROMETHEUS}", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no target", p.Title)
		}
		for _, tg := range p.Targets {
			if problems := checkExpr(tg.Expr); len(problems) > 0 {
				t.Errorf("panel %q, target %s: %s\n\texpr: %s", p.Title, tg.RefID, strings.Join(problems, "; "), tg.Expr)
			}
			queried++
		}
	}
	if queried < 13 {
		t.Errorf("%d queries in %d panels; the dashboard should show at least the 13 views of issue #20", queried, len(panels))
	}
}

type panel struct {
	ID         int
	Type       string
	Title      string
	Datasource json.RawMessage
	Targets    []struct {
		RefID string `json:"refId"`
		Expr  string
	}
	Panels []panel
}

var (
	// promString is a quoted PromQL string: a label value or a regex.
	promString = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	// promName is an identifier that may be a metric name.
	promName = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	// grouping is a by, without, on or ignoring clause.
	grouping = regexp.MustCompile(`\b(?:by|without|on|ignoring)\s*\(([^)]*)\)`)
	// matcher is a label matcher inside {...}.
	matcher = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
)

// checkExpr returns what is wrong with a panel's PromQL: a lockmesh_ name
// the exporter does not produce, no lockmesh_ name at all (a misspelled
// prefix), a label the series do not have, or a histogram_quantile not
// over _bucket rates grouped by le.
func checkExpr(expr string) []string {
	var problems []string
	if strings.TrimSpace(expr) == "" {
		return []string{"empty expr"}
	}
	// Labels first, while the matchers' values are still there to skip.
	for _, m := range matcher.FindAllStringSubmatch(expr, -1) {
		if !slices.Contains(dashboardLabels, m[1]) {
			problems = append(problems, "matches on label "+m[1]+", which lockmesh's series do not have")
		}
	}
	bare := promString.ReplaceAllString(expr, `""`)
	for _, g := range grouping.FindAllStringSubmatch(bare, -1) {
		for _, l := range strings.Split(g[1], ",") {
			if l = strings.TrimSpace(l); l != "" && !slices.Contains(dashboardLabels, l) {
				problems = append(problems, "groups by label "+l+", which lockmesh's series do not have")
			}
		}
	}
	metrics := 0
	for _, name := range promName.FindAllString(bare, -1) {
		if !strings.HasPrefix(name, "lockmesh_") {
			continue
		}
		metrics++
		if !exportedNames[name] {
			problems = append(problems, name+" is not a series the exporter produces")
		}
	}
	if metrics == 0 {
		problems = append(problems, "reads no lockmesh_ series")
	}
	if strings.Contains(bare, "histogram_quantile") && (!strings.Contains(bare, "_bucket") || !regexp.MustCompile(`\bby\s*\([^)]*\ble\b`).MatchString(bare)) {
		problems = append(problems, "histogram_quantile needs the rate of a _bucket series summed by le")
	}
	return problems
}

// TestCheckExpr shows the dashboard's checker catching what it is there
// for, so that TestGrafanaDashboard passing means something.
func TestCheckExpr(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want string // in a problem; "" for none
	}{
		{`sum by (result) (rate(lockmesh_acquire_duration_seconds_count{job=~"$job"}[$__rate_interval]))`, ""},
		{`histogram_quantile(0.99, sum by (primitive, le) (rate(lockmesh_hold_duration_seconds_bucket[5m])))`, ""},
		{`count(max by (shard) (lockmesh_shard_has_leader) == 0) or vector(0)`, ""},
		{`rate(lockmesh_acquire_duration_count[5m])`, "lockmesh_acquire_duration_count is not"},
		{`max by (shard) (lockmesh_shard_has_leader_ratio)`, "lockmesh_shard_has_leader_ratio is not"},
		{`rate(lockmesh_lease_lost[5m])`, "lockmesh_lease_lost is not"},
		{`rate(lockmsh_acquire_duration_seconds_count[5m])`, "reads no lockmesh_"},
		{`sum by (key) (lockmesh_shard_waiters)`, "groups by label key"},
		{`lockmesh_shard_waiters{lockmesh_key="a"}`, "matches on label lockmesh_key"},
		{`lockmesh_shard_waiters{shard="key"}`, ""}, // a value, not a label
		{`histogram_quantile(0.99, rate(lockmesh_hold_duration_seconds_bucket[5m]))`, "summed by le"},
		{`histogram_quantile(0.99, sum by (le) (rate(lockmesh_hold_duration_seconds_sum[5m])))`, "summed by le"},
		{` `, "empty"},
	} {
		problems := strings.Join(checkExpr(tc.expr), "; ")
		if tc.want == "" && problems != "" || !strings.Contains(problems, tc.want) {
			t.Errorf("checkExpr(%s) = %q, want %q", tc.expr, problems, cmp.Or(tc.want, "no problem"))
		}
	}
}
