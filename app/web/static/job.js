// A job's page, live: loss, memory against the cap and step time, fed by the job's
// Server-Sent Events (the stream replays every step so far, then follows).
(function () {
  const job = JSON.parse(document.getElementById("job-data").textContent);
  const capMb = job.memory_budget_mb;
  const layout = (title, x, y, extra) => Object.assign({
    title: {text: title}, margin: {t: 40, r: 20, b: 50}, legend: {orientation: "h", y: -0.25},
    xaxis: {title: {text: x}}, yaxis: {title: {text: y}},
  }, extra || {});
  const config = {displaylogo: false, responsive: true};
  const line = (name, color, mode) => ({name, x: [], y: [], type: "scatter",
                                       mode: mode || "lines+markers", line: {color}});
  Plotly.newPlot("loss-chart", [line("train loss", "#4c78a8"),
                                line("validation loss", "#f58518", "markers")],
                 layout("Loss", "step", "loss"), config);
  // the loss chart's x axis: the step, or the step's estimated time on the job's device
  const deviceStepS = job.progress.device_step_time_s_estimate;
  const lossSteps = [[], []];  // each trace's steps, whatever the axis shows
  let lossX = "step";
  const lossXOf = (step) => lossX === "device" ? step * deviceStepS : step;
  const lossXTitle = () => lossX === "device" ?
    "estimated seconds on " + job.device + " (step × " + deviceStepS + " s)" : "step";
  const chooser = document.getElementById("loss-x");
  if (chooser) chooser.addEventListener("change", () => {
    lossX = chooser.value;
    Plotly.update("loss-chart", {x: lossSteps.map((steps) => steps.map(lossXOf))},
                  {"xaxis.title.text": lossXTitle()});
  });
  // a horizontal line across the chart, labelled at its left end
  const level = (y, text, color, dash) => y == null ? null : {
    shape: {type: "line", xref: "paper", x0: 0, x1: 1, y0: y, y1: y,
            line: {color, dash, width: 2}},
    annotation: {xref: "paper", x: 0, y, yanchor: "bottom", xanchor: "left",
                 showarrow: false, text, font: {color}},
  };
  const levels = (...items) => {
    const present = items.filter((item) => item);
    return {shapes: present.map((i) => i.shape), annotations: present.map((i) => i.annotation)};
  };
  // the plan's predictions as levels; the worker that runs the job may plan it again on its
  // own host, and its steps then carry the figures it predicted
  const predictedLevels = (peakMb, stepS) => ({
    memory: levels(level(capMb, "cap " + Math.round(capMb) + " MB", "#e45756", "dash"),
                   level(peakMb, "predicted peak " + peakMb + " MB", "#7f7f7f", "dot")),
    time: levels(level(stepS, "predicted " + stepS + " s on this host", "#7f7f7f", "dot")),
  });
  const predicted = {peakMb: job.progress.predicted_peak_mb,
                     stepS: job.progress.predicted_step_time_s};
  const drawn = predictedLevels(predicted.peakMb, predicted.stepS);
  Plotly.newPlot("memory-chart", [line("measured step peak: anonymous + shared memory (what the cgroup charges)", "#54a24b")],
                 layout("Memory", "step", "MB", drawn.memory), config);
  Plotly.newPlot("time-chart", [line("measured step time", "#b279a2")],
                 layout("Step time", "step", "seconds", Object.assign(drawn.time, {
                   yaxis: {title: {text: "seconds"}, rangemode: "tozero"}})), config);
  function showPredicted(peakMb, stepS) {
    if (peakMb == null || stepS == null ||
        (peakMb === predicted.peakMb && stepS === predicted.stepS)) return;
    Object.assign(predicted, {peakMb, stepS});
    const redrawn = predictedLevels(peakMb, stepS);
    Plotly.relayout("memory-chart", redrawn.memory);
    Plotly.relayout("time-chart", redrawn.time);
    document.getElementById("job-predicted-peak").textContent = peakMb + " MB";
    document.getElementById("job-predicted-step-time").textContent =
      Number(stepS.toPrecision(3)) + " s";  // as the page first printed it (%.3g)
  }

  let pending = [], scheduled = false;
  function flush() {
    scheduled = false;
    if (!pending.length) return;
    const rows = pending; pending = [];
    const valRows = rows.filter((m) => m.val_loss != null);
    lossSteps[0].push(...rows.map((m) => m.step));
    lossSteps[1].push(...valRows.map((m) => m.step));
    Plotly.extendTraces("loss-chart", {x: [rows.map((m) => lossXOf(m.step)),
                                           valRows.map((m) => lossXOf(m.step))],
                                       y: [rows.map((m) => m.loss), valRows.map((m) => m.val_loss)]},
                        [0, 1]);
    Plotly.extendTraces("memory-chart", {x: [rows.map((m) => m.step)],
                                         y: [rows.map((m) => m.step_peak_mb ?? m.step_peak_anon_mb)]},
                        [0]);
    Plotly.extendTraces("time-chart", {x: [rows.map((m) => m.step)],
                                       y: [rows.map((m) => m.step_time_s)]}, [0]);
    const last = rows[rows.length - 1];
    document.getElementById("job-step").textContent = last.step;
    showPredicted(last.predicted_peak_mb, last.predicted_step_time_s);
  }
  function addMetric(metric) {
    pending.push(metric);
    if (!scheduled) { scheduled = true; requestAnimationFrame(flush); }
  }
  function addEvent(kind, data) {
    const item = document.createElement("li");
    item.textContent = `${(data.at || "").slice(11, 19)}  ${kind}: ${data.message}`;
    document.getElementById("events").appendChild(item);
    if (data.status) setStatus(data.status);
    const packing = data.packing;  // an event's data arrive flattened into it
    if (packing) {
      const line = document.getElementById("job-packing");
      line.hidden = false;
      line.querySelector("progress").max = packing.tensors_total;
      line.querySelector("progress").value = packing.tensors_done;
      line.querySelector("span").textContent =
        `${packing.tensors_done} of ${packing.tensors_total} tensors`;
    }
  }
  // the checkpoints kept so far, newest first, each with its downloads; listed again from
  // the API as the stream says another was kept
  function showCheckpoints({data: checkpoints, has_more: more}) {
    const body = document.querySelector("#checkpoints tbody");
    body.replaceChildren(...checkpoints.map((checkpoint) => {
      const row = document.createElement("tr");
      row.dataset.checkpoint = checkpoint.id;
      const loss = (value) => value == null ? "–" : Number(value.toPrecision(4)).toString();
      for (const text of [checkpoint.step, loss(checkpoint.train_loss),
                          loss(checkpoint.valid_loss)]) {
        row.appendChild(document.createElement("td")).textContent = text;
      }
      const links = row.appendChild(document.createElement("td"));
      for (const [format, href] of Object.entries(checkpoint.downloads)) {
        const link = links.appendChild(document.createElement("a"));
        Object.assign(link, {href, textContent: format, className: "button"});
        link.setAttribute("download", "");
        links.append(" ");
      }
      return row;
    }));
    document.getElementById("checkpoints").hidden = !checkpoints.length;
    document.getElementById("checkpoints-none").hidden = checkpoints.length > 0;
    document.getElementById("checkpoints-more").hidden = !more;  // beyond one page: said
  }
  let listing = null;  // one listing at a time; a checkpoint kept meanwhile lists again after
  let listAgain = false;
  async function listCheckpoints() {
    if (listing) { listAgain = true; return; }
    listing = fetch(`/v1/jobs/${job.id}/checkpoints?limit=100`, {credentials: "same-origin"});
    try {
      const response = await listing;
      if (response.ok) showCheckpoints(await response.json());
    } finally {
      listing = null;
      if (listAgain) { listAgain = false; listCheckpoints(); }
    }
  }
  showCheckpoints(JSON.parse(document.getElementById("checkpoints-data").textContent));

  function setStatus(status) {
    const badge = document.getElementById("job-status");
    badge.textContent = status;
    badge.className = "badge " + status;
  }
  async function finish() {
    flush();
    const response = await fetch(`/v1/jobs/${job.id}`, {credentials: "same-origin"});
    if (!response.ok) return;
    const done = await response.json();
    setStatus(done.status);
    document.getElementById("job-enforcement").textContent = done.enforcement || "–";
    const peak = done.progress.peak_memory_mb, stepTime = done.progress.step_time_s;
    document.getElementById("job-peak").textContent = peak == null ? "–" : peak + " MB";
    document.getElementById("job-step-time").textContent =
      stepTime == null ? "–" : Number(stepTime.toPrecision(3)) + " s";
    const cancel = document.getElementById("cancel");
    if (cancel) cancel.closest("form").hidden = true;
    if (done.adapter) document.getElementById("downloads").hidden = false;
    listCheckpoints();
    if (done.error) {
      const error = document.getElementById("job-error");
      error.textContent = `${done.error.code}: ${done.error.message}`;
      error.hidden = false;
    }
  }

  const stream = new EventSource(`/v1/jobs/${job.id}/events`);
  stream.addEventListener("metric", (e) => addMetric(JSON.parse(e.data)));
  for (const kind of ["status", "log", "cancel", "checkpoint"]) {
    stream.addEventListener(kind, (e) => addEvent(kind, JSON.parse(e.data)));
  }
  stream.addEventListener("checkpoint", () => listCheckpoints());
  stream.addEventListener("end", () => { stream.close(); finish(); });
})();
