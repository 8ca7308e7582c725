// Every job on the fleet's data, colored by method: mebp against mezo on one chart.
(function () {
  const curves = JSON.parse(document.getElementById("chart-data").textContent).curves;
  const colors = {mebp: "#4c78a8", mezo: "#f58518", backprop: "#54a24b"};
  const seen = new Set();
  const traces = curves.map((c) => {
    const first = !seen.has(c.method);
    seen.add(c.method);
    return {type: "scatter", mode: "lines", x: c.steps, y: c.loss, name: c.method,
            legendgroup: c.method, showlegend: first,
            line: {color: colors[c.method] || "#888", width: 1.5},
            hovertemplate: `${c.job_id} (${c.device || "custom"})<br>step %{x}: %{y:.4f}<extra>${c.method}</extra>`};
  });
  Plotly.newPlot("methods-chart", traces, {
    margin: {t: 20, r: 20}, xaxis: {title: {text: "step"}}, yaxis: {title: {text: "loss"}},
    legend: {orientation: "h", y: -0.2},
  }, {displaylogo: false, responsive: true});
})();
