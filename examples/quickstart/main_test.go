package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestQuickstartRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-peer cluster on disk")
	}
	var out bytes.Buffer
	if err := run(context.Background(), &out); err != nil {
		t.Fatalf("%v\noutput:\n%s", err, out.String())
	}
	for _, want := range []string{"refused", "was handed the lock", "rejected a late write", "done"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
