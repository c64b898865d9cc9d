package node

import (
	"log/slog"
	"strings"
	"testing"
)

// dragonboat's lines go to the Logger of the first node started in the
// process, never to a later node's (as Config.Logger documents).
func TestDragonboatLoggerIsTheFirstNodes(t *testing.T) {
	old := dbLogger.Swap(nil) // as if no node had started yet
	t.Cleanup(func() { dbLogger.Store(old) })

	first, second := newLogRecorder(), newLogRecorder()
	installDragonboatLogger(slog.New(first))
	installDragonboatLogger(slog.New(second))
	const marker = "a line only this test logs"
	(&dbLog{pkg: "dragonboat"}).Errorf("[%05d:%05d] %s", 3, 2, marker)

	if n := countMessages(first, marker); n != 1 {
		t.Errorf("first node's Logger got the line %d times, want once", n)
	}
	if n := countMessages(second, marker); n != 0 {
		t.Errorf("second node's Logger got the first's dragonboat line %d times, want never", n)
	}
}

func countMessages(r logRecorder, substr string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, rec := range *r.records {
		if strings.Contains(rec.Message, substr) {
			n++
		}
	}
	return n
}
