package main

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestStatusPageInBrowser drives peer-1's status page in a headless
// Chromium while demoKey is held by peer-1 and waited for by peer-2 and
// peer-3: the page must show the holder with its token and both waiters
// in their order, list the key among the most contended, and follow a
// handoff on its own. It saves a full-page screenshot (see
// screenshotPath).
func TestStatusPageInBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-peer cluster on disk and a browser")
	}
	browser := findBrowser(t)
	// One bound for everything, cluster and browser: a stuck step fails
	// the test instead of hanging it.
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)

	started := time.Now()
	d, err := startDemo(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	srv := httptest.NewServer(d.Handler())
	t.Cleanup(srv.Close)
	t.Logf("cluster and scene ready in %v; page at %s%s", time.Since(started).Round(time.Millisecond), srv.URL, mountPath)

	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(browser),
		chromedp.Headless,
		// The tests run as root in containers, where Chromium's sandbox
		// cannot start.
		chromedp.NoSandbox,
		chromedp.WindowSize(1280, 900),
	)...)
	t.Cleanup(cancelAlloc)
	page, cancelPage := chromedp.NewContext(allocCtx, chromedp.WithLogf(t.Logf))
	t.Cleanup(cancelPage)

	// Open the page as an operator would, at the mount point, and look the
	// key up through the form.
	err = chromedp.Do(page,
		chromedp.Navigate(srv.URL+mountPath),
		chromedp.WaitVisible(chromedp.ID("k")),
		chromedp.SendKeys(chromedp.ID("k"), demoKey),
		chromedp.Submit(chromedp.ID("k")),
		chromedp.WaitVisible(chromedp.ID("key-result")),
	)
	if err != nil {
		t.Fatalf("opening the page and looking %q up: %v", demoKey, err)
	}
	// One screenshot: of the scene below once checked, or of whatever the
	// page showed when a check failed.
	shot := false
	screenshot := func() {
		if !shot {
			shot = true
			saveScreenshot(t, page)
		}
	}
	defer screenshot()

	holder := d.Peers[0].Name()
	token := strconv.FormatUint(d.Held.Token(), 10)
	t.Run("key lookup shows the holder and its waiters in order", func(t *testing.T) {
		waitForPage(t, page, time.Now().Add(30*time.Second), fmt.Sprintf("%s holding with token %s, then %s and %s waiting", holder, token, d.Peers[1].Name(), d.Peers[2].Name()),
			fmt.Sprintf(`rows("key-holders").length === 1 && rows("key-holders")[0][0] === %q && rows("key-holders")[0][2] === %q &&
				rows("key-waiters").length === 2 &&
				rows("key-waiters")[0][0] === "1" && rows("key-waiters")[0][1] === %q &&
				rows("key-waiters")[1][0] === "2" && rows("key-waiters")[1][1] === %q`,
				holder, token, d.Peers[1].Name(), d.Peers[2].Name()))
	})
	// The tables below come from Status and Top, refreshed together every
	// 2 s: they share one wait, so a page that never fills them fails the
	// three checks in 30 s, not 90.
	tablesBy := time.Now().Add(30 * time.Second)
	topShown := t.Run("contended keys list the key with its waiters", func(t *testing.T) {
		waitForPage(t, page, tablesBy, fmt.Sprintf("%q with 2 waiters in the contended table", demoKey),
			fmt.Sprintf(`rows("contended").some(r => r[0] === %q && r[2] === "2")`, demoKey))
	})
	holdsShown := t.Run("longest holds list the holder", func(t *testing.T) {
		waitForPage(t, page, tablesBy, fmt.Sprintf("%q held by %s with token %s in the longest holds", demoKey, holder, token),
			fmt.Sprintf(`rows("holds").some(r => r[0] === %q && r[2] === %q && r[4] === %q)`, demoKey, holder, token))
	})
	topShown = topShown && holdsShown
	t.Run("status shows the peer, members and shards", func(t *testing.T) {
		waitForPage(t, page, tablesBy, fmt.Sprintf("header naming %s, 3 alive members, shards each with a leader", holder),
			fmt.Sprintf(`document.getElementById("peer").textContent === %q &&
				rows("members").filter(r => r[1] === "alive").length === 3 &&
				rows("shards").length > 0 && rows("shards").every(r => r[1] !== "no leader" && r[1] !== "")`, holder))
	})
	// The screenshot is of the scene above; the handoff comes after it.
	screenshot()

	// Hand the key over and watch the open page follow, with no reload.
	// A mark on the document would not survive a navigation, so finding it
	// afterwards proves the script redrew the tables in place.
	if _, err := chromedp.Run(page, chromedp.Evaluate[bool](`window.lockmeshMark = true`)); err != nil {
		t.Fatal(err)
	}
	if err := d.Release(ctx); err != nil {
		t.Fatalf("%s unlocking %q: %v", holder, demoKey, err)
	}
	next, last := d.Peers[1].Name(), d.Peers[2].Name()
	t.Run("key lookup follows a handoff on its own", func(t *testing.T) {
		waitForPage(t, page, time.Now().Add(30*time.Second), fmt.Sprintf("%s holding after the handoff, %s alone waiting", next, last),
			fmt.Sprintf(`window.lockmeshMark === true &&
				rows("key-holders").length === 1 && rows("key-holders")[0][0] === %q && rows("key-holders")[0][2] !== %q &&
				rows("key-waiters").length === 1 && rows("key-waiters")[0][1] === %q`,
				next, token, last))
	})
	t.Run("contended keys and holds follow a handoff on their own", func(t *testing.T) {
		if !topShown {
			t.Fatal("not waited for: the tables did not show the scene before the handoff either")
		}
		waitForPage(t, page, time.Now().Add(30*time.Second), fmt.Sprintf("%q with 1 waiter and held by %s in the tables", demoKey, next),
			fmt.Sprintf(`window.lockmeshMark === true &&
				rows("contended").some(r => r[0] === %q && r[2] === "1") &&
				rows("holds").some(r => r[0] === %q && r[2] === %q) && !rows("holds").some(r => r[0] === %q && r[2] === %q) &&
				!document.querySelector(".error:not([hidden])")`,
				demoKey, demoKey, next, demoKey, holder))
	})
}

// rowsJS defines rows(id): the text of each cell of table id's body rows,
// leaving out the "nobody ..." placeholder row.
const rowsJS = `const rows = (id) => [...document.querySelectorAll("#" + id + " tbody tr:not(.empty)")]
	.map(tr => [...tr.cells].map(td => td.textContent.trim()));`

// waitForPage polls the page's DOM until cond (a JavaScript expression
// that may use rows) holds, failing with what was awaited and the tables'
// last content when it does not by deadline. It polls, never sleeps: the
// page refreshes every 2 s and the cluster takes its own time, and 30 s
// is many refreshes even on a loaded 2-core machine.
func waitForPage(t *testing.T, page context.Context, deadline time.Time, what, cond string) {
	t.Helper()
	fn := fmt.Sprintf(`() => { %s return (%s); }`, rowsJS, cond)
	// A timeout of 0 would mean none; a spent deadline still polls once.
	wait := max(time.Until(deadline), time.Millisecond)
	_, err := chromedp.Run(page, chromedp.PollFunction[bool](fn,
		chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(wait)))
	if err == nil {
		return
	}
	tables, _ := chromedp.Run(page, chromedp.Evaluate[string](`(() => { `+rowsJS+`
		const out = {};
		for (const t of document.querySelectorAll("table")) out[t.id] = rows(t.id);
		for (const e of document.querySelectorAll(".error:not([hidden])")) out["error " + e.id] = e.textContent;
		return JSON.stringify(out, null, 1);
	})()`))
	t.Fatalf("page did not show %s: %v\npage tables:\n%s", what, err, tables)
}

// saveScreenshot writes a full-page PNG of the page to screenshotPath and
// logs where.
func saveScreenshot(t *testing.T, page context.Context) {
	t.Helper()
	path := screenshotPath(t)
	png, err := chromedp.Run(page, chromedp.FullScreenshot(100))
	if err != nil {
		t.Errorf("screenshot: %v", err)
		return
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Errorf("saving the screenshot: %v", err)
		return
	}
	t.Logf("screenshot of the status page (%d KB): %s", len(png)/1024, path)
}

// screenshotPath is statuspage.png in $LOCKMESH_ARTIFACTS when set (CI
// collects that directory), else lockmesh-statuspage.png in the system's
// temporary directory, where it outlives the test for a look.
func screenshotPath(t *testing.T) string {
	if dir := os.Getenv("LOCKMESH_ARTIFACTS"); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatalf("LOCKMESH_ARTIFACTS: %v", err)
		}
		return filepath.Join(dir, "statuspage.png")
	}
	return filepath.Join(os.TempDir(), "lockmesh-statuspage.png")
}

// findBrowser returns the path of a Chromium. Without one the test skips
// on a developer's machine, but fails in CI (CI set), where a skip would
// pass for a test that never ran.
func findBrowser(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	if os.Getenv("CI") == "" {
		t.Skip("no chromium, chromium-browser or google-chrome on PATH; install one (apt-get install -y chromium) to run the status page in a browser")
	}
	t.Fatal("CI is set but no chromium, chromium-browser or google-chrome is on PATH: install it (apt-get install -y chromium)")
	return ""
}
