// The trade-off chart: peak memory against seconds per step, one point per configuration,
// of one method or of every method side by side; a second chart beside it when another
// device or sequence length is compared, on the same axes.
(function () {
  // each method its own colour and marker shape (methods.js); a configuration predicted not
  // to fit is drawn open
  const METHOD_STYLE = window.MEBP_METHODS;

  const data = JSON.parse(document.getElementById("chart-data").textContent);
  if (!data.charts.length) return;
  const form = window.explorerForm;
  const built = data.charts.map(build);
  const peaks = built.flatMap((b) => b.peaks), times = built.flatMap((b) => b.times);
  built.forEach((b, i) => draw(i === 0 ? "tradeoff-chart" : `tradeoff-chart-${i + 1}`, b,
                               peaks, times));

  // a log axis over the values with a little room, ticked at 1, 2 and 5 times powers of ten,
  // or at more digits where that gives fewer than minTicks labels, or else at minTicks + 1
  // even steps (two significant figures)
  function logAxis(values, label, minTicks) {
    const low = Math.min(...values) / 1.3, high = Math.max(...values) * 1.3;
    const ticksAt = (multiples) => {
      const ticks = [];
      for (let p = Math.floor(Math.log10(low)); p <= Math.ceil(Math.log10(high)); p++) {
        for (const m of multiples) {
          const v = m * 10 ** p;
          if (v >= low && v <= high) ticks.push(Number(v.toPrecision(2)));
        }
      }
      return ticks;
    };
    const denser = [[1, 2, 5], [1, 2, 3, 5, 7], [1, 1.5, 2, 3, 4, 5, 6, 7, 8, 9],
                    [1, 1.25, 1.5, 1.75, 2, 2.5, 3, 3.5, 4, 4.5, 5, 6, 7, 8, 9]];
    let ticks = denser.map(ticksAt).find((t) => t.length >= (minTicks || 2));
    if (!ticks) {
      const [a, b] = [Math.log10(low), Math.log10(high)], n = (minTicks || 2) + 1;
      ticks = [...new Set(Array.from({length: n}, (_, i) =>
        Number((10 ** (a + (b - a) * (i + 0.5) / n)).toPrecision(2))))];
    }
    return {range: [Math.log10(low), Math.log10(high)], tickvals: ticks,
            ticktext: ticks.map(label)};
  }

  function build(entry) {
    const plans = Object.values(entry.plans);
    const configs = plans.flatMap((plan) => plan.configurations);
    const byId = Object.fromEntries(configs.map((c) => [c.id, c]));
    // with a device the plans rank by the phone's estimated time: that is the y axis, and
    // this host's predicted time is in the hover
    const onDevice = plans.every((plan) => plan.ranked_by === "device");
    const timeOf = (c) => onDevice ? c.device_step_time_s_estimate : c.step_time_s;
    const several = plans.length > 1;
    const trace = (name, points, marker, extra) => Object.assign({
      name, type: "scatter", mode: "markers",
      x: points.map((c) => c.peak_mb), y: points.map(timeOf),
      customdata: points.map((c) => c.id),
      text: points.map((c) => (several ? entry.names[c.method] + " " : "") + c.id +
        (c.reason ? "<br>" + c.reason : "") +
        (onDevice ? "<br>this host (predicted): " + c.step_time_s.toFixed(3) + " s/step" :
          (c.device_step_time_s_estimate != null ? "<br>on device (est.): " +
            c.device_step_time_s_estimate.toFixed(2) + " s/step" : ""))),
      hovertemplate: "%{text}<br>%{x:.0f} MB, %{y:.3f} s/step<extra>" + name + "</extra>",
      marker,
    }, extra || {});
    const traces = several ? methodTraces(entry, trace) : planTraces(configs, trace);
    if (byId[entry.recommended]) {
      traces.push(trace("recommended", [byId[entry.recommended]],
                        {symbol: "star", color: "#e45756", size: 20,
                         line: {color: "#333", width: 1}}));
    }
    // measured on this host: at the phone's estimate for that configuration on a device axis
    const measured = entry.measured.filter((m) => !onDevice || byId[m.configuration]);
    const joins = measured.filter((m) => byId[m.configuration]);  // joined to predictions
    if (joins.length) {
      traces.push({
        name: "measured ↔ predicted", type: "scatter", mode: "lines", hoverinfo: "skip",
        x: joins.flatMap((m) => [m.peak_mb, byId[m.configuration].peak_mb, null]),
        y: joins.flatMap((m) => [onDevice ? timeOf(byId[m.configuration]) : m.step_time_s,
                                 timeOf(byId[m.configuration]), null]),
        line: {color: "#222", width: 1, dash: "dot"},
      });
    }
    if (measured.length) {
      traces.push({
        name: "measured", type: "scatter", mode: "markers",
        x: measured.map((m) => m.peak_mb),
        y: measured.map((m) => onDevice ? timeOf(byId[m.configuration]) : m.step_time_s),
        customdata: measured.map((m) => m.configuration),
        text: measured.map((m) => m.configuration + "<br>measured by " + m.job_id +
          (onDevice ? ": " + m.step_time_s.toFixed(3) + " s/step on this host" : "")),
        hovertemplate: "%{text}<br>%{x:.0f} MB, %{y:.3f} s/step<extra>measured</extra>",
        marker: {symbol: "diamond", color: "#222", size: 11},
      });
    }
    const peaks = configs.map((c) => c.peak_mb).concat(measured.map((m) => m.peak_mb));
    const budget = plans[0].budget_mb;
    if (budget) peaks.push(budget);
    return {entry, plan: plans[0], byId, onDevice, traces, peaks,
            times: traces.flatMap((t) => t.y).filter((y) => y > 0)};
  }

  // one method: its front highlighted against its other configurations
  function planTraces(configs, trace) {
    const infeasible = configs.filter((c) => c.feasible === false);
    const fits = configs.filter((c) => c.feasible !== false && !c.pareto);
    const front = configs.filter((c) => c.pareto && c.feasible !== false)
      .sort((a, b) => a.peak_mb - b.peak_mb);
    const frontInfeasible = configs.filter((c) => c.pareto && c.feasible === false);
    return [
      trace("does not fit", infeasible.filter((c) => !c.pareto), {color: "#bbb", size: 8}),
      trace("fits", fits, {color: "#4c78a8", size: 9}),
      trace("Pareto front", front, {color: "#f58518", size: 13, line: {color: "#333", width: 1}},
            {mode: "lines+markers", line: {color: "#f58518", width: 1, dash: "dot"}}),
      trace("Pareto front (does not fit)", frontInfeasible,
            {color: "#bbb", size: 13, line: {color: "#f58518", width: 2}}),
    ];
  }

  // every method on the same axes: each front a line of its own colour and marker, the
  // method's other configurations faint behind it
  function methodTraces(entry, trace) {
    return Object.entries(entry.plans).flatMap(([method, plan]) => {
      const style = METHOD_STYLE[method], name = entry.names[method];
      const shape = (c) => c.feasible === false ? style.symbol + "-open" : style.symbol;
      const front = plan.configurations.filter((c) => c.pareto)
        .sort((a, b) => a.peak_mb - b.peak_mb);
      const rest = plan.configurations.filter((c) => !c.pareto);
      return [
        trace(name + " (other configurations)", rest,
              {color: style.color, symbol: rest.map(shape), size: 7, opacity: 0.3},
              {legendgroup: method}),
        trace(name + " front", front,
              {color: style.color, symbol: front.map(shape), size: 12,
               line: {color: style.color, width: 2}},
              {mode: "lines+markers", legendgroup: method,
               line: {color: style.color, width: 1.5}}),
      ];
    });
  }

  function draw(id, b, peaks, times) {
    const plan = b.plan;
    // on a log axis Plotly places shapes at data values but annotations in log10 units
    const shapes = [], annotations = [];
    // the budget, labelled above the plot, and left of it the largest peak that fits with
    // the margin, labelled inside: points between the lines are under budget but do not fit
    const vertical = (mb, text, color, dash, yanchor) => {
      shapes.push({type: "line", xref: "x", yref: "paper", x0: mb, x1: mb, y0: 0, y1: 1,
                   line: {color, width: 2, dash}});
      annotations.push({x: Math.log10(mb), y: 1, xref: "x", yref: "paper", text,
                        showarrow: false, xanchor: "right", yanchor, font: {color}});
    };
    if (plan.budget_mb) {
      vertical(plan.budget_mb, "budget " + Math.round(plan.budget_mb) + " MB", "#e45756",
               "dash", "bottom");
    }
    if (plan.budget_mb && plan.largest_fitting_peak_mb && plan.margin > 0) {
      vertical(plan.largest_fitting_peak_mb, "fits below " +
               Math.round(plan.largest_fitting_peak_mb) + " MB (" +
               Math.round(plan.margin * 100) + "% margin)", "#b85c00", "dot", "top");
    }
    const chart = document.getElementById(id);
    Plotly.newPlot(chart, b.traces, {
      margin: {t: 30, r: 20}, hovermode: "closest", shapes, annotations,
      xaxis: Object.assign({title: {text: "predicted peak memory, anonymous + shared (MB)"},
                            type: "log"}, logAxis(peaks, (v) => v.toLocaleString("en-US"))),
      yaxis: Object.assign({title: {text: b.onDevice ? "seconds per step on " +
                                    plan.device.name + " (estimated)" :
                                    "seconds per step (this host)"}, type: "log"},
                           logAxis(times, (v) => String(Number(v.toPrecision(2))), 5)),
      legend: {orientation: "h", y: -0.2},
    }, {displaylogo: false, responsive: true});
    chart.on("plotly_click", (event) => {
      const config = b.byId[event.points[0].customdata];
      if (!config) return;
      const params = new URLSearchParams({
        model: form.model, method: config.method, device: plan.device ? plan.device.id : "",
        budget_mb: plan.budget_mb || "",
        seq_len: plan.workload.seq_len, compute_dtype: plan.workload.compute_dtype,
        configuration: config.id,
        config: JSON.stringify(config.knobs),
      });
      window.location.href = "/jobs/new?" + params.toString();
    });
  }
})();
