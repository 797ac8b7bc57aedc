// Kipimo dashboard: this run against its baseline (GET /api/baseline), when
// the run was started with --baseline. One row per function both runs have,
// by extra time (this run's time less what its calls took at the baseline's
// mean per call): the ratios of time and calls per io_step, p50 and p99
// against the baseline's, and what is significantly worse (a new slow mode,
// a shifted p99, more calls). Hidden without a baseline. Polled every 5 s.
"use strict";
(function () {
  const params = new URLSearchParams(location.search);
  const token = params.get("token");
  const withToken = (u) => token ? u + (u.includes("?") ? "&" : "?") + "token=" + encodeURIComponent(token) : u;
  const $ = (id) => document.getElementById(id);
  const ms = (us) => Math.abs(us) >= 1e6 ? (us / 1e6).toPrecision(3) + " s" : Math.abs(us) >= 1e3 ? (us / 1e3).toPrecision(3) + " ms" : Math.round(us) + " µs";
  const x = (r) => r > 0 && isFinite(r) ? r.toFixed(2) + "x" : "";
  const us = (v) => v === undefined || !isFinite(v) ? "–" : ms(v);
  const pair = (a, b) => a || b ? `${us(a)} (${us(b)})` : "";
  function cell(tr, text, cls) { const td = document.createElement("td"); td.textContent = text; if (cls) td.className = cls; tr.appendChild(td); return td; }

  function fill(rep) {
    $("p-baseline").hidden = false;
    const steps = rep.io_steps ? `, ${rep.io_steps} io_steps here` + (rep.baseline_io_steps ? `, ${rep.baseline_io_steps} there` : "") : "";
    $("baseline-msg").textContent = `against ${rep.source} (${rep.kind}; ${rep.compared})${steps}; p50 and p99 with the baseline's in brackets; tests at ${rep.level.toExponential(1)} per function`;
    const tb = $("baseline-table").querySelector("tbody");
    tb.textContent = "";
    for (const f of rep.functions) {
      const tr = document.createElement("tr");
      if (f.slower && f.slower.length) tr.className = "slower";
      cell(tr, f.func); cell(tr, ms(f.extra_us), "num"); cell(tr, x(f.time_per_step_ratio), "num"); cell(tr, x(f.calls_ratio), "num");
      cell(tr, pair(f.p50_us, f.baseline_p50_us), "num"); cell(tr, pair(f.p99_us, f.baseline_p99_us), "num");
      let why = (f.slower || []).join(", ");
      if (f.new_mode) why += ` (${f.new_mode.in_mode} calls from ${ms(f.new_mode.from_us)}, typically ${ms(f.new_mode.typical_us)}; p = ${f.new_mode.p_value.toExponential(1)})`;
      cell(tr, why);
      tb.appendChild(tr);
    }
    const absent = rep.absent || [], missing = rep.missing || [];
    $("baseline-absent").textContent = (absent.length ? `not in the baseline (listed, not compared): ${absent.join(", ")}. ` : "") +
      (missing.length ? `in the baseline, not called here: ${missing.join(", ")}.` : "");
  }

  async function load() {
    try {
      const res = await fetch(withToken("api/baseline?n=30"));
      if (res.status === 404) return; // no baseline: the panel stays hidden
      if (!res.ok) throw new Error(res.status + " " + res.statusText);
      fill(await res.json());
    } catch (e) {
      $("p-baseline").hidden = false;
      $("baseline-msg").textContent = "The baseline comparison did not answer: " + e.message;
    }
  }
  load();
  setInterval(load, 5000);
})();
