package bench

import (
	"encoding/json"
	"fmt"
	"html"
	"io"
	"math"
	"slices"
	"strings"
)

// WriteJSONL writes one JSON object per result, one a line.
func WriteJSONL(w io.Writer, results []Result) error {
	enc := json.NewEncoder(w)
	for _, r := range results {
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return nil
}

// ReadJSONL reads what WriteJSONL wrote.
func ReadJSONL(r io.Reader) ([]Result, error) {
	dec := json.NewDecoder(r)
	var out []Result
	for dec.More() {
		var res Result
		if err := dec.Decode(&res); err != nil {
			return out, err
		}
		out = append(out, res)
	}
	return out, nil
}

// headline is the number a workload is judged by: handoffs for one hot key,
// ops for the rest.
func headline(r Result) float64 {
	if r.Workload == "contended" {
		return r.HandoffsPerSec
	}
	return r.OpsPerSec
}

func headlineUnit(workload string) string {
	if workload == "contended" {
		return "handoffs/s"
	}
	return "ops/s"
}

type cellKey struct {
	system, workload string
	c                int
}

func order(results []Result) (systems, workloads []string, concs []int, cells map[cellKey]Result) {
	cells = map[cellKey]Result{}
	for _, r := range results {
		if !slices.Contains(systems, r.System) {
			systems = append(systems, r.System)
		}
		if !slices.Contains(workloads, r.Workload) {
			workloads = append(workloads, r.Workload)
		}
		if !slices.Contains(concs, r.Concurrency) {
			concs = append(concs, r.Concurrency)
		}
		cells[cellKey{r.System, r.Workload, r.Concurrency}] = r
	}
	slices.Sort(concs)
	return systems, workloads, concs, cells
}

// WriteMarkdown writes two tables: the headline number of each system per
// workload and concurrency with lockmesh/peer ratios (handoffs/s for the
// contended workload, ops/s otherwise), and every measured field. A
// system that lacks a workload's lock has "–" in its cells.
func WriteMarkdown(w io.Writer, results []Result) error {
	systems, workloads, concs, cells := order(results)
	var peers []string
	for _, s := range systems {
		if s != "lockmesh" {
			peers = append(peers, s)
		}
	}
	hasLM := slices.Contains(systems, "lockmesh")
	var b strings.Builder
	b.WriteString("| workload | c | unit |")
	for _, s := range systems {
		fmt.Fprintf(&b, " %s |", s)
	}
	if hasLM {
		for _, p := range peers {
			fmt.Fprintf(&b, " lockmesh/%s |", p)
		}
	}
	b.WriteString("\n|---|--:|---|")
	b.WriteString(strings.Repeat("--:|", len(systems)))
	if hasLM {
		b.WriteString(strings.Repeat("--:|", len(peers)))
	}
	b.WriteString("\n")
	for _, wl := range workloads {
		for _, c := range concs {
			fmt.Fprintf(&b, "| %s | %d | %s |", wl, c, headlineUnit(wl))
			for _, s := range systems {
				r, ok := cells[cellKey{s, wl, c}]
				if !ok {
					b.WriteString(" – |")
					continue
				}
				fmt.Fprintf(&b, " %s |", num(headline(r)))
			}
			if hasLM {
				lm, ok := cells[cellKey{"lockmesh", wl, c}]
				for _, p := range peers {
					pr, ok2 := cells[cellKey{p, wl, c}]
					if !ok || !ok2 || headline(pr) == 0 {
						b.WriteString(" – |")
						continue
					}
					fmt.Fprintf(&b, " %.2f× |", headline(lm)/headline(pr))
				}
			}
			b.WriteString("\n")
		}
	}
	b.WriteString("\n| system | workload | c | ops/s | handoffs/s | p50 ms | p99 ms | p99.9 ms | grant p50 ms | grant p99 ms | errors | violations | fencing | CPU s | CPU µs/op | disk flushes/op | cmds/entry |\n")
	b.WriteString("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|--:|--:|--:|--:|\n")
	for _, s := range systems {
		for _, wl := range workloads {
			for _, c := range concs {
				r, ok := cells[cellKey{s, wl, c}]
				if !ok {
					continue
				}
				fmt.Fprintf(&b, "| %s | %s | %d | %s | %s | %.2f | %.2f | %.2f | %.2f | %.2f | %d | %d | %s | %.1f | %.0f | %s | %s |\n",
					s, wl, c, num(r.OpsPerSec), num(r.HandoffsPerSec), r.P50ms, r.P99ms, r.P999ms,
					r.GrantP50ms, r.GrantP99ms, r.Errors, r.Violations, r.Fencing, r.CPUSeconds,
					r.CPUMicrosPerOp, optNum(r.FlushesPerOp), optNum(r.CommandsPerEntry))
			}
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func num(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

// palette gives each system a fixed colour where it can, so plots of
// different runs compare at a glance.
var palette = map[string]string{
	"lockmesh":       "#d62728",
	"lockmesh-3proc": "#ff7f0e",
	"etcd":           "#1f77b4",
	"zookeeper":      "#2ca02c",
	"redis":          "#9467bd",
	"redlock":        "#8c564b",
}

var spare = []string{"#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}

// WriteSVG plots the headline number against concurrency, one panel per
// workload and one line per system, on log-log axes (the systems differ by
// orders of magnitude). It is plain SVG written by hand.
func WriteSVG(w io.Writer, results []Result) error {
	systems, workloads, concs, cells := order(results)
	const (
		pw, ph             = 420, 300 // panel size
		ml, mr, mt, mb     = 70, 20, 40, 50
		legendH            = 30
		gridLines, maxCols = 5, 2
	)
	cols := min(len(workloads), maxCols)
	rows := (len(workloads) + cols - 1) / max(cols, 1)
	width, height := cols*pw, rows*ph+legendH
	colour := map[string]string{}
	for i, s := range systems {
		if c, ok := palette[s]; ok {
			colour[s] = c
		} else {
			colour[s] = spare[i%len(spare)]
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="11">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	// Legend.
	x := 10
	for _, s := range systems {
		fmt.Fprintf(&b, `<line x1="%d" y1="15" x2="%d" y2="15" stroke="%s" stroke-width="3"/><text x="%d" y="19">%s</text>`+"\n",
			x, x+20, colour[s], x+25, html.EscapeString(s))
		x += 35 + 7*len(s)
	}
	for i, wl := range workloads {
		ox, oy := (i%cols)*pw, legendH+(i/cols)*ph
		x0, x1, y0, y1 := ox+ml, ox+pw-mr, oy+ph-mb, oy+mt
		// Y range over this panel, in decades.
		lo, hi := math.Inf(1), math.Inf(-1)
		for _, s := range systems {
			for _, c := range concs {
				if r, ok := cells[cellKey{s, wl, c}]; ok && headline(r) > 0 {
					lo, hi = math.Min(lo, headline(r)), math.Max(hi, headline(r))
				}
			}
		}
		if math.IsInf(lo, 1) {
			lo, hi = 1, 10
		}
		dlo, dhi := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
		if dhi <= dlo {
			dhi = dlo + 1
		}
		ypos := func(v float64) float64 {
			return float64(y0) - (math.Log10(v)-dlo)/(dhi-dlo)*float64(y0-y1)
		}
		xpos := func(j int) float64 {
			if len(concs) == 1 {
				return float64(x0+x1) / 2
			}
			return float64(x0) + float64(j)/float64(len(concs)-1)*float64(x1-x0)
		}
		fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="13" font-weight="bold">%s: %s vs concurrency</text>`+"\n",
			x0, oy+mt-15, html.EscapeString(wl), headlineUnit(wl))
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#999"/>`+"\n", x0, y1, x1-x0, y0-y1)
		for d := dlo; d <= dhi; d++ {
			y := ypos(math.Pow(10, d))
			fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n",
				x0, y, x1, y, x0-5, y+4, num(math.Pow(10, d)))
		}
		for j, c := range concs {
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%d</text>`+"\n", xpos(j), y0+15, c)
		}
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">concurrency (workers)</text>`+"\n", (x0+x1)/2, y0+35)
		for _, s := range systems {
			var pts []string
			for j, c := range concs {
				r, ok := cells[cellKey{s, wl, c}]
				if !ok || headline(r) <= 0 {
					continue
				}
				px, py := xpos(j), ypos(headline(r))
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", px, py))
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"><title>%s %s c=%d: %s %s</title></circle>`+"\n",
					px, py, colour[s], html.EscapeString(s), wl, c, num(headline(r)), headlineUnit(wl))
			}
			if len(pts) > 1 {
				fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>`+"\n", strings.Join(pts, " "), colour[s])
			}
		}
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}
