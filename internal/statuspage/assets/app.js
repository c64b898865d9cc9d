// The lockmesh status page's refresh: every 2 s it reads the page's JSON
// endpoints (relative URLs, so the page works wherever it is mounted) and
// redraws the tables the server rendered. Key names and every other
// value are user data: they only ever reach the page as textContent.
"use strict";

(function () {
  const refreshEvery = 2000;
  const key = new URLSearchParams(location.search).get("k") || "";

  // el makes an element whose children are the given strings (as text)
  // and nodes.
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      e.setAttribute(name, value);
    }
    for (const c of children) {
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }

  function span(cls, text) {
    return el("span", { class: cls }, text);
  }

  function keyLink(k) {
    return el("a", { href: "?k=" + encodeURIComponent(k) }, k);
  }

  // fill replaces the rows of table id's body: one per item, or a single
  // row saying why there are none.
  function fill(id, items, row, empty) {
    const body = document.querySelector("#" + id + " tbody");
    const cols = document.querySelectorAll("#" + id + " thead th").length;
    const rows = items.map((item, i) => {
      const tr = el("tr");
      for (const cell of row(item, i)) {
        tr.append(cell instanceof Element && cell.tagName === "TD" ? cell : el("td", {}, cell));
      }
      return tr;
    });
    if (rows.length === 0) {
      rows.push(el("tr", { class: "empty" }, el("td", { colspan: String(cols) }, empty)));
    }
    body.replaceChildren(...rows);
  }

  function showError(id, err) {
    const p = document.getElementById(id);
    p.textContent = err ? String(err.message || err) : "";
    p.hidden = !err;
  }

  function text(id, value) {
    document.getElementById(id).replaceChildren(value);
  }

  function renderStatus(st) {
    text("peer", st.peer);
    text("release", st.release);
    text("cluster", st.cluster || "none yet");
    text("level", String(st.level));
    text("ready", st.ready ? "yes" : span("warn", "no"));
    text("peers-down", st.peers_down ? span("warn", String(st.peers_down)) : "0");
    text("leaderless", st.shards_without_leader ? span("warn", String(st.shards_without_leader)) : "0");
    fill("members", st.members, (m) => [
      m.name,
      m.alive ? "alive" : span("warn", "not alive"),
      m.level ? String(m.level) : "?",
      el("td", { class: "addrs" },
        ...[["gossip", m.gossip_addr], ["raft", m.raft_addr], ["rpc", m.rpc_addr]]
          .filter(([, a]) => a)
          .map(([what, a]) => el("div", {}, what + " " + a))),
      m.client_only ? "yes" : "",
    ], "no members known");
    fill("shards", st.shards, (s) => {
      const cells = [
        String(s.shard),
        s.leader || span("warn", "no leader"),
        el("td", { class: "replicas" }, ...s.replicas.map((r) => el("div", {},
          r.peer + (r.leader ? " ★" : "") + ": ",
          r.reported ? "applied " + r.applied + ", lag " + r.lag : span("muted", "not reported")))),
      ];
      if (s.counted) {
        cells.push(String(s.sessions), String(s.keys), String(s.holders), String(s.waiters));
      } else {
        cells.push(el("td", { colspan: "4", class: "muted" },
          "not counted: no replica here and the leader did not answer"));
      }
      return cells;
    }, "no shards known");
  }

  function renderTop(top) {
    const missing = document.getElementById("top-missing");
    missing.textContent = top.missing.length ? "shards that did not answer: " + top.missing.join(", ") : "";
    missing.hidden = top.missing.length === 0;
    fill("contended", top.contended, (c) => [
      keyLink(c.key),
      String(c.shard),
      String(c.waiters),
      c.waiters ? c.oldest_wait : "",
      String(c.handoffs),
      el("td", {}, c.total_wait,
        ...(c.overcount_ms ? [" ", span("muted", "(may be over by ≤" + c.overcount + ")")] : [])),
    ], "no key waited for");
    fill("holds", top.longest_holds, (h) => [
      keyLink(h.key), String(h.shard), h.peer, h.session, String(h.token), h.held_for,
    ], "no lock held");
  }

  function renderKey(info) {
    document.getElementById("key-result").hidden = false;
    text("key-name", info.key);
    text("key-shard", String(info.shard));
    fill("key-holders", info.holders, (h) => [h.peer, h.session, String(h.token), h.age, h.kind],
      "nobody holds the key");
    fill("key-waiters", info.waiters, (w, i) => [String(i + 1), w.peer, w.session, w.age, w.kind],
      "nobody waits");
  }

  // get reads one endpoint; a failure carries the server's error text.
  async function get(url) {
    const resp = await fetch(url, { cache: "no-store" });
    let body = null;
    try {
      body = await resp.json();
    } catch (e) {
      throw new Error(url + ": " + resp.status + " " + resp.statusText);
    }
    if (!resp.ok) {
      throw new Error(body && body.error ? body.error : url + ": " + resp.status);
    }
    return body;
  }

  // section fetches url and renders it, or shows why it could not; the
  // tables keep their last data meanwhile.
  function section(url, render, errorId) {
    return get(url).then((data) => {
      render(data);
      showError(errorId, null);
    }, (err) => showError(errorId, err));
  }

  async function refresh() {
    try {
      const jobs = [
        section("status.json", renderStatus, "status-error"),
        section("top.json?k=10", renderTop, "top-error"),
      ];
      if (key) {
        jobs.push(section("key?k=" + encodeURIComponent(key), renderKey, "key-error"));
      }
      await Promise.all(jobs);
      text("updated", new Date().toLocaleTimeString([], { hour12: false }));
      showError("refresh-error", null);
    } catch (err) {
      // A bug in the rendering must not stop the refreshing.
      showError("refresh-error", err);
    }
    // Chained, not an interval: a slow cluster never has requests pile up.
    setTimeout(refresh, refreshEvery);
  }

  setTimeout(refresh, refreshEvery);
})();
