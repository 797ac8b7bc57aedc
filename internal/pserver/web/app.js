// Kipimo dashboard: pulls every view once on load (so a finished run, or one
// opened from its provenance store, shows the same panels as a live one),
// then applies the updates a live server pushes every io_step over
// Server-Sent Events. Plain JS, no libraries.
"use strict";
(function () {
  const MAX_STEPS = 200;
  const params = new URLSearchParams(location.search);
  const token = params.get("token");
  const withToken = (u) => token ? u + (u.includes("?") ? "&" : "?") + "token=" + encodeURIComponent(token) : u;
  const $ = (id) => document.getElementById(id);
  // The heat map's data: heat is what the server pushes (a row per rank, or
  // per band of ranks beyond 128 ranks), band the ranks of one band when the
  // reader opened it. Each is { banded, rows, keys, steps: Map(io_step ->
  // Map(row key -> anomalies)) }.
  const emptyHeat = () => ({ banded: false, rows: [], keys: [], steps: new Map(), layout: "" });
  const state = { heat: emptyHeat(), band: null, series: new Map(), config: {}, layout: null, labels: {}, status: "", push: { n: 0, bytes: 0, maxBytes: 0 } };
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
    return Math.abs(x) >= 1000 ? Math.round(x).toLocaleString("en-US") : x.toPrecision(4);
  };
  const short = (x) => x >= 1e9 ? +(x / 1e9).toPrecision(3) + "G" : x >= 1e6 ? +(x / 1e6).toPrecision(3) + "M" : x >= 1e3 ? +(x / 1e3).toPrecision(3) + "k" : String(+x.toPrecision(3));
  // Times: the trace's clock is µs; state.start is the run's start on it
  // (the summary's start_ts). dur writes a length of time for people; at
  // writes a timestamp relative to the run's start, with its date and time
  // of day when the clock is the epoch's (a live run's).
  const dur = (us) => {
    const a = Math.abs(us), sign = us < 0 ? "-" : "";
    if (a < 1000) return sign + Math.round(a) + " µs";
    if (a < 1e6) return sign + +(a / 1e3).toPrecision(4) + " ms";
    if (a < 60e6) return sign + +(a / 1e6).toPrecision(4) + " s";
    if (a < 3600e6) return sign + Math.floor(a / 60e6) + " min " + Math.round((a % 60e6) / 1e6) + " s";
    return sign + Math.floor(a / 3600e6) + " h " + Math.round((a % 3600e6) / 60e6) + " min";
  };
  const isEpoch = (us) => us > 946684800e6; // after 2000-01-01: the epoch's clock
  const date = (us) => { const d = new Date(us / 1000); return d.toLocaleDateString("en-CA") + " " + d.toLocaleTimeString("en-GB") + "." + String(d.getMilliseconds()).padStart(3, "0"); };
  const at = (us) => {
    if (!us) return "open";
    const rel = state.start && us >= state.start ? "run +" + dur(us - state.start) : "t=" + us;
    return isEpoch(us) ? rel + " (" + date(us) + ")" : rel;
  };
  state.fmtTime = at;
  function cell(tr, v, num) { const td = document.createElement("td"); td.textContent = v; if (num) td.className = "num"; tr.appendChild(td); return td; }

  // Canvas labels: every text drawn on a canvas goes through label(), which
  // skips a label that would overlap one already drawn on that canvas and
  // records the boxes, so that tests can check them (labelBoxes).
  function beginLabels(c) { state.labels[c.id] = []; }
  function label(g, c, text, x, y, align, baseline) {
    g.font = "11px sans-serif";
    const w = g.measureText(text).width, h = 12;
    const left = align === "right" ? x - w : align === "center" ? x - w / 2 : x;
    const top = baseline === "bottom" ? y - h : baseline === "middle" ? y - h / 2 : y;
    const box = { x: Math.max(0, left), y: Math.max(0, top), w, h, text };
    box.x = Math.min(box.x, c.width - w); box.y = Math.min(box.y, c.height - h);
    const list = state.labels[c.id] || (state.labels[c.id] = []);
    if (list.some((b) => box.x < b.x + b.w + 3 && b.x < box.x + box.w + 3 && box.y < b.y + b.h && b.y < box.y + box.h)) return false;
    g.textBaseline = "top"; g.textAlign = "left";
    g.fillText(text, box.x, box.y);
    list.push(box);
    return true;
  }
  // labelBoxes gives every canvas label's box in CSS pixels of the page.
  state.labelBoxes = () => {
    const out = [];
    for (const [id, list] of Object.entries(state.labels)) {
      const c = $(id); if (!c || !c.offsetParent) continue;
      const r = c.getBoundingClientRect(), sx = r.width / c.width, sy = r.height / c.height;
      for (const b of list) out.push({ canvas: id, text: b.text, left: r.left + b.x * sx, top: r.top + b.y * sy, right: r.left + (b.x + b.w) * sx, bottom: r.top + (b.y + b.h) * sy });
    }
    return out;
  };
  // stepTicks picks io_steps to label: the first, the last, and round ones
  // in between, about one per 90 px.
  function stepTicks(steps, width) {
    if (!steps.length) return [];
    const n = Math.max(1, Math.floor(width / 90)), span = steps[steps.length - 1] - steps[0];
    let every = 1;
    for (const m of [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 5000, 10000, 1e5, 1e6]) { every = m; if (span / m <= n) break; }
    const out = [0, steps.length - 1];
    steps.forEach((s, i) => { if (s % every === 0) out.push(i); });
    return [...new Set(out)];
  }

  // applyHeat merges a heat map from the server into view v (replacing its
  // columns when full). The rows are the server's: when they change (ranks
  // joined, so bands moved) the older columns are pulled again.
  function applyHeat(v, h, full) {
    const rows = h.banded ? h.bands : h.ranks;
    const keys = rows.map((r) => h.banded ? "b" + r.id : k(r));
    const layout = (h.banded ? "b" : "r") + keys.join(",");
    if (full) v.steps = new Map();
    else if (layout !== v.layout) reloadHeat();
    Object.assign(v, { banded: h.banded, rows, keys, layout, rankCount: h.rank_count });
    h.steps.forEach((step) => v.steps.set(step, new Map()));
    h.cells.forEach(([ri, si, n], i) => v.steps.get(h.steps[si]).set(keys[ri], h.banded ? { n, hot: h.hot_ranks[i], peak: h.peaks ? h.peaks[i] : n } : n));
    const steps = [...v.steps.keys()].sort((a, b) => a - b);
    while (steps.length > MAX_STEPS) v.steps.delete(steps.shift());
  }
  const cellN = (x) => typeof x === "number" ? x : x.n;
  // A cell's colour comes from one rank's anomalies in one io_step: a
  // band's busiest rank (peak), so that one slow rank stands out of a band
  // of thousands. The scale is the server's (HeatScale): against the
  // typical cell, the median of every cell empty ones included (at least
  // 1), a class up to it, up to 2x, up to 4x, and beyond; never the
  // maximum of noisy counts.
  const cellV = (x) => typeof x === "number" ? x : (x.peak ?? x.n);
  const HEAT_COLOURS = ["#fcd9bd", "#f4a261", "#e4572e", "#8e0b0b"];
  function heatScale(view, steps) {
    const vals = [];
    for (const s of steps) for (const x of view.steps.get(s).values()) { const v = cellV(x); if (v > 0) vals.push(v); }
    vals.sort((a, b) => a - b);
    const cells = view.rows.length * steps.length, zeros = cells - vals.length, mid = Math.floor(cells / 2);
    const typical = Math.max(1, mid >= zeros && mid - zeros < vals.length ? vals[mid - zeros] : 0);
    return { typical, edges: [typical, 2 * typical, 4 * typical] };
  }
  const heatClass = (sc, v) => { for (let i = 0; i < sc.edges.length; i++) if (v <= sc.edges[i]) return i; return sc.edges.length; };
  function showHeatScale(sc, banded) {
    const el = $("heat-scale"); el.textContent = "";
    const range = (lo, hi) => lo === hi ? fmt(lo) : lo > hi ? null : fmt(lo) + "–" + fmt(hi);
    const names = [range(1, sc.edges[0]), range(sc.edges[0] + 1, sc.edges[1]), range(sc.edges[1] + 1, sc.edges[2]), "> " + fmt(sc.edges[2])];
    const head = document.createElement("span");
    head.textContent = (banded ? "anomalies of a band's busiest rank" : "anomalies of a rank") + " in one io_step, against the typical " + fmt(sc.typical) + ": ";
    el.appendChild(head);
    names.forEach((n, i) => {
      if (n === null) return;
      const sw = document.createElement("span"); sw.className = "swatch"; sw.style.background = HEAT_COLOURS[i];
      const t = document.createElement("span"); t.textContent = n + (i === 3 ? " (over 4x typical)" : "") + " ";
      el.appendChild(sw); el.appendChild(t);
    });
  }
  // reloadHeat pulls the whole heat map again, at most every 2 s.
  function reloadHeat() {
    if (state.heatReload) return;
    state.heatReload = setTimeout(() => {
      getJSON("api/heatmap?steps=" + MAX_STEPS).then((h) => { state.heatReload = null; applyHeat(state.heat, h, true); drawHeat(); }).catch(() => { state.heatReload = null; });
    }, 2000);
  }
  // openBand shows the ranks of one band, pulled from the server, until the
  // reader goes back to all ranks; closeBand goes back.
  async function openBand(b) {
    const h = await getJSON("api/heatmap?steps=" + MAX_STEPS + "&band=" + encodeURIComponent(b.id));
    const v = emptyHeat();
    applyHeat(v, h, true);
    v.band = h.band;
    state.band = v;
    $("heat-back").hidden = false;
    drawHeat();
    writeLink();
  }
  function closeBand() { state.band = null; $("heat-back").hidden = true; drawHeat(); writeLink(); }

  // Deep links: the view (the function shown, the anomaly list's filters,
  // the record open, the band of ranks open) lives in the page's URL hash,
  // #func=F&rank=R&pid=P&filter_func=G&step_min=A&step_max=B&record=EVENT_ID&record_pid=P&band=ID,
  // rewritten as the reader moves (no history entry per click) and applied
  // when the page opens or the hash is edited, so that a view can be
  // bookmarked and sent.
  function linkParams() {
    const p = new URLSearchParams();
    const set = (k, v) => { if (v !== undefined && v !== null && v !== "") p.set(k, String(v)); };
    set("func", state.func);
    set("rank", $("f-rank").value);
    if ($("f-rank").value !== "" && state.filterPID) set("pid", state.filterPID);
    set("filter_func", $("f-func").value);
    set("step_min", $("f-step-min").value); set("step_max", $("f-step-max").value);
    set("record", state.record);
    if (state.record && state.recordPID) set("record_pid", state.recordPID);
    if (state.band && state.band.band) set("band", state.band.band.id);
    return p;
  }
  function writeLink() {
    if (state.applyingLink || !state.ready) return;
    const h = linkParams().toString();
    if (location.hash.slice(1) === h) return;
    history.replaceState(null, "", location.pathname + location.search + (h ? "#" + h : ""));
    state.link = h;
  }
  state.linkParams = () => linkParams().toString();
  // readLink reads the hash into a view to apply (null when it is empty).
  function readLink() {
    const p = new URLSearchParams(location.hash.replace(/^#/, ""));
    if (![...p.keys()].length) return null;
    const n = (k) => p.has(k) && /^\d+$/.test(p.get(k)) ? Number(p.get(k)) : undefined;
    const l = { func: p.get("func") || undefined, band: p.get("band") || undefined,
      filter: { rank: n("rank"), pid: n("pid"), func: p.get("filter_func") || undefined, smin: n("step_min"), smax: n("step_max") } };
    if (p.get("record")) l.filter.record = { event_id: p.get("record"), pid: n("record_pid") || 0 };
    return l;
  }
  // applyLink shows the view of link l: every part that can be shown is.
  async function applyLink(l) {
    state.applyingLink = true;
    try {
      const jobs = [];
      if (l.func) jobs.push(selectFunc(l.func));
      jobs.push(filterAnomalies(l.filter));
      if (l.band) jobs.push(openBand({ id: l.band }).catch((e) => { $("heat-range").textContent = "Could not open band " + l.band + ": " + e.message; }));
      else if (state.band) closeBand();
      await Promise.allSettled(jobs);
    } finally { state.applyingLink = false; }
    writeLink();
  }
  window.addEventListener("hashchange", () => {
    if (location.hash.slice(1) === state.link) return; // our own rewrite
    const l = readLink(); if (l) applyLink(l);
  });
  // While a band is open, live updates pull it again, at most every second.
  function scheduleBand() {
    if (!state.band || state.bandTimer) return;
    state.bandTimer = setTimeout(() => {
      const b = state.band;
      if (!b) { state.bandTimer = null; return; }
      getJSON("api/heatmap?steps=" + MAX_STEPS + "&band=" + encodeURIComponent(b.band.id)).then((h) => {
        if (state.band === b) { applyHeat(b, h, true); b.band = h.band; drawHeat(); }
      }).catch(() => {}).finally(() => { state.bandTimer = null; });
    }, 1000);
  }
  function applySeries(points) {
    for (const p of points) state.series.set(p.io_step, p);
    const keys = [...state.series.keys()].sort((a, b) => a - b);
    while (keys.length > 2000) state.series.delete(keys.shift());
  }

  function drawHeat() {
    const c = $("heatmap"), g = c.getContext("2d");
    beginLabels(c);
    g.fillStyle = "#fff"; g.fillRect(0, 0, c.width, c.height);
    const view = state.band || state.heat;
    const steps = [...view.steps.keys()].sort((a, b) => a - b);
    const ranks = view.rows, x0 = 76, y0 = 4, w = c.width - x0 - 4, h = c.height - y0 - 18;
    if (!ranks.length || !steps.length) { state.layout = null; g.fillStyle = "#5b6573"; label(g, c, "no io_step reported yet", 8, 8); return; }
    let mx = 1;
    for (const m of view.steps.values()) for (const v of m.values()) mx = Math.max(mx, cellN(v));
    const sc = heatScale(view, steps);
    state.heatScale = sc;
    showHeatScale(sc, view.banded);
    const cw = w / steps.length, rh = h / ranks.length;
    const rows = ranks.map((r, i) => view.banded ? { band: r, y: y0 + i * rh, h: rh } : { pid: r.pid, rank: r.rank, y: y0 + i * rh, h: rh });
    const idx = new Map(view.keys.map((key, i) => [key, i]));
    steps.forEach((s, si) => {
      for (const [key, x] of view.steps.get(s)) {
        const ri = idx.get(key), v = cellV(x);
        if (!v || ri === undefined) continue;
        g.fillStyle = HEAT_COLOURS[heatClass(sc, v)];
        g.fillRect(x0 + si * cw, y0 + ri * rh, Math.max(cw, 1), Math.max(rh, 1));
      }
    });
    g.strokeStyle = "#d9dde3"; g.strokeRect(x0 - 0.5, y0 - 0.5, w + 1, h + 1);
    g.fillStyle = "#5b6573";
    const every = Math.max(1, Math.ceil(14 / rh));
    const bandLabel = (r) => (r.pid ? r.pid + ":" : "") + r.first + "-" + r.last;
    const rowLabel = (r) => view.banded ? bandLabel(r) : rankLabel(r);
    ranks.forEach((r, i) => { if (i % every === 0 || i === ranks.length - 1) label(g, c, rowLabel(r), x0 - 4, y0 + i * rh + rh / 2, "right", "middle"); });
    for (const si of stepTicks(steps, w)) label(g, c, "step " + steps[si], x0 + (si + 0.5) * cw, c.height - 13, si === 0 ? "left" : si === steps.length - 1 ? "right" : "center");
    const b = state.band && state.band.band;
    $("heat-range").textContent = b ? `ranks ${bandLabel(b)} (${ranks.length} of ${fmt(state.heat.rankCount || 0)}) x ${steps.length} steps, max ${fmt(mx)} anomalies per cell`
      : view.banded ? `${fmt(view.rankCount)} ranks in ${ranks.length} bands x ${steps.length} steps, max ${fmt(mx)} anomalies per band and step`
        : `${ranks.length} ranks x ${steps.length} steps, max ${fmt(mx)} anomalies per cell`;
    $("heat-how").textContent = view.banded ? "each row is a band of ranks, coloured by its busiest rank; click a band to show its ranks" : "click a cell to list that rank's anomalies of that io_step";
    state.layout = { x0, x1: x0 + w, rows, steps, cw, banded: view.banded };
  }

  function drawSeries() {
    const c = $("series"), g = c.getContext("2d");
    beginLabels(c);
    g.fillStyle = "#fff"; g.fillRect(0, 0, c.width, c.height);
    const pts = [...state.series.values()].sort((a, b) => a.io_step - b.io_step).slice(-MAX_STEPS);
    g.fillStyle = "#5b6573";
    if (!pts.length) { label(g, c, "no io_step reported yet", 8, 8); return; }
    const mx = Math.max(1, ...pts.map((p) => p.anomalies));
    const x0 = 56, w = c.width - x0 - 8, h = c.height - 24;
    const X = (i) => x0 + (pts.length === 1 ? w / 2 : (i * w) / (pts.length - 1));
    g.strokeStyle = "#c0392b"; g.lineWidth = 1.5; g.beginPath();
    pts.forEach((p, i) => { const y = 4 + h - (p.anomalies / mx) * h; i ? g.lineTo(X(i), y) : g.moveTo(X(i), y); });
    g.stroke();
    g.fillStyle = "#5b6573";
    label(g, c, fmt(mx), x0 - 4, 4, "right", "top"); label(g, c, "0", x0 - 4, 4 + h, "right", "bottom");
    const steps = pts.map((p) => p.io_step);
    for (const si of stepTicks(steps, w)) label(g, c, "step " + steps[si], X(si), c.height - 13, si === 0 ? "left" : si === steps.length - 1 ? "right" : "center");
  }

  function fillTable(id, rows, cols, onClick) {
    const tb = $(id).querySelector("tbody");
    tb.textContent = "";
    for (const r of rows) {
      const tr = document.createElement("tr");
      cols.forEach(([f, num, cls]) => { const td = cell(tr, f(r), num); const c = cls && cls(r); if (c) td.classList.add(c); });
      tr.addEventListener("click", () => onClick(r));
      tb.appendChild(tr);
    }
    if (!rows.length) { const tr = document.createElement("tr"); tr.className = "empty"; const td = cell(tr, "none"); td.colSpan = cols.length; tb.appendChild(tr); }
  }
  // A rank's calls dropped whole by its event library (full ring), in the
  // warning colour when any: its profile and detection miss them.
  const dropped = (r) => fmt(r.dropped_calls || 0) + (r.dropped_events ? ` (+${fmt(r.dropped_events)} events)` : "");
  const showRanks = (rows) => fillTable("top-ranks", rows, [[rankLabel], [(r) => fmt(r.anomalies), 1], [(r) => fmt(r.severity_sum), 1], [(r) => fmt(r.severity_max), 1],
    [dropped, 1, (r) => (r.dropped_calls || r.dropped_events) ? "warn" : ""]], (r) => filterAnomalies({ rank: r.rank, pid: r.pid }));
  const showFuncs = (rows) => fillTable("top-funcs", rows, [[(r) => r.func], [(r) => fmt(r.anomalies), 1], [(r) => fmt(r.ranks), 1], [(r) => fmt(r.severity_sum), 1]], (r) => { selectFunc(r.func); filterAnomalies({ func: r.func }); });
  function setStatus(s) {
    state.status = s;
    const text = { live: "live", finished: "finished", stored: "finished (from store)" }[s] || s;
    $("status").textContent = text; $("status").className = "status " + (s === "live" ? "live" : s === "finished" || s === "stored" ? "done" : "down");
  }
  function showSummary(s) {
    $("run").textContent = s.run + (s.shards > 1 ? ` (shard ${s.shard}/${s.shards})` : "");
    document.title = "Kipimo " + s.run;
    $("t-step").textContent = fmt(s.io_step); $("t-ranks").textContent = fmt(s.ranks);
    $("t-anom").textContent = fmt(s.totals.anomalies); $("t-exec").textContent = fmt(s.totals.executions);
    // Which anomalies the count is: flagged live, or those that stand
    // after the end-of-run relabelling (as kipimo query counts them).
    const final = s.labels === "final";
    $("t-anom-what").textContent = final ? "anomalies (final)" : "anomalies (flagged live)";
    $("t-anom").title = final ? `those that stand after the end-of-run relabelling; ${fmt(s.unflagged || 0)} more were flagged live and unflagged by the final models`
      : "as the detectors flagged them during the run; once it has ended, kipimo query and kipimo serve count those that stand after the end-of-run relabelling";
    if (s.start_ts) {
      state.start = s.start_ts;
      $("t-start").textContent = isEpoch(s.start_ts) ? date(s.start_ts) : "t=" + s.start_ts + " µs";
    }
    $("t-bad").textContent = fmt(s.totals.bad_frames);
    $("t-missing").textContent = fmt(s.totals.missing_steps || 0);
    // What the ranks' event library dropped (full rings), in the warning
    // colour when any, and the calls it summarised.
    const dc = s.totals.dropped_calls || 0, de = s.totals.dropped_events || 0;
    $("t-dropped").textContent = de ? `${fmt(dc)} calls, ${fmt(de)} events` : `${fmt(dc)} calls`;
    $("t-dropped").classList.toggle("warn", dc + de > 0);
    $("t-summ").textContent = fmt(s.totals.summarised_calls || 0);
    if (s.status) setStatus(s.status);
  }
  async function refreshTables() {
    const [fr, ff, fn] = await Promise.all([
      getJSON("api/top/ranks?n=10&by=" + $("ranks-by").value),
      getJSON("api/top/functions?n=10&by=" + $("funcs-by").value),
      getJSON("api/functions"),
    ]);
    showRanks(fr); showFuncs(ff);
    const m = (r, f) => r.has_model ? fmt(f(r)) : "-";
    fillTable("func-table", fn, [[(r) => r.func], [(r) => m(r, (x) => x.count), 1], [(r) => m(r, (x) => x.mean), 1], [(r) => m(r, (x) => x.stddev), 1], [(r) => m(r, (x) => x.min), 1], [(r) => m(r, (x) => x.max), 1], [(r) => fmt(r.anomalies), 1]], (r) => { selectFunc(r.func); filterAnomalies({ func: r.func }); });
    const first = setFuncList(fn.map((r) => r.func), (fn.find((r) => r.has_histogram) || fn[0] || {}).func);
    if (first) await first;
    return !!first;
  }

  // Function view: the runtime histogram of one function over all ranks on a
  // log runtime axis, the bins the HBOS threshold labels anomalous in red,
  // the threshold as a dashed line and the anomaly records as marks.
  function setFuncList(names, preferred) {
    const sel = $("fv-func"), cur = sel.value, known = [...sel.options].map((o) => o.value);
    if (known.join("\n") !== names.join("\n")) {
      sel.textContent = "";
      for (const n of names) { const o = document.createElement("option"); o.value = o.textContent = n; sel.appendChild(o); }
      const dl = $("f-funcs"); dl.textContent = "";
      for (const n of names) { const o = document.createElement("option"); o.value = n; dl.appendChild(o); }
      if (names.includes(cur)) sel.value = cur;
    }
    return !state.func && preferred ? selectFunc(preferred) : null;
  }
  function selectFunc(name) {
    if (!name) return null;
    if ([...$("fv-func").options].some((o) => o.value === name)) $("fv-func").value = name;
    state.func = name;
    writeLink();
    return loadFunc(name).catch((e) => { $("fv-legend").textContent = "Could not load " + name + ": " + e.message; });
  }
  async function loadFunc(name) {
    const v = await getJSON("api/function?func=" + encodeURIComponent(name));
    let marks = [], note = "";
    if (state.config.provdb) {
      try {
        const q = new URLSearchParams({ func: name, sort: "outlier_score", order: "desc", limit: "500" });
        marks = records(await getJSON(provURL(state.config.provdb_list, {}) + "?" + q)).map((r) => r.runtime_exclusive ?? r.runtime_total).filter((x) => x > 0);
      } catch (e) { note = "; anomaly records unavailable: " + e.message; }
    } else note = "; no provenance query API, so anomalies are not marked";
    if (state.func !== name) return;
    state.funcView = v; state.funcMarks = marks;
    drawFunc(v, marks);
    const a = v.anomalies || {};
    const rule = v.model === "natural range"
      ? (v.threshold_runtime ? `natural range: flagged ${v.low_threshold > 0 ? "below " + fmt(v.low_threshold) + " µs or " : ""}above ${fmt(v.threshold_runtime)} µs; ` : "no natural range yet; ")
      : (v.threshold_runtime ? `threshold ${fmt(v.threshold_runtime)} µs (HBOS score ${fmt(v.score_threshold)}); ` : `HBOS score threshold ${fmt(v.score_threshold)}; `);
    $("fv-legend").textContent = v.bins.length
      ? `${fmt(v.total)} executions (${v.source}); mean ${fmt(v.stats.mean)} µs, stddev ${fmt(v.stats.stddev)}; ` + rule +
        `${fmt(a.count || 0)} anomalies on ${fmt(v.ranks)} ranks, ${marks.length} marked` + note
      : `no runtime histogram of ${name} here (${v.stats.has_model ? "its model keeps moments only" : "its model is on another shard"}); ${fmt(a.count || 0)} anomalies` + note;
  }
  function drawFunc(v, marks) {
    const c = $("funchist"), g = c.getContext("2d");
    beginLabels(c);
    g.fillStyle = "#fff"; g.fillRect(0, 0, c.width, c.height);
    g.fillStyle = "#5b6573";
    if (!v.bins.length) { label(g, c, "no histogram for " + v.func, 8, 8); return; }
    const x0 = 56, x1 = c.width - 8, y0 = 16, y1 = c.height - 20;
    // The axis spans the bins, the marked anomalies and the thresholds.
    const pos = v.bins.map((b) => b.hi).concat(marks, [v.threshold_runtime * 1.2, v.low_threshold]).filter((x) => x > 0);
    let lo = Math.min(...v.bins.map((b) => b.lo).filter((x) => x > 0), ...pos), hi = Math.max(...pos);
    if (!(lo > 0)) lo = hi / 1000;
    if (hi <= lo) hi = lo * 10;
    const L0 = Math.log10(lo), L1 = Math.log10(hi), X = (x) => x0 + ((Math.log10(Math.max(x, lo)) - L0) / (L1 - L0)) * (x1 - x0);
    const cmax = Math.max(...v.bins.map((b) => b.count)), Y = (n) => y1 - (Math.log10(1 + n) / Math.log10(1 + cmax)) * (y1 - y0);
    for (const b of v.bins) {
      const xa = X(b.lo), xb = Math.max(X(b.hi), xa + 1.5);
      g.fillStyle = b.anomalous ? "#d9534f" : "#5d8fc9";
      g.fillRect(xa, Y(b.count), xb - xa, y1 - Y(b.count));
    }
    g.strokeStyle = "#9aa3ad"; g.lineWidth = 1; g.beginPath(); g.moveTo(x0, y1 + 0.5); g.lineTo(x1, y1 + 0.5); g.moveTo(x0 - 0.5, y0); g.lineTo(x0 - 0.5, y1); g.stroke();
    g.fillStyle = "#e67e22";
    for (const m of marks) { const x = X(m); g.beginPath(); g.moveTo(x, y0 - 2); g.lineTo(x - 4, y0 - 10); g.lineTo(x + 4, y0 - 10); g.fill(); }
    g.fillStyle = "#5b6573";
    const rule = (t, text, align) => {
      const x = X(t);
      g.strokeStyle = "#b00020"; g.setLineDash([5, 4]); g.beginPath(); g.moveTo(x, y0); g.lineTo(x, y1); g.stroke(); g.setLineDash([]);
      g.fillStyle = "#b00020"; label(g, c, text, align === "right" ? x - 4 : x + 4, y0 + (align === "right" ? 16 : 2), align); g.fillStyle = "#5b6573";
    };
    if (v.threshold_runtime > 0) rule(v.threshold_runtime, (v.model === "natural range" ? "flagged above " : "threshold ") + short(v.threshold_runtime) + " µs");
    if (v.low_threshold > 0 && v.low_threshold >= lo) rule(v.low_threshold, "flagged below " + short(v.low_threshold) + " µs", "right");
    label(g, c, short(cmax), x0 - 4, Y(cmax), "right", "top"); label(g, c, "0", x0 - 4, y1, "right", "bottom");
    label(g, c, "count (log)", x0 - 4, (y0 + y1) / 2, "right", "middle");
    for (let e = Math.floor(L0); e <= Math.ceil(L1); e++) for (const m of [1, 2, 5]) {
      const t = m * 10 ** e; if (t < lo || t > hi) continue;
      const x = X(t); g.fillRect(x, y1, 1, 4);
      label(g, c, short(t), x, y1 + 5, "center");
    }
    label(g, c, "runtime (µs, log)", x1, y1 + 5, "right");
  }

  // The anomaly list, filtered by rank, function and io_step range, from the
  // provenance query API (proxied by the pserver, or the store's own).
  function provURL(tpl, vals) { return "provdb" + tpl.replace(/\{(\w+)\}/g, (_, n) => encodeURIComponent(vals[n])); }
  const records = (body) => Array.isArray(body) ? body : (body.records || body.items || body.results || []);
  function filterAnomalies(sel) {
    $("f-rank").value = sel.rank ?? ""; $("f-func").value = sel.func ?? "";
    $("f-step-min").value = sel.step ?? sel.smin ?? ""; $("f-step-max").value = sel.step ?? sel.smax ?? "";
    state.filterPID = sel.pid;
    return loadAnomalies(sel.record);
  }
  // loadAnomalies lists the anomalies the filters select and opens the
  // first, or the record want ({pid, event_id}) when given.
  async function loadAnomalies(want) {
    const rank = $("f-rank").value, fn = $("f-func").value, smin = $("f-step-min").value, smax = $("f-step-max").value;
    state.record = undefined;
    writeLink();
    const what = [rank !== "" && "rank " + rank, fn && fn, (smin !== "" || smax !== "") && (smin === smax ? "io_step " + smin : `io_steps ${smin || "0"}..${smax || "end"}`)].filter(Boolean);
    $("details-title").textContent = "Anomalies" + (what.length ? " of " + what.join(", ") : ", highest scores first");
    // The list is replaced when the answer arrives, so a reader (or test)
    // never sees it empty in between.
    const clear = () => { $("records").querySelector("tbody").textContent = ""; $("record").hidden = true; };
    $("details-msg").textContent = "";
    if (!state.config.provdb) { clear(); $("details-msg").textContent = "No provenance query API is configured (start the pserver with --provdb-url), so anomaly records cannot be shown."; return; }
    const q = new URLSearchParams({ sort: "outlier_score", order: "desc", limit: "50" });
    if (rank !== "") { q.set("rank", rank); if (state.filterPID) q.set("pid", state.filterPID); }
    if (fn) q.set("func", fn);
    if (smin !== "") q.set("step_min", smin);
    if (smax !== "") q.set("step_max", smax);
    const seq = (state.listSeq = (state.listSeq || 0) + 1);
    let recs;
    try { recs = records(await getJSON(provURL(state.config.provdb_list, {}) + "?" + q)); } catch (e) { clear(); $("details-msg").textContent = "The provenance query API did not answer: " + e.message; return; }
    if (seq !== state.listSeq) return;
    if (!recs.length) { clear(); $("details-msg").textContent = "No anomaly records found (yet) for this selection."; if (want) await openRecord(want); else writeLink(); return; }
    fillTable("records", recs, [[(r) => r.event_id], [(r) => r.rid, 1], [(r) => r.tid, 1], [(r) => r.func], [(r) => r.io_step, 1], [(r) => fmt(r.runtime_exclusive ?? r.runtime_total), 1], [(r) => fmt(r.outlier_score), 1]], openRecord);
    state.listed = q.toString();
    await openRecord(want || recs[0]);
  }
  async function openRecord(r) {
    let rec = r;
    if (!rec.call_stack || !rec.event_window) {
      try { rec = await getJSON(provURL(state.config.provdb_record, { pid: r.pid || 0, event_id: r.event_id })); } catch (e) { $("details-msg").textContent = "Could not fetch record " + r.event_id + ": " + e.message; return; }
    }
    for (const tr of $("records").querySelectorAll("tbody tr")) tr.classList.toggle("sel", tr.firstChild && tr.firstChild.textContent === rec.event_id);
    $("record").hidden = false;
    $("record-id").textContent = `event ${rec.event_id}, rank ${rec.rid}, thread ${rec.tid}, io_step ${rec.io_step}, entered at ${at(rec.entry)}, ran ${dur((rec.exit || rec.entry) - rec.entry)}`;
    const tl = document.createElement("a"); // its window across ranks, for Perfetto (docs/timeline.md)
    tl.id = "record-timeline"; tl.textContent = "timeline for Perfetto"; tl.download = "";
    tl.href = withToken(provURL("/api/v1/timeline", {}) + "?" + new URLSearchParams({ record: rec.event_id, pid: rec.pid || 0 }));
    $("record-id").append(" · ", tl);
    const x = rec.explanation;
    $("record-why").textContent = x && x.text ? x.text + "." : `outlier score ${fmt(rec.outlier_score)} (${rec.algorithm || "algorithm not recorded"}; no explanation in this record).`;
    const ol = $("callstack"); ol.textContent = "";
    const stack = (rec.call_stack || []).slice().reverse(); // root first
    for (const f of stack) {
      const li = document.createElement("li");
      li.textContent = `${f.func}  [${f.event_id}]  entered ${f.entry ? at(f.entry).replace(/ \(.*\)$/, "") : "before the window"}${f.exit ? ", ran " + dur(f.exit - f.entry) : " (open)"}`;
      if (f.is_anomaly) li.className = "anomaly";
      ol.appendChild(li);
    }
    if (!stack.length) { const li = document.createElement("li"); li.textContent = "no call stack recorded"; ol.appendChild(li); }
    drawTimeline(rec);
    const gpu = $("gpu");
    if (rec.is_gpu_event && rec.gpu_location) {
      const l = rec.gpu_location, p = rec.gpu_parent;
      gpu.textContent = `GPU device ${l.device}, context ${l.context}, stream ${l.stream}, thread ${l.thread}` + (p && p.event_id ? `; launched by ${p.event_id} on thread ${p.tid}` + (p.call_stack && p.call_stack.length ? " in " + p.call_stack.map((f) => f.func).reverse().join(" > ") : "") : "");
    } else gpu.textContent = "CPU execution (no GPU context).";
    state.record = rec.event_id;
    state.recordPID = rec.pid || 0;
    writeLink();
  }
  function drawTimeline(rec) {
    const c = $("timeline"), g = c.getContext("2d");
    beginLabels(c);
    g.fillStyle = "#fff"; g.fillRect(0, 0, c.width, c.height);
    const win = ((rec.event_window && rec.event_window.exec_window) || []).filter((e) => e.exit >= e.entry);
    if (!win.length) { g.fillStyle = "#5b6573"; label(g, c, "no event window recorded", 8, 8); return; }
    const t0 = Math.min(...win.map((e) => e.entry)), t1 = Math.max(...win.map((e) => e.exit), t0 + 1);
    const depth = new Map(), byId = new Map(win.map((e) => [e.event_id, e]));
    const d = (e) => { if (depth.has(e.event_id)) return depth.get(e.event_id); depth.set(e.event_id, 0); const p = byId.get(e.parent_event_id); const v = p && p !== e ? d(p) + 1 : 0; depth.set(e.event_id, v); return v; };
    const x0 = 4, W = c.width - 8, H = c.height - 18;
    const rowH = Math.min(18, H / (Math.min(Math.max(...win.map(d)), 7) + 1));
    for (const e of win) {
      const x = x0 + ((e.entry - t0) / (t1 - t0)) * W, w = Math.max(2, ((e.exit - e.entry) / (t1 - t0)) * W), y = 2 + Math.min(d(e), 7) * rowH;
      g.fillStyle = e.event_id === rec.event_id ? "#c0392b" : e.is_anomaly ? "#e67e22" : "#5d8fc9";
      g.fillRect(x, y, w, rowH - 2);
      if (w > 40) {
        g.font = "11px sans-serif";
        let s = e.func; while (s.length > 1 && g.measureText(s).width > w - 4) s = s.slice(0, -1);
        g.fillStyle = "#fff"; label(g, c, s, x + 2, y + (rowH - 2) / 2, "left", "middle");
      }
    }
    g.fillStyle = "#5b6573";
    label(g, c, at(t0).replace(/ \(.*\)$/, ""), x0, c.height - 13, "left"); label(g, c, "+" + dur(t1 - t0), c.width - 4, c.height - 13, "right");
  }

  // Tables are pulled at most every 2 s, with a trailing pull so the last
  // update is always reflected.
  function scheduleTables() {
    if (state.tablesTimer) return;
    const wait = Math.max(0, 2000 - (Date.now() - (state.lastTables || 0)));
    state.tablesTimer = setTimeout(() => {
      state.tablesTimer = null; state.lastTables = Date.now();
      refreshTables().then((first) => !first && state.func && loadFunc(state.func)).catch(() => {});
    }, wait);
  }

  function connect() {
    const es = new EventSource(withToken("api/events"));
    // Updates come only when step summaries arrive, so the end of a run (its
    // final statistics published) is learnt by asking when the stream is quiet.
    state.lastUpdate = Date.now();
    const quiet = setInterval(() => {
      if (state.status === "finished" || state.status === "stored") { clearInterval(quiet); es.close(); return; }
      if (Date.now() - state.lastUpdate > 4000) getJSON("api/summary").then(showSummary).catch(() => {});
    }, 5000);
    es.addEventListener("update", (ev) => {
      const u = JSON.parse(ev.data);
      state.lastUpdate = Date.now();
      const p = state.push; p.n++; p.bytes = ev.data.length; p.maxBytes = Math.max(p.maxBytes, p.bytes);
      showSummary(u.summary); applyHeat(state.heat, u.heat); applySeries(u.steps); scheduleBand(); drawHeat(); drawSeries();
      if ($("ranks-by").value === "count") showRanks(u.top_ranks);
      if ($("funcs-by").value === "count") showFuncs(u.top_functions);
      state.updates = (state.updates || 0) + 1;
      scheduleTables();
      if (u.summary.status !== "live") es.close(); // nothing changes any more
    });
    es.onerror = () => {
      if (state.status === "live" || !state.status) { $("status").textContent = "reconnecting"; $("status").className = "status down"; }
    };
  }

  $("heatmap").addEventListener("click", (ev) => {
    const L = state.layout; if (!L) return;
    const c = $("heatmap"), y = (ev.offsetY * c.height) / c.clientHeight, x = (ev.offsetX * c.width) / c.clientWidth;
    const row = L.rows.find((r) => y >= r.y && y < r.y + r.h);
    if (!row) return;
    if (row.band) { openBand(row.band).catch((e) => { $("heat-range").textContent = "Could not open the band: " + e.message; }); return; }
    const si = Math.floor((x - L.x0) / L.cw);
    filterAnomalies({ pid: row.pid, rank: row.rank, step: si >= 0 && si < L.steps.length ? L.steps[si] : undefined });
  });
  $("heat-back").addEventListener("click", closeBand);
  $("ranks-by").addEventListener("change", () => refreshTables().catch(() => {}));
  $("funcs-by").addEventListener("change", () => refreshTables().catch(() => {}));
  $("fv-func").addEventListener("change", () => selectFunc($("fv-func").value));
  $("filters").addEventListener("submit", (ev) => { ev.preventDefault(); state.filterPID = undefined; loadAnomalies(); });
  $("f-clear").addEventListener("click", () => filterAnomalies({}));

  (async function init() {
    try {
      state.config = await getJSON("api/config");
    } catch (e) {
      $("status").textContent = "error: " + e.message; $("status").className = "status down";
      setTimeout(init, 2000);
      return;
    }
    // Every panel is pulled on its own, so one failing view leaves the others
    // filled. A deep link (the URL's hash) chooses the function, the
    // anomaly list's filters, the record and the band shown.
    const link = readLink();
    if (link && link.func) state.func = link.func; // not replaced by the preferred function
    // The summary first: times are shown relative to the run's start.
    const summary = getJSON("api/summary").then(showSummary);
    const jobs = [
      summary,
      Promise.all([getJSON("api/heatmap?steps=" + MAX_STEPS), getJSON("api/steps?last=" + MAX_STEPS)]).then(([heat, steps]) => { applyHeat(state.heat, heat, true); applySeries(steps); drawHeat(); drawSeries(); }),
      refreshTables(),
    ];
    if (!link) jobs.push(summary.catch(() => {}).then(() => loadAnomalies()));
    const res = await Promise.allSettled(jobs);
    const bad = res.filter((r) => r.status === "rejected");
    if (bad.length) { $("status").textContent = "error: " + bad[0].reason.message; $("status").className = "status down"; }
    state.ready = true;
    if (link) await summary.catch(() => {}).then(() => applyLink(link));
    else writeLink();
    state.linked = true;
    if (state.status !== "stored") connect();
  })();
})();
