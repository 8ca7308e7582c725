// Tables a person can sort (click a column's header; again to reverse) and filter (rows
// holding every word typed, "fits"/"no" matching the fits column too).
(function () {
  const value = (cell) => {
    const text = cell.textContent.trim();
    const number = Number(text.replace(/[^0-9.eE+-]/g, ""));
    return text !== "" && /^[0-9.,\s]+( MB)?$/.test(text) ? number : text.toLowerCase();
  };
  for (const table of document.querySelectorAll("table.sortable")) {
    table.querySelectorAll("thead th").forEach((th, column) => {
      th.style.cursor = "pointer";
      th.addEventListener("click", () => {
        const ascending = th.dataset.sort !== "asc";
        table.querySelectorAll("thead th").forEach((other) => delete other.dataset.sort);
        th.dataset.sort = ascending ? "asc" : "desc";
        const body = table.tBodies[0];
        const rows = Array.from(body.rows);
        rows.sort((a, b) => {
          const x = value(a.cells[column]), y = value(b.cells[column]);
          const order = typeof x === "number" && typeof y === "number" ? x - y
            : String(x).localeCompare(String(y));
          return ascending ? order : -order;
        });
        rows.forEach((row) => body.appendChild(row));
      });
    });
  }
  const filter = document.getElementById("config-filter");
  if (filter) {
    filter.addEventListener("input", () => {
      const words = filter.value.toLowerCase().split(/\s+/).filter(Boolean);
      for (const row of document.querySelectorAll("#all-table tbody tr")) {
        const text = row.textContent.toLowerCase();
        row.hidden = !words.every((w) => text.includes(w));
      }
    });
  }
})();
