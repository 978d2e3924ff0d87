"""The dashboard's page: one HTML document, its style and a small script (no build step).

The page comes with the server's figures of its moment and the counters of the last 5
minutes (which the server keeps), so it shows them at once; the script then opens
``/dashboard/events`` (with the page's own query, so a ``?key=``
goes along), keeps the last few minutes of snapshots and redraws the tables:
per class, per worker (each running request with its class and progress), what
happened in the last 5 minutes (completions, preemptions, rejections by reason,
from the counters' differences) and per tenant. Text goes in with
``textContent`` only.
"""

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>laneway</title>
<style>
  :root { color-scheme: light dark; --line: #8884; --bar: #3b82f6; }
  body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5rem; }
  h1 { font-size: 1.3rem; margin: 0 0 .2rem; }
  h2 { font-size: 1rem; margin: 1.4rem 0 .4rem; }
  #status { color: #888; font-size: .9rem; }
  table { border-collapse: collapse; min-width: 28rem; }
  th, td { border-bottom: 1px solid var(--line); padding: .25rem .7rem; text-align: right; }
  th:first-child, td:first-child { text-align: left; }
  td.bar { width: 10rem; text-align: left; }
  .bar span { display: inline-block; height: .7rem; background: var(--bar); vertical-align: middle; }
  .grid { display: flex; flex-wrap: wrap; gap: 0 2.5rem; }
</style>
</head>
<body>
<h1>laneway</h1>
<div id="status">connecting…</div>
<div class="grid">
  <section><h2>Classes</h2>
    <table id="classes"><thead><tr><th>class</th><th>queued</th><th>running</th>
      <th>oldest wait</th><th>estimated wait</th></tr></thead><tbody></tbody></table></section>
  <section><h2>Last 5 minutes</h2>
    <table id="recent"><thead><tr><th>class</th><th>completed</th><th>preempted</th>
      </tr></thead><tbody></tbody></table>
    <table id="rejections"><thead><tr><th>rejected, by reason</th><th>last 5 min</th><th>total</th>
      </tr></thead><tbody></tbody></table></section>
</div>
<h2>Workers</h2>
<table id="workers"><thead><tr><th>worker</th><th>slots busy</th><th class="bar"></th>
  <th title="requests it is sent at once, adapted to its engine's own gauges">at once</th>
  <th title="prefix cache hits: expected by placement / reported by its engine">prefix hits</th>
  <th>request</th><th>class</th><th>tenant</th><th>progress</th><th>running</th></tr></thead>
  <tbody></tbody></table>
<section id="fleet" hidden><h2>GPUs</h2>
<table id="gpus"><thead><tr><th>GPU</th><th>node</th><th>VRAM used</th><th class="bar"></th>
  <th>replica</th><th>model</th><th>engine</th><th>loads took</th></tr></thead><tbody></tbody></table>
</section>
<h2>Batches</h2>
<table id="batches"><thead><tr><th>batch</th><th>tenant</th><th>class</th><th>status</th>
  <th>progress</th><th class="bar"></th><th>failed</th><th>expires in</th></tr></thead><tbody></tbody></table>
<h2>Tenants</h2>
<table id="tenants"><thead><tr><th>tenant</th><th>queued</th><th>running</th><th>completed</th>
  <th>prompt tokens</th><th>completion tokens</th></tr></thead><tbody></tbody></table>
<script>
"use strict";
const WINDOW_S = 300;
const history = [];

function secs(v) {
  if (v === null || v === undefined) return "–";
  if (v < 1) return (v * 1000).toFixed(0) + " ms";
  if (v < 120) return v.toFixed(1) + " s";
  return (v / 60).toFixed(1) + " min";
}

function fill(id, rows) {
  const body = document.querySelector("#" + id + " tbody");
  const out = [];
  for (const row of rows) {
    const tr = document.createElement("tr");
    for (const cell of row) {
      const td = document.createElement("td");
      if (cell instanceof Node) { td.className = "bar"; td.appendChild(cell); }
      else td.textContent = String(cell);
      tr.appendChild(td);
    }
    out.push(tr);
  }
  body.replaceChildren(...out);
}

function bar(part, whole) {
  const s = document.createElement("span");
  s.style.width = (whole ? Math.round(100 * part / whole) : 0) + "%";
  return s;
}

function render(snap) {
  history.push(snap);
  while (history.length > 1 && snap.time - history[0].time > WINDOW_S) history.shift();
  const old = history[0];
  const before = Object.fromEntries(old.classes.map(c => [c.name, c]));
  fill("classes", snap.classes.map(c => [c.name, c.queued, c.running, secs(c.oldest_wait_s),
                                          secs(c.estimate_s)]));
  fill("recent", snap.classes.map(c => [c.name, c.completed - before[c.name].completed,
                                         c.preemptions - before[c.name].preemptions]));
  const reasons = Object.keys(snap.rejections).sort();
  fill("rejections", reasons.length ? reasons.map(r => [r, snap.rejections[r] - (old.rejections[r] || 0),
                                                         snap.rejections[r]]) : [["none", 0, 0]]);
  const rows = [];
  const pct = v => v == null ? "—" : Math.round(v * 100) + "%";
  for (const w of snap.workers) {
    const busy = w.busy + " / " + w.slots;
    const once = w.concurrency == null ? "—" : String(w.concurrency);
    const hits = w.prefix_hits_expected == null && w.prefix_hits_reported == null ? "—"
      : pct(w.prefix_hits_expected) + " / " + pct(w.prefix_hits_reported);
    const name = w.name + (w.isolate ? " (isolated)" : "") + (w.up ? "" : " (down)");
    const head = [name, busy, bar(w.busy, w.slots), once, hits];
    if (!w.running.length) rows.push([...head, "", "", "", "", ""]);
    w.running.forEach((r, i) => rows.push([
      ...(i ? ["", "", "", "", ""] : head),
      r.id, r.class, r.tenant || "", r.tokens + (r.max_tokens ? " / " + r.max_tokens : "") + " tokens",
      secs(r.running_s)]));
  }
  fill("workers", rows);
  const fleet = document.getElementById("fleet");
  fleet.hidden = !snap.gpus;
  if (snap.gpus) {
    const gpuRows = [];
    const took = m => (snap.load_s[m] || []).map(t => t.toFixed(1) + " s").join(", ") || "—";
    for (const g of snap.gpus) {
      const head = [g.id + (g.reserved_for ? " (reserved)" : ""), g.node,
                    g.vram_used_gb + " / " + g.vram_total_gb + " GB", bar(g.vram_used_gb, g.vram_total_gb)];
      if (!g.replicas.length) gpuRows.push([...head, "", "", "", ""]);
      g.replicas.forEach((r, i) => gpuRows.push([...(i ? ["", "", "", ""] : head),
                                                  r.id, r.model + (r.adapters && r.adapters.length ?
                                                  " + " + r.adapters.join(", ") : ""),
                                                  r.state, took(r.model)]));
    }
    fill("gpus", gpuRows);
  }
  const batches = snap.batches;
  fill("batches", batches == null ? [["(the store cannot be reached)", "", "", "", "", "", "", ""]]
    : batches.length ? batches.map(b => [b.id, b.tenant || "", b.priority, b.status,
        b.done + b.failed + " / " + (b.total || "?"), bar(b.done + b.failed, b.total), b.failed,
        secs(b.expires_in_s)])
    : [["none running", "", "", "", "", "", "", ""]]);
  fill("tenants", snap.tenants.map(t => [t.name, t.queued, t.running, t.completed || 0,
                                          t.prompt_tokens || 0, t.completion_tokens || 0]));
  document.getElementById("status").textContent =
    "live: " + new Date(snap.time * 1000).toLocaleTimeString();
}

// the server's figures of this moment and of the last minutes, sent with the page
const FIRST = /*FIRST*/null;
if (FIRST) { history.push(...FIRST.past); render(FIRST.now); }
const source = new EventSource("dashboard/events" + location.search);
source.onmessage = e => render(JSON.parse(e.data));
source.onerror = () => { document.getElementById("status").textContent = "reconnecting…"; };
</script>
</body>
</html>
"""
