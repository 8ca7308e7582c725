// The fleet's own jobs: loss by step with one legend entry per device (through every round
// of a federated fleet; a fleet of up to 32 devices), each listed device's final loss against its memory budget, and a
// federated fleet's global loss per round beside its references.
(function () {
  // an axis range around the values with room below and above, as fractions of their span
  // (of `flat` when they are all one value)
  const padded = (values, below, above, flat) => {
    const low = Math.min(...values), high = Math.max(...values);
    const span = high - low || flat;
    return [low - below * span, high + above * span];
  };
  const data = JSON.parse(document.getElementById("chart-data").textContent);
  const config = {displaylogo: false, responsive: true};
  if (document.getElementById("loss-chart")) {  // a fleet small enough for a curve each
    Plotly.newPlot("loss-chart", data.curves.map((c) => ({
      type: "scatter", mode: "lines", x: c.steps, y: c.loss, name: c.label, customdata: c.jobs,
      hovertemplate: `${c.label}<br>step %{x}: %{y:.4f}<extra>%{customdata}</extra>`,
    })), {
      margin: {t: 20, r: 20}, yaxis: {title: {text: "loss"}},
      xaxis: {title: {text: data.rounds.length ? "step (round × local steps + local step)" : "step"}},
      legend: {orientation: "h", y: -0.25},
    }, config);
  }
  if (document.getElementById("budget-chart")) {  // once a device has a final loss
    const done = data.members.filter((m) => m.final_loss !== null);
    const label = (m) => (m.shard === null ? m.device : `${m.device} · shard ${m.shard + 1}`);
    const budgets = done.map((m) => Math.log10(m.budget_mb));  // the x axis is a log one
    const losses = done.map((m) => m.final_loss);
    const [left, right] = padded(budgets, 0.15, 0.15, 0.3);
    const third = (right - left) / 3;
    Plotly.newPlot("budget-chart", [{
      type: "scatter", mode: "markers+text", name: "final training loss",
      x: done.map((m) => m.budget_mb), y: losses, text: done.map(label), cliponaxis: false,
      // each label above its point and toward the middle, so it stays inside the plot
      textposition: budgets.map((x) => (x < left + third ? "top right"
        : x > right - third ? "top left" : "top center")),
      marker: {size: 10}, hovertemplate: "%{text}<br>%{x:.0f} MB: %{y:.4f}<extra></extra>",
    }], {
      margin: {t: 20, r: 20}, showlegend: false,
      xaxis: {title: {text: "device memory budget (MB)"}, type: "log", range: [left, right]},
      yaxis: {title: {text: "final training loss"},
              range: padded(losses, 0.1, 0.3, Math.abs(losses[0]) * 0.1 || 1)},
    }, config);
  }
  const evaluated = data.rounds.filter((r) => r.eval_loss !== null);
  if (document.getElementById("round-chart")) {  // once a round has a global validation loss
    let clock = 0;  // simulated on-device seconds at the end of each round
    const ends = data.rounds.map((r) => (clock += r.simulated_wall_s || 0));
    const traces = [{
      type: "scatter", mode: "lines+markers", name: "global adapter",
      x: evaluated.map((r) => r.index), y: evaluated.map((r) => r.eval_loss),
      customdata: evaluated.map((r) => ends[r.index]),
      hovertemplate: "round %{x}: %{y:.4f}<br>%{customdata:.1f} s simulated<extra></extra>",
    }];
    // the references are one figure each: a level line across the rounds
    const span = [0, Math.max(data.rounds.length - 1, 1)];
    const refs = data.references || {};
    const level = (name, value, dash) => ({
      type: "scatter", mode: "lines", name, x: span, y: [value, value],
      line: {dash, color: "gray"}, hovertemplate: `${name}: %{y:.4f}<extra></extra>`,
    });
    if (refs.local_only_mean != null) {
      traces.push(level("local-only (mean of devices)", refs.local_only_mean, "dot"));
    }
    if (refs.centralized != null) {
      traces.push(level("centralized (same examples)", refs.centralized, "dash"));
    }
    Plotly.newPlot("round-chart", traces, {
      margin: {t: 20, r: 20}, showlegend: traces.length > 1,
      legend: {orientation: "h", y: -0.25},
      xaxis: {title: {text: "round"}, dtick: 1, zeroline: false,
              range: [span[0] - 0.25, span[1] + 0.25]},
      yaxis: {title: {text: "validation loss of the global adapter"}},
    }, config);
  }
})();
