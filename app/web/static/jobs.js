// Keeps the jobs table live: status, progress, loss and peak every two seconds.
(function () {
  const table = document.querySelector("#jobs-table tbody");
  function cell(row, name) { return row.querySelector("td." + name); }
  async function refresh() {
    const response = await fetch("/v1/jobs?limit=100", {credentials: "same-origin"});
    if (!response.ok) return;
    const jobs = (await response.json()).data;
    const known = new Set([...table.querySelectorAll("tr[data-job]")].map((r) => r.dataset.job));
    if (jobs.some((job) => !known.has(job.id))) { window.location.reload(); return; }
    for (const job of jobs) {
      const row = table.querySelector(`tr[data-job="${job.id}"]`);
      if (!row) continue;
      const code = job.error ? ` <span class="code">${job.error.code}</span>` : "";
      cell(row, "status").innerHTML = `<span class="badge ${job.status}">${job.status}</span>${code}`;
      const p = job.progress;
      cell(row, "progress").innerHTML =
        `<progress max="${p.total_steps}" value="${p.step}"></progress> ${p.step}/${p.total_steps}`;
      cell(row, "loss").textContent = p.loss == null ? "" : p.loss.toFixed(4);
      cell(row, "peak").textContent =
        `${p.peak_memory_mb == null ? "–" : p.peak_memory_mb} / ${Math.round(job.memory_budget_mb)}`;
    }
  }
  setInterval(refresh, 2000);
})();
