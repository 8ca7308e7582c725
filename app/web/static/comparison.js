// A comparison's page: validation loss against the phone's estimated time (one bold curve
// per method at its best learning rate, the other rates faint, failed runs marked), peak
// memory per method, and its tables; polled from GET /v1/comparisons/{id} until done.
(function () {
  const METHODS = window.MEBP_METHODS;
  const NAMES = Object.fromEntries(Object.entries(METHODS).map(([k, m]) => [k, m.name]));
  const FAILED = "#e45756";
  const POLL_MS = 3000;
  const config = {displaylogo: false, responsive: true};
  const fmt = (value, digits) => (value == null ? "–" : Number(value).toFixed(digits));
  const el = (tag, text, className) => {
    const node = document.createElement(tag);
    if (text != null) node.textContent = text;
    if (className) node.className = className;
    return node;
  };

  function runLabel(run) { return `${NAMES[run.method]} lr ${run.learning_rate}`; }

  function curveTraces(data) {
    const traces = [], untimed = [];
    for (const method of data.methods) {
      for (const run of method.runs) {
        const best = run.job_id === method.best_job_id;
        const points = run.curve.filter((p) => p.device_time_s != null);
        if (run.curve.length && !points.length) {
          if (best) untimed.push(NAMES[method.method]);
          continue;
        }
        const name = best ? `${NAMES[method.method]} (best: lr ${run.learning_rate})` : runLabel(run);
        traces.push({
          type: "scatter", mode: "lines+markers", name, legendgroup: method.method,
          showlegend: best || run.status === "failed", opacity: best ? 1 : 0.3,
          x: points.map((p) => p.device_time_s), y: points.map((p) => p.val_loss),
          customdata: points.map((p) => [p.step, p.host_time_s == null ? NaN : p.host_time_s]),
          line: {color: METHODS[method.method].color, width: best ? 3 : 1,
                 dash: best ? "solid" : "dot"},
          marker: {size: best ? 7 : 4, symbol: METHODS[method.method].symbol},
          hovertemplate: `${name}<br>loss %{y:.4f} at %{x:.0f} s of phone time (est.)` +
            "<br>step %{customdata[0]}, %{customdata[1]:.1f} s on this host<extra></extra>",
        });
        if (run.status === "failed" && points.length) {  // where it stopped, marked
          const last = points[points.length - 1];
          traces.push({
            type: "scatter", mode: "markers", name: `failed: ${runLabel(run)}`,
            legendgroup: method.method, showlegend: false, x: [last.device_time_s],
            y: [last.val_loss], marker: {symbol: "x", size: 14, color: FAILED},
            hovertemplate: `${runLabel(run)} failed: ${run.error ? run.error.code : ""}<extra></extra>`,
          });
        }
      }
    }
    return {traces, untimed};
  }

  function drawCurves(data) {
    const {traces, untimed} = curveTraces(data);
    const xs = traces.flatMap((t) => t.x).filter((x) => x > 0);
    const wide = xs.length && Math.max(...xs) / Math.min(...xs) > 50;
    Plotly.react("curve-chart", traces, {
      margin: {t: 20, r: 20}, legend: {orientation: "h", y: -0.2},
      xaxis: {title: {text: `time on ${data.device} (estimated seconds)`},
              type: wide ? "log" : "linear"},
      yaxis: {title: {text: "validation loss"}},
      annotations: traces.length ? [] : [{xref: "paper", yref: "paper", x: 0.5, y: 0.5,
        showarrow: false, text: data.status === "done" ? "no run produced a validation loss"
          : "waiting for the first validation"}],
    }, config);
    const note = document.getElementById("no-estimate");
    note.hidden = !untimed.length;
    note.textContent = untimed.length ? `Not on this axis (no device estimate; by step in the ` +
      `tables): ${untimed.join(", ")}.` : "";
  }

  function drawMemory(data) {
    const methods = data.methods;
    const names = methods.map((m) => NAMES[m.method]);
    Plotly.react("memory-chart", [
      {type: "bar", name: "predicted", x: names, y: methods.map((m) => m.predicted_peak_mb),
       marker: {color: "#bbbbbb"}, hovertemplate: "%{x}: %{y:.0f} MB predicted<extra></extra>"},
      {type: "bar", name: "measured", x: names, y: methods.map((m) => m.measured_peak_mb),
       marker: {color: methods.map((m) => METHODS[m.method].color)},
       hovertemplate: "%{x}: %{y:.0f} MB measured (its jobs' highest)<extra></extra>"},
    ], {
      margin: {t: 20, r: 20}, barmode: "group", legend: {orientation: "h", y: -0.2},
      yaxis: {title: {text: "peak MB (anonymous + shared)"}, rangemode: "tozero"},
      shapes: [{type: "line", xref: "paper", x0: 0, x1: 1, y0: data.memory_budget_mb,
                y1: data.memory_budget_mb, line: {color: FAILED, dash: "dash", width: 2}}],
      annotations: [{xref: "paper", x: 0, y: data.memory_budget_mb, yanchor: "bottom",
                     xanchor: "left", showarrow: false, font: {color: FAILED},
                     text: `budget ${Math.round(data.memory_budget_mb)} MB`}],
    }, config);
  }

  function fillTable(id, rows) {
    const body = document.querySelector(`#${id} tbody`);
    body.replaceChildren(...rows);
  }

  function methodRow(m) {
    const row = el("tr", null, m.verdict);
    row.dataset.method = m.method;
    const cells = [NAMES[m.method], m.steps ?? "–", fmt(m.device_step_time_s_estimate, 2),
                   m.best_learning_rate ?? "–", fmt(m.best_val_loss, 4),
                   `${fmt(m.predicted_peak_mb, 0)} / ${fmt(m.measured_peak_mb, 0)}`];
    cells.forEach((text) => row.appendChild(el("td", text)));
    const note = el("td");
    if (m.verdict !== "runs") note.appendChild(el("span", m.verdict.replaceAll("_", " "), "badge " + m.verdict));
    if (m.reason) note.appendChild(el("span", " " + m.reason, "muted"));
    row.appendChild(note);
    return row;
  }

  function runRow(method, run) {
    const row = el("tr", null, run.status + (run.job_id === method.best_job_id ? " best" : ""));
    row.dataset.job = run.job_id;
    row.appendChild(el("td", NAMES[run.method]));
    row.appendChild(el("td", String(run.learning_rate)));
    const state = el("td");
    state.appendChild(el("span", run.status, "badge " + run.status));
    if (run.error) {
      state.appendChild(el("span", ` ${run.error.code}`, "code"));
      state.title = run.error.message;
    }
    row.appendChild(state);
    row.appendChild(el("td", `${run.step} / ${run.total_steps}`));
    row.appendChild(el("td", `${fmt(run.best_val_loss, 4)} / ${fmt(run.final_val_loss, 4)}`));
    row.appendChild(el("td", `${fmt(run.predicted_peak_mb, 0)} / ${fmt(run.measured_peak_mb, 0)}`));
    const link = el("td");
    const a = el("a", run.job_id);
    a.href = `/jobs/${run.job_id}`;
    link.appendChild(a);
    row.appendChild(link);
    return row;
  }

  function render(data) {
    const badge = document.getElementById("comparison-status");
    badge.textContent = data.status;
    badge.className = "badge " + data.status;
    document.getElementById("comparison-summary").textContent = data.summary;
    const cancel = document.getElementById("cancel");
    if (cancel && data.status === "done") cancel.closest("form").hidden = true;
    drawCurves(data);
    drawMemory(data);
    fillTable("method-table", data.methods.map(methodRow));
    fillTable("run-table", data.methods.flatMap((m) => m.runs.map((run) => runRow(m, run))));
  }

  async function poll(id) {
    try {
      const response = await fetch(`/v1/comparisons/${id}`, {credentials: "same-origin"});
      if (response.ok) {
        const data = await response.json();
        render(data);
        if (data.status === "done") return;
      }
    } catch (error) { /* the service restarting: try again */ }
    setTimeout(() => poll(id), POLL_MS);
  }

  const data = JSON.parse(document.getElementById("comparison-data").textContent);
  render(data);
  if (data.status !== "done") setTimeout(() => poll(data.id), POLL_MS);
})();
