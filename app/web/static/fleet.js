// The fleet's own jobs: loss by step with one legend entry per device, and each device's
// final loss against its memory budget.
(function () {
  const data = JSON.parse(document.getElementById("chart-data").textContent);
  const config = {displaylogo: false, responsive: true};
  Plotly.newPlot("loss-chart", data.curves.map((c) => ({
    type: "scatter", mode: "lines", x: c.steps, y: c.loss, name: c.label,
    hovertemplate: `${c.label}<br>step %{x}: %{y:.4f}<extra>${c.job_id}</extra>`,
  })), {
    margin: {t: 20, r: 20}, xaxis: {title: {text: "step"}}, yaxis: {title: {text: "loss"}},
    legend: {orientation: "h", y: -0.25},
  }, config);
  const done = data.members.filter((m) => m.final_loss !== null);
  const label = (m) => (m.shard === null ? m.device : `${m.device} · shard ${m.shard + 1}`);
  Plotly.newPlot("budget-chart", [{
    type: "scatter", mode: "markers+text", name: "final loss",
    x: done.map((m) => m.budget_mb), y: done.map((m) => m.final_loss),
    text: done.map(label), textposition: "top center", marker: {size: 10},
    hovertemplate: "%{text}<br>%{x:.0f} MB: %{y:.4f}<extra></extra>",
  }], {
    margin: {t: 20, r: 20}, showlegend: false,
    xaxis: {title: {text: "device memory budget (MB)"}, type: "log"},
    yaxis: {title: {text: "final loss"}},
  }, config);
  const evaluated = data.rounds.filter((r) => r.eval_loss !== null);
  if (document.getElementById("round-chart")) {
    let clock = 0;  // simulated on-device seconds at the end of each round
    const ends = data.rounds.map((r) => (clock += r.simulated_wall_s || 0));
    Plotly.newPlot("round-chart", [{
      type: "scatter", mode: "lines+markers", name: "global adapter",
      x: evaluated.map((r) => r.index), y: evaluated.map((r) => r.eval_loss),
      customdata: evaluated.map((r) => ends[r.index]),
      hovertemplate: "round %{x}: %{y:.4f}<br>%{customdata:.1f} s simulated<extra></extra>",
    }], {
      margin: {t: 20, r: 20}, showlegend: false,
      xaxis: {title: {text: "round"}, dtick: 1},
      yaxis: {title: {text: "validation loss of the global adapter"}},
    }, config);
  }
})();
