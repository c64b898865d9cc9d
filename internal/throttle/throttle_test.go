package throttle

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestWarnerHoldsBackAndCounts(t *testing.T) {
	var buf bytes.Buffer
	l := slog.New(slog.NewTextHandler(&buf, nil))
	w := Warner{Every: time.Hour}
	for range 5 {
		w.Warn(l, "refused")
	}
	if got := strings.Count(buf.String(), "refused"); got != 1 {
		t.Fatalf("%d warnings within the period, want 1: %s", got, buf.String())
	}
	w.last = time.Now().Add(-2 * time.Hour)
	w.Warn(l, "refused")
	if !strings.Contains(buf.String(), "suppressed_since_last=4") {
		t.Fatalf("the next warning does not count the 4 held back: %s", buf.String())
	}
}
