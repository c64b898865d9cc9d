package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
)

func TestScaleoutRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("grows a cluster from 3 to 6 peers on disk")
	}
	var out bytes.Buffer
	if err := run(context.Background(), &out); err != nil {
		t.Fatalf("%v\noutput:\n%s", err, out.String())
	}
	t.Logf("output:\n%s", out.String())
	if strings.Contains(out.String(), "NOT settled") {
		t.Errorf("a step did not settle within %v", settleBound)
	}
	for _, want := range []string{"peer-4 joined: layout settled", "peer-6 joined: layout settled", "left gracefully", "tokens increased"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
	lines := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
	if len(lines) < 2 {
		t.Fatalf("output has %d lines", len(lines))
	}
	// Five peers remain (peer-3 left), in name order; 17 shards (meta and
	// 16 lock shards) times 3 replicas over 5 peers is 10 or 11 each.
	last := lines[len(lines)-2:]
	for i, re := range []*regexp.Regexp{
		regexp.MustCompile(`^replicas per peer: peer-1=(10|11) peer-2=(10|11) peer-4=(10|11) peer-5=(10|11) peer-6=(10|11)$`),
		regexp.MustCompile(`^leaders per peer: peer-1=[1-9]\d* peer-2=[1-9]\d* peer-4=[1-9]\d* peer-5=[1-9]\d* peer-6=[1-9]\d*$`),
	} {
		if !re.MatchString(last[i]) {
			t.Errorf("line %q does not match %s", last[i], re)
		}
	}
}
