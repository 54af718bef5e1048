// kernalin-ci dashboard: draws the history embedded in the page (#kernalin-data) with Chart.js.
// Per kernel: an overview row, a chart per shape (head time per commit, the HDI band of the run's
// posterior, failing runs in red, change points as triangles), the change ranges and the timeline.
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("kernalin-data").textContent);
  const app = document.getElementById("app");
  const short = (sha) => (sha || "").slice(0, 7);
  const pct = (r) => (r == null ? "" : ((r - 1) * 100).toFixed(2) + "%");

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v != null) e.setAttribute(k, v);
    }
    for (const c of children) e.append(c == null ? "" : c);
    return e;
  }

  function link(text, href) {
    return href ? el("a", { href: href }, text) : text;
  }

  function failed(p) {
    return p.conclusion === "failure" || (p.failed_by && p.failed_by.length > 0);
  }

  function overview(kernels) {
    const body = el("tbody");
    for (const k of kernels) {
      for (const s of k.series) {
        const last = s.points[s.points.length - 1];
        const lastChange = s.changes[s.changes.length - 1];
        body.append(el("tr", { "data-kernel": k.name, "data-shape": s.shape, class: failed(last) ? "failure" : null },
          el("td", {}, el("a", { href: "#k-" + k.name }, k.name)), el("td", {}, s.shape || "—"),
          el("td", {}, last.head_ms == null ? "—" : last.head_ms.toPrecision(4) + " ms"),
          el("td", {}, last.verdict || "—"), el("td", {}, last.verification || "—"),
          el("td", {}, String(s.changes.length)),
          el("td", {}, lastChange ? short(lastChange.last_good) + ".." + short(lastChange.first_commit) + " (" +
            pct(lastChange.ratio) + ")" : (s.analysed || "none"))));
      }
    }
    return el("table", { class: "overview" },
      el("thead", {}, el("tr", {}, ...["kernel", "shape", "latest time", "latest verdict", "verification",
        "change points", "last change"].map((h) => el("th", {}, h)))), body);
  }

  function chart(k, s) {
    const canvas = el("canvas", { "data-kernel": k.name, "data-shape": s.shape, role: "img",
      "aria-label": "time per launch of " + k.name + " " + s.shape + " per commit" });
    const box = el("div", { class: "chart" }, el("h3", {}, s.shape || "(all shapes)"), canvas);
    const labels = s.points.map((p) => short(p.commit));
    const changeAt = new Set(s.changes.map((c) => c.index));
    const colors = s.points.map((p) => (failed(p) ? "#d1242f" : "#0969da"));
    new Chart(canvas, {
      type: "line",
      data: {
        labels: labels,
        datasets: [
          { label: "HDI low", data: s.points.map((p) => (p.band ? p.band[0] : null)), pointRadius: 0,
            borderWidth: 0, fill: false },
          { label: "HDI band (base time x HDI of head/base)", data: s.points.map((p) => (p.band ? p.band[1] : null)),
            pointRadius: 0, borderWidth: 0, fill: "-1", backgroundColor: "rgba(9,105,218,0.15)" },
          { label: "head time (ms)", data: s.points.map((p) => p.head_ms), borderColor: "#0969da",
            pointBackgroundColor: colors, pointBorderColor: colors, pointRadius: 4, spanGaps: true },
          { label: "change point", data: s.points.map((p, i) => (changeAt.has(i) ? p.head_ms : null)),
            showLine: false, pointStyle: "triangle", pointRadius: 9, backgroundColor: "#bf8700",
            borderColor: "#bf8700" },
        ],
      },
      options: {
        animation: false, responsive: true, maintainAspectRatio: false,
        plugins: { legend: { labels: { filter: (item) => item.text !== "HDI low" } },
          tooltip: { callbacks: { afterLabel: (ctx) => {
            const p = s.points[ctx.dataIndex];
            return (p.pr ? "PR #" + p.pr + ", " : "") + (p.verdict || "") + " " + pct(p.ratio);
          } } } },
        scales: { x: { title: { display: true, text: "commit" } },
          y: { title: { display: true, text: "ms per launch" } } },
      },
    });
    return box;
  }

  function changes(s) {
    if (!s.changes.length) {
      return el("p", { class: "nochange" }, (s.shape ? s.shape + ": " : "") + (s.analysed || "no change point"));
    }
    return el("ul", { class: "changes" }, ...s.changes.map((c) => el("li", { "data-first": c.first_commit },
      (s.shape ? s.shape + ": " : "") + "change point after " + short(c.last_good) + ", at " +
      short(c.first_commit) + " (commits " + short(c.last_good) + ".." + short(c.first_commit) + "): " +
      c.before_ms.toPrecision(4) + " → " + c.after_ms.toPrecision(4) + " ms (" + pct(c.ratio) + ")")));
  }

  // what the verdict was measured against: the run's base, and whether that is the series' previous commit
  function against(p) {
    if (!p.base) return "—";
    if (p.base === p.previous) return short(p.base) + " (previous)";
    return short(p.base) + (p.previous ? " (previous: " + short(p.previous) + ")" : "");
  }

  function timeline(k) {
    const rows = [];
    for (const s of k.series) {
      for (const p of s.points) rows.push([s.shape, p]);
    }
    // newest first, in the page's one commit order (the commit graph's when known), across every series
    rows.sort((a, b) => b[1].order - a[1].order);
    const body = el("tbody");
    for (const [shape, p] of rows) {
      const findings = (p.findings || []).map((f) => f.bug_class + ": " + f.message +
        (f.path ? " (" + f.path + ":" + f.line + ")" : "")).join("; ");
      body.append(el("tr", { "data-commit": p.commit, class: failed(p) ? "failure" : null },
        el("td", {}, short(p.commit)), el("td", {}, p.pr ? link("#" + p.pr, p.report_url) : link("report", p.report_url)),
        el("td", {}, new Date(p.recorded_at * 1000).toISOString().slice(0, 16).replace("T", " ")),
        el("td", {}, p.conclusion), el("td", {}, shape || "—"), el("td", {}, p.verification || "—"),
        el("td", { class: "findings" }, findings || "—"), el("td", { class: "against" }, against(p)),
        el("td", {}, p.verdict || "—"),
        el("td", {}, p.ratio == null ? "—" : p.ratio.toFixed(4)),
        el("td", {}, p.hdi ? p.hdi[0].toFixed(4) + " – " + p.hdi[1].toFixed(4) : "—"),
        el("td", {}, p.p_slower == null ? "—" : p.p_slower.toFixed(3))));
    }
    return el("table", { class: "timeline" },
      el("thead", {}, el("tr", {}, ...["commit", "report", "recorded", "gate", "shape", "verification", "findings",
        "against", "verdict", "head/base", "HDI", "P(slower)"].map((h) => el("th", {}, h)))), body);
  }

  function orderNote(o) {
    if (o.by === "git") {
      return el("p", { class: "order", "data-by": "git" }, "Commits in the order of the commit graph of " + o.ref +
        " (" + short(o.head) + "), oldest first.");
    }
    return el("p", { class: "order", "data-by": "recorded" }, "Commits in the order they were recorded: " + o.note + ".");
  }

  function offBranch(runs) {
    const body = el("tbody");
    for (const r of runs) {
      body.append(el("tr", { "data-commit": r.commit }, el("td", {}, short(r.commit)),
        el("td", {}, r.pr ? link("#" + r.pr, r.report_url) : link("report", r.report_url)),
        el("td", {}, new Date(r.recorded_at * 1000).toISOString().slice(0, 16).replace("T", " ")),
        el("td", {}, r.conclusion)));
    }
    return el("section", { class: "off-branch" }, el("h2", {}, "Recorded, no longer on the branch"),
      el("p", {}, "These commits are not ancestors of " + data.order.ref + " (a force-push rewrote the branch, or " +
        "they were never on it): they are left out of the series and the change points."),
      el("table", { class: "timeline" }, el("thead", {}, el("tr", {}, ...["commit", "report", "recorded", "gate"]
        .map((h) => el("th", {}, h)))), body));
  }

  app.textContent = "";
  if (typeof Chart === "undefined") {  // the server has no Chart.js (docs/history.md): say so, draw nothing
    app.append(el("p", { class: "error" }, "Chart.js did not load: run `kernalin-ci dashboard --fetch-assets` " +
      "where this page is served from. The data is in this page as JSON (#kernalin-data)."));
  } else if (!data.kernels.length) {
    app.append(el("p", {}, "No history recorded yet."));
  } else {
    app.append(el("h2", {}, "Overview"), orderNote(data.order), overview(data.kernels));
    for (const k of data.kernels) {
      const sec = el("section", { class: "kernel", id: "k-" + k.name, "data-kernel": k.name }, el("h2", {}, k.name));
      const charts = el("div", { class: "charts" });
      sec.append(charts);
      const timed = k.series.filter((s) => s.points.some((p) => p.head_ms != null));
      for (const s of k.series) {
        if (timed.includes(s)) charts.append(chart(k, s));
        // commits checked without timing (verification only, identical code) have no series of their own to
        // analyse beside timed ones: the timeline lists them
        if (timed.includes(s) || !timed.length) sec.append(changes(s));
      }
      sec.append(el("h3", {}, "Verdicts and findings"), timeline(k));
      app.append(sec);
    }
    if (data.off_branch.length) app.append(offBranch(data.off_branch));
  }
  document.body.setAttribute("data-rendered", "true");
})();
