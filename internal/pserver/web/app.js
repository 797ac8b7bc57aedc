// Kipimo live dashboard: pulls the state once, then applies the updates the
// server pushes every io_step over Server-Sent Events. Plain JS, no libraries.
"use strict";
(function () {
  const MAX_STEPS = 200;
  const params = new URLSearchParams(location.search);
  const token = params.get("token");
  const withToken = (u) => token ? u + (u.includes("?") ? "&" : "?") + "token=" + encodeURIComponent(token) : u;
  const $ = (id) => document.getElementById(id);
  const state = { ranks: [], steps: new Map(), series: new Map(), config: {}, layout: null };
  const k = (r) => r.pid + ":" + r.rank;
  const rankLabel = (r) => r.pid ? r.pid + ":" + r.rank : String(r.rank);
  window.kipimo = state;

  async function getJSON(url) {
    const res = await fetch(withToken(url));
    let body = null;
    try { body = await res.json(); } catch (e) { /* not JSON */ }
    if (!res.ok) throw new Error((body && body.error) || (res.status + " " + res.statusText));
    return body;
  }
  const fmt = (x) => {
    if (typeof x !== "number") return String(x);
    if (Number.isInteger(x)) return x.toLocaleString("en-US");
    return Math.abs(x) >= 1000 ? x.toFixed(0) : x.toPrecision(4);
  };
  function cell(tr, v, num) { const td = document.createElement("td"); td.textContent = v; if (num) td.className = "num"; tr.appendChild(td); return td; }

  function applyHeat(h) {
    for (const r of h.ranks) if (!state.ranks.some((x) => k(x) === k(r))) state.ranks.push(r);
    state.ranks.sort((a, b) => a.pid - b.pid || a.rank - b.rank);
    h.steps.forEach((step) => state.steps.set(step, new Map()));
    for (const [ri, si, n] of h.cells) state.steps.get(h.steps[si]).set(k(h.ranks[ri]), n);
    const keys = [...state.steps.keys()].sort((a, b) => a - b);
    while (keys.length > MAX_STEPS) state.steps.delete(keys.shift());
  }
  function applySeries(points) {
    for (const p of points) state.series.set(p.io_step, p);
    const keys = [...state.series.keys()].sort((a, b) => a - b);
    while (keys.length > 2000) state.series.delete(keys.shift());
  }

  function drawHeat() {
    const c = $("heatmap"), g = c.getContext("2d");
    g.fillStyle = "#fff"; g.fillRect(0, 0, c.width, c.height);
    const steps = [...state.steps.keys()].sort((a, b) => a - b);
    const ranks = state.ranks, x0 = 48, y0 = 4, w = c.width - x0 - 4, h = c.height - y0 - 18;
    if (!ranks.length || !steps.length) { state.layout = null; return; }
    let mx = 1;
    for (const m of state.steps.values()) for (const v of m.values()) mx = Math.max(mx, v);
    const cw = w / steps.length, rh = h / ranks.length;
    const rows = ranks.map((r, i) => ({ pid: r.pid, rank: r.rank, y: y0 + i * rh, h: rh }));
    steps.forEach((s, si) => {
      const m = state.steps.get(s);
      ranks.forEach((r, ri) => {
        const v = m.get(k(r)) || 0;
        if (!v) return;
        const t = Math.sqrt(v / mx);
        g.fillStyle = `rgb(255,${Math.round(235 * (1 - t))},${Math.round(220 * (1 - t))})`;
        g.fillRect(x0 + si * cw, y0 + ri * rh, Math.max(cw, 1), Math.max(rh, 1));
      });
    });
    g.fillStyle = "#5b6573"; g.font = "11px sans-serif"; g.textBaseline = "middle";
    const every = Math.max(1, Math.ceil(12 / rh));
    ranks.forEach((r, i) => { if (i % every === 0) g.fillText(rankLabel(r), 2, y0 + i * rh + rh / 2); });
    g.textBaseline = "top";
    g.fillText("step " + steps[0], x0, c.height - 14);
    const last = "step " + steps[steps.length - 1];
    g.fillText(last, c.width - 4 - g.measureText(last).width, c.height - 14);
    $("heat-range").textContent = `${ranks.length} ranks x ${steps.length} steps, max ${mx} anomalies per cell`;
    state.layout = { x0, x1: x0 + w, rows };
  }

  function drawSeries() {
    const c = $("series"), g = c.getContext("2d");
    g.fillStyle = "#fff"; g.fillRect(0, 0, c.width, c.height);
    const pts = [...state.series.values()].sort((a, b) => a.io_step - b.io_step).slice(-MAX_STEPS);
    if (!pts.length) return;
    const mx = Math.max(1, ...pts.map((p) => p.anomalies));
    const x0 = 48, w = c.width - x0 - 4, h = c.height - 20;
    g.strokeStyle = "#c0392b"; g.lineWidth = 1.5; g.beginPath();
    pts.forEach((p, i) => {
      const x = x0 + (pts.length === 1 ? w / 2 : (i * w) / (pts.length - 1)), y = 4 + h - (p.anomalies / mx) * h;
      i ? g.lineTo(x, y) : g.moveTo(x, y);
    });
    g.stroke();
    g.fillStyle = "#5b6573"; g.font = "11px sans-serif";
    g.fillText(String(mx), 2, 12); g.fillText("0", 2, h + 4);
    g.fillText("step " + pts[0].io_step, x0, c.height - 3);
  }

  function fillTable(id, rows, cols, onClick) {
    const tb = $(id).querySelector("tbody");
    tb.textContent = "";
    for (const r of rows) {
      const tr = document.createElement("tr");
      cols.forEach(([f, num]) => cell(tr, f(r), num));
      tr.addEventListener("click", () => onClick(r));
      tb.appendChild(tr);
    }
  }
  const showRanks = (rows) => fillTable("top-ranks", rows, [[rankLabel], [(r) => fmt(r.anomalies), 1], [(r) => fmt(r.severity_sum), 1], [(r) => fmt(r.severity_max), 1]], (r) => openRecords({ rank: r.rank, pid: r.pid }));
  const showFuncs = (rows) => fillTable("top-funcs", rows, [[(r) => r.func], [(r) => fmt(r.anomalies), 1], [(r) => fmt(r.ranks), 1], [(r) => fmt(r.severity_sum), 1]], (r) => openRecords({ func: r.func }));
  function showSummary(s) {
    $("run").textContent = s.run + (s.shards > 1 ? ` (shard ${s.shard}/${s.shards})` : "");
    $("t-step").textContent = fmt(s.io_step); $("t-ranks").textContent = fmt(s.ranks);
    $("t-anom").textContent = fmt(s.totals.anomalies); $("t-exec").textContent = fmt(s.totals.executions);
    $("t-bad").textContent = fmt(s.totals.bad_frames);
  }
  async function refreshTables() {
    const [fr, ff, fn] = await Promise.all([
      getJSON("api/top/ranks?n=10&by=" + $("ranks-by").value),
      getJSON("api/top/functions?n=10&by=" + $("funcs-by").value),
      getJSON("api/functions"),
    ]);
    showRanks(fr); showFuncs(ff);
    fillTable("func-table", fn, [[(r) => r.func], [(r) => r.has_model ? fmt(r.count) : "-", 1], [(r) => r.has_model ? fmt(r.mean) : "-", 1], [(r) => r.has_model ? fmt(r.stddev) : "-", 1], [(r) => r.has_model ? fmt(r.min) : "-", 1], [(r) => r.has_model ? fmt(r.max) : "-", 1], [(r) => fmt(r.anomalies), 1]], (r) => openRecords({ func: r.func }));
  }

  // Click-through: anomaly records from the provenance query API (proxied by the pserver under provdb/).
  function provURL(tpl, vals) { return "provdb" + tpl.replace(/\{(\w+)\}/g, (_, n) => encodeURIComponent(vals[n])); }
  async function openRecords(sel) {
    $("details").hidden = false; $("record").hidden = true;
    $("details-title").textContent = "Anomalies of " + (sel.func ? sel.func : "rank " + rankLabel(sel));
    const tb = $("records").querySelector("tbody"); tb.textContent = "";
    $("details-msg").textContent = "";
    if (!state.config.provdb) { $("details-msg").textContent = "No provenance query API is configured (start the pserver with --provdb-url), so anomaly records cannot be shown."; return; }
    const q = new URLSearchParams({ sort: "outlier_score", order: "desc", limit: "50" });
    if (sel.func) q.set("func", sel.func); else { q.set("rank", sel.rank); q.set("pid", sel.pid || 0); }
    let body;
    try { body = await getJSON(provURL(state.config.provdb_list, {}) + "?" + q); } catch (e) { $("details-msg").textContent = "The provenance query API did not answer: " + e.message; return; }
    const recs = Array.isArray(body) ? body : (body.records || body.items || body.results || []);
    if (!recs.length) { $("details-msg").textContent = "No anomaly records found (yet) for this selection."; return; }
    fillTable("records", recs, [[(r) => r.event_id], [(r) => r.rid, 1], [(r) => r.tid, 1], [(r) => r.func], [(r) => r.io_step, 1], [(r) => fmt(r.runtime_exclusive ?? r.runtime_total), 1], [(r) => fmt(r.outlier_score), 1]], openRecord);
    openRecord(recs[0]);
  }
  async function openRecord(r) {
    let rec = r;
    if (!rec.call_stack) {
      try { rec = await getJSON(provURL(state.config.provdb_record, { pid: r.pid || 0, event_id: r.event_id })); } catch (e) { $("details-msg").textContent = "Could not fetch record " + r.event_id + ": " + e.message; return; }
    }
    $("record").hidden = false;
    const ol = $("callstack"); ol.textContent = "";
    const stack = (rec.call_stack || []).slice().reverse(); // root first
    for (const f of stack) {
      const li = document.createElement("li");
      li.textContent = `${f.func}  [${f.event_id}]  entry ${f.entry}${f.exit ? " exit " + f.exit : " (open)"}`;
      if (f.is_anomaly) li.className = "anomaly";
      ol.appendChild(li);
    }
    drawTimeline(rec);
    const gpu = $("gpu");
    if (rec.is_gpu_event && rec.gpu_location) {
      const l = rec.gpu_location, p = rec.gpu_parent;
      gpu.textContent = `GPU device ${l.device}, context ${l.context}, stream ${l.stream}, thread ${l.thread}` + (p && p.event_id ? `; launched by ${p.event_id} on thread ${p.tid}` + (p.call_stack && p.call_stack.length ? " in " + p.call_stack.map((f) => f.func).reverse().join(" > ") : "") : "");
    } else gpu.textContent = "CPU execution (no GPU context).";
  }
  function drawTimeline(rec) {
    const c = $("timeline"), g = c.getContext("2d");
    g.fillStyle = "#fff"; g.fillRect(0, 0, c.width, c.height);
    const win = ((rec.event_window && rec.event_window.exec_window) || []).filter((e) => e.exit >= e.entry);
    if (!win.length) { g.fillStyle = "#5b6573"; g.fillText("no event window recorded", 8, 20); return; }
    const t0 = Math.min(...win.map((e) => e.entry)), t1 = Math.max(...win.map((e) => e.exit), t0 + 1);
    const depth = new Map(), byId = new Map(win.map((e) => [e.event_id, e]));
    const d = (e) => { if (depth.has(e.event_id)) return depth.get(e.event_id); const p = byId.get(e.parent_event_id); const v = p && p !== e ? d(p) + 1 : 0; depth.set(e.event_id, v); return v; };
    g.font = "11px sans-serif"; g.textBaseline = "middle";
    for (const e of win) {
      const x = 4 + ((e.entry - t0) / (t1 - t0)) * (c.width - 8), w = Math.max(2, ((e.exit - e.entry) / (t1 - t0)) * (c.width - 8)), y = 4 + Math.min(d(e), 8) * 18;
      g.fillStyle = e.event_id === rec.event_id ? "#c0392b" : e.is_anomaly ? "#e67e22" : "#5d8fc9";
      g.fillRect(x, y, w, 16);
      g.fillStyle = "#fff"; if (w > 40) g.fillText(e.func.slice(0, Math.floor(w / 6)), x + 2, y + 8);
    }
  }

  // Tables are pulled at most every 2 s, with a trailing pull so the last
  // update is always reflected.
  function scheduleTables() {
    if (state.tablesTimer) return;
    const wait = Math.max(0, 2000 - (Date.now() - (state.lastTables || 0)));
    state.tablesTimer = setTimeout(() => {
      state.tablesTimer = null; state.lastTables = Date.now();
      refreshTables().catch(() => {});
    }, wait);
  }

  function connect() {
    const es = new EventSource(withToken("api/events"));
    es.addEventListener("update", (ev) => {
      const u = JSON.parse(ev.data);
      $("status").textContent = "live"; $("status").className = "status live";
      showSummary(u.summary); applyHeat(u.heat); applySeries(u.steps); drawHeat(); drawSeries();
      if ($("ranks-by").value === "count") showRanks(u.top_ranks);
      if ($("funcs-by").value === "count") showFuncs(u.top_functions);
      state.updates = (state.updates || 0) + 1;
      scheduleTables();
    });
    es.onerror = () => { $("status").textContent = "reconnecting"; $("status").className = "status down"; };
  }

  $("heatmap").addEventListener("click", (ev) => {
    const L = state.layout; if (!L) return;
    const c = $("heatmap"), y = (ev.offsetY * c.height) / c.clientHeight;
    const row = L.rows.find((r) => y >= r.y && y < r.y + r.h);
    if (row) openRecords({ pid: row.pid, rank: row.rank });
  });
  $("ranks-by").addEventListener("change", () => refreshTables().catch(() => {}));
  $("funcs-by").addEventListener("change", () => refreshTables().catch(() => {}));

  (async function init() {
    try {
      state.config = await getJSON("api/config");
      const [sum, heat, steps] = await Promise.all([getJSON("api/summary"), getJSON("api/heatmap?steps=" + MAX_STEPS), getJSON("api/steps?last=" + MAX_STEPS)]);
      showSummary(sum); applyHeat(heat); applySeries(steps); drawHeat(); drawSeries();
      await refreshTables();
      state.ready = true;
    } catch (e) {
      $("status").textContent = "error: " + e.message; $("status").className = "status down";
    }
    connect();
  })();
})();
