// Kipimo dashboard: the culprit analysis (GET /api/culprits). Outlier ranks
// over the latest bursts' io_steps, one row per (rank, function) that stood
// out, coloured by its excess over its peers on a log scale (only ranks that
// stood out get a row, so it reads at any number of ranks); the culprits by
// time lost; and the latest bursts, each culprit a link to its anomalies
// (and their call stacks) in the panel below. Polled every 5 s.
"use strict";
(function () {
  const params = new URLSearchParams(location.search);
  const token = params.get("token");
  const withToken = (u) => token ? u + (u.includes("?") ? "&" : "?") + "token=" + encodeURIComponent(token) : u;
  const $ = (id) => document.getElementById(id);
  const ms = (us) => us >= 1e6 ? (us / 1e6).toPrecision(3) + " s" : us >= 1e3 ? (us / 1e3).toPrecision(3) + " ms" : Math.round(us) + " µs";
  const ROWS = 48, COLS = 120;

  // show lists the anomalies of a culprit in the details panel, around its io_step
  function show(rank, fn, step) {
    $("f-rank").value = rank; $("f-func").value = fn || "";
    $("f-step-min").value = Math.max(0, step - 1); $("f-step-max").value = step + 1;
    $("filters").requestSubmit();
    $("details").scrollIntoView({ behavior: "smooth" });
  }
  function cell(tr, text, cls) { const td = document.createElement("td"); td.textContent = text; if (cls) td.className = cls; tr.appendChild(td); return td; }

  function drawMap(c) {
    const cv = $("outlier-map"), ctx = cv.getContext("2d");
    const rows = c.outlier_ranks.slice(0, ROWS);
    const steps = [...new Set(c.bursts.map((b) => b.io_step))].slice(-COLS);
    const col = new Map(steps.map((s, i) => [s, i]));
    const w = cv.width, h = Math.max(20, rows.length * 12);
    cv.height = h;
    ctx.clearRect(0, 0, w, h);
    if (!rows.length || !steps.length) { $("outlier-legend").textContent = "no rank stood out from its peers"; return; }
    const cw = w / steps.length, rh = h / rows.length;
    const key = (r, f) => r + "\u0000" + f;
    const index = new Map(rows.map((r, i) => [key(r.rank, r.func), i]));
    let max = 1;
    for (const b of c.bursts) for (const o of b.outliers) max = Math.max(max, o.excess_us);
    for (const b of c.bursts) {
      const x = col.get(b.io_step);
      if (x === undefined) continue;
      for (const o of b.outliers) {
        const y = index.get(key(o.rank, o.func));
        if (y === undefined) continue;
        // log scale from 1 ms to the largest excess: pale yellow to dark red
        const t = Math.min(1, Math.max(0, Math.log(o.excess_us / 1000) / Math.log(Math.max(2, max / 1000))));
        ctx.fillStyle = `hsl(${50 - 50 * t}, 90%, ${85 - 55 * t}%)`;
        ctx.fillRect(x * cw, y * rh, Math.max(1, cw - 1), Math.max(1, rh - 1));
      }
    }
    $("outlier-legend").textContent = `rows: ${rows.map((r) => "rank " + r.rank + " " + r.func + (r.standing ? " (standing)" : "")).join(", ")}; columns: io_steps ${steps[0]}..${steps[steps.length - 1]}; colour: excess over the peers, 1 ms (pale) to ${ms(max)} (dark)`;
  }

  function fill(c) {
    $("culprits-msg").textContent = `${c.steps_analysed} io_steps analysed` + (c.steps_pending ? `, ${c.steps_pending} waiting for ranks` : "");
    const tb = $("culprit-table").querySelector("tbody");
    tb.textContent = "";
    for (const r of c.culprits.slice(0, 20)) {
      const tr = document.createElement("tr");
      cell(tr, r.rank, "num"); cell(tr, r.func || "(unreported)"); cell(tr, ms(r.time_lost_us), "num");
      cell(tr, ms(r.own_us), "num"); cell(tr, ms(r.caused_us), "num"); cell(tr, r.bursts, "num"); cell(tr, r.top, "num");
      tr.addEventListener("click", () => show(r.rank, r.func, r.io_steps[r.io_steps.length - 1]));
      tb.appendChild(tr);
    }
    const bl = $("burst-list");
    bl.textContent = "";
    for (const b of c.bursts.slice(-20).reverse()) {
      const li = document.createElement("li");
      li.append(`io_step ${b.io_step}: ${b.anomalies} anomalies on ${b.anomalous_ranks} of ${b.ranks} ranks, ${ms(b.wait_us)} waited; culprits `);
      b.culprits.forEach((cu, i) => {
        const a = document.createElement("a");
        a.href = "#details";
        a.textContent = `rank ${cu.rank} ${cu.func || "(unreported)"} (${ms(cu.time_lost_us)}${cu.victim_count ? ", " + cu.victim_count + " ranks waited" : ""})`;
        a.addEventListener("click", (ev) => { ev.preventDefault(); show(cu.rank, cu.func, cu.io_step); });
        if (i) li.append(", ");
        li.append(a);
      });
      if (!b.culprits.length) li.append("none");
      bl.appendChild(li);
    }
    drawMap(c);
  }

  async function load() {
    try {
      const res = await fetch(withToken("api/culprits?n=200"));
      if (!res.ok) throw new Error(res.status + " " + res.statusText);
      fill(await res.json());
    } catch (e) {
      $("culprits-msg").textContent = "The culprit analysis did not answer: " + e.message;
    }
  }
  load();
  setInterval(load, 5000);
})();
