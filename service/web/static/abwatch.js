// Draws the dashboard's charts from the page's embedded JSON (#page-data) with plotly.js.
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("page-data").textContent);
  const layoutBase = { margin: { l: 60, r: 20, t: 30, b: 50 }, hovermode: "closest",
                       paper_bgcolor: "#fff", plot_bgcolor: "#fff" };
  const config = { displaylogo: false, responsive: true };
  // plotly.js 3 takes a title only as {text}: a bare string draws no title at all
  const titled = text => ({ text: text });
  const SHA = /^[0-9a-f]{40}$/;
  // a commit's label: a sha's first 8, a version or tag whole ("0.27.0.post1", never "0.27.0.p")
  const label = p => SHA.test(p.sha) ? p.sha.slice(0, 8) : p.sha;

  // A y range that shows a change at its size: at least +-5 % around the median, so a 0.4 %
  // step reads as 0.4 %, not as a cliff across the whole chart; wider where the data are.
  function honestRange(values) {
    const sorted = values.filter(v => v !== null && isFinite(v)).sort((a, b) => a - b);
    if (!sorted.length) return undefined;
    const median = sorted[Math.floor(sorted.length / 2)];
    const lo = Math.min(sorted[0], median * 0.95), hi = Math.max(sorted[sorted.length - 1], median * 1.05);
    const pad = (hi - lo) * 0.05;
    return [Math.max(0, lo - pad), hi + pad];
  }

  // an empty chart says so instead of drawing empty axes
  function empty(el, what) {
    el.classList.add("chart-empty");
    el.textContent = what;
  }

  function drawTrend(el, dev) {
    const pts = dev.points;
    if (!pts.length) return empty(el, "No measured commit on this device yet.");
    const x = pts.map((p, i) => i);
    const labels = pts.map(p => p.sha.slice(0, 10) + " " + (p.summary || ""));
    const traces = [{
      x: x, y: pts.map(p => p.ms), mode: "lines+markers", name: "ms (fastest per process)",
      text: labels, customdata: pts.map(p => p.run_id),
      hovertemplate: "%{text}<br>%{y:.3f} ms<br>run %{customdata}<extra></extra>",
      line: { color: "#1c5fd1" }, marker: { size: 8 }
    }];
    const regBySha = new Map(dev.regressions.map(r => [r.treatment_sha, r]));
    const reg = pts.map((p, i) => [p, i]).filter(([p]) => regBySha.has(p.sha));
    if (reg.length) {
      traces.push({ x: reg.map(([, i]) => i), y: reg.map(([p]) => p.ms), mode: "markers",
                    name: "regression", marker: { color: "#d11c1c", size: 15, symbol: "triangle-up" },
                    customdata: reg.map(([p]) => regBySha.get(p.sha).run_id),
                    text: reg.map(([p]) => "#" + regBySha.get(p.sha).id + " " + regBySha.get(p.sha).state +
                                          " " + regBySha.get(p.sha).change_pct.toFixed(2) + "%"),
                    hovertemplate: "regression %{text}<br>found by run %{customdata}<extra></extra>" });
    }
    const shapes = dev.change_points.map(c => ({
      type: "line", x0: c.index - 0.5, x1: c.index - 0.5, yref: "paper", y0: 0, y1: 1,
      line: { color: "#d18a1c", dash: "dash", width: 2 }
    }));
    const layout = Object.assign({}, layoutBase, {
      shapes: shapes, xaxis: { tickvals: x, ticktext: pts.map(label), title: titled("commit (oldest first)"),
                               automargin: true },
      yaxis: { title: titled("ms, fastest per process (median)"),
               range: honestRange(pts.map(p => p.ms)) }, legend: { orientation: "h" },
      hovermode: "x"  // a click reports every trace at that commit, so a regression can win
    });
    Plotly.newPlot(el, traces, layout, config);
    el.on("plotly_click", ev => {
      // the run that found the regression, else the run that measured the commit
      const point = ev.points.find(p => p.data.name === "regression") || ev.points[0];
      const run = point.customdata;
      if (run) window.location.href = "/runs/" + run;
    });
  }

  function drawProcesses(el, workload) {
    const sides = (data.process_medians_ms || {})[workload] || {};
    if (!(sides.control || []).length && !(sides.treatment || []).length) {
      return empty(el, workload + ": no samples were kept for this run (not measured, or pruned).");
    }
    const traces = ["control", "treatment"].filter(s => sides[s]).map(s => ({
      y: sides[s], x: sides[s].map((_, i) => i + 1), name: s, mode: "markers+lines", type: "scatter",
      marker: { size: 8, color: s === "control" ? "#1c5fd1" : "#d1541c" }, line: { width: 1 }
    }));
    const layout = Object.assign({}, layoutBase, {
      title: { text: workload + ": per-process medians", font: { size: 14 } },
      xaxis: { title: titled("process (pair), in the order run") },
      yaxis: { title: titled("median per process, ms"),
               range: honestRange([...(sides.control || []), ...(sides.treatment || [])]) }
    });
    Plotly.newPlot(el, traces, layout, config);
  }

  function drawTimeline(el) {
    const events = data.events || [];
    if (!events.length) return empty(el, "No state change recorded.");
    const order = ["benchmark", "verify", "regress", "cleared", "fixed"];
    const trace = { x: events.map(e => e.at), y: events.map(e => e.to), mode: "lines+markers",
                    line: { shape: "hv", color: "#1d2330" }, marker: { size: 10 },
                    text: events.map(e => e.reason), hovertemplate: "%{y}<br>%{x}<br>%{text}<extra></extra>" };
    const layout = Object.assign({}, layoutBase, {
      yaxis: { type: "category", categoryorder: "array", categoryarray: order, title: titled("state") },
      xaxis: { title: titled("time (UTC)") }, height: 300
    });
    Plotly.newPlot(el, [trace], layout, config);
  }

  document.querySelectorAll(".trend-chart").forEach(el =>
    drawTrend(el, data.devices[Number(el.dataset.deviceIndex)]));
  document.querySelectorAll(".process-chart").forEach(el => drawProcesses(el, el.dataset.workload));
  document.querySelectorAll(".timeline-chart").forEach(el => drawTimeline(el));

  const form = document.getElementById("triage-form");
  if (form) {
    form.addEventListener("submit", async ev => {
      ev.preventDefault();
      const f = new FormData(form);
      const body = { as: f.get("as"), who: f.get("who"), note: f.get("note") || "" };
      if (f.get("issue_url")) body.issue_url = f.get("issue_url");
      if (f.get("fixed_by")) body.fixed_by = f.get("fixed_by");
      const status = document.getElementById("triage-status");
      const resp = await fetch("/api/regressions/" + data.id + "/triage", {
        method: "POST", headers: { "Content-Type": "application/json",
                                   "Authorization": "Bearer " + f.get("token") },
        body: JSON.stringify(body) });
      if (resp.ok) { window.location.reload(); }
      else { status.textContent = "refused: " + (await resp.json()).detail; status.className = "error"; }
    });
  }
})();
