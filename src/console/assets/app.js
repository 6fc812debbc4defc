// The console's own script: the plots (uPlot, fed by
// /queues/NAME/history.json and redrawn every few seconds), the
// "select the page" box of the dead-letter table, and the file picker of
// the definitions import. No inline script anywhere: the pages are served
// with a Content-Security-Policy that forbids it.
"use strict";

(function () {
  const SERIES = {
    depth: [
      ["ready", "ready", "#2f6fb0"],
      ["in_flight", "in flight", "#d08a1e"],
      ["delayed", "delayed", "#7a56b8"],
    ],
    rates: [
      ["published", "published/s", "#2f8f4e"],
      ["acked", "acked/s", "#2f6fb0"],
      ["nacked", "nacked/s", "#d08a1e"],
      ["dead_lettered", "dead-lettered/s", "#c0392b"],
    ],
  };

  function plotData(kind, json) {
    return [json.t].concat(SERIES[kind].map((s) => json[s[0]]));
  }

  // One plot per element; the plots of one source share its fetches.
  function makePlot(el) {
    const kind = el.dataset.plot;
    let plot = null;
    return function draw(json) {
      const data = plotData(kind, json);
      if (plot) {
        plot.setData(data);
        return;
      }
      const width = Math.max(320, el.clientWidth || 600);
      plot = new uPlot(
        {
          width: width,
          height: 220,
          series: [{}].concat(
            SERIES[kind].map((s) => ({ label: s[1], stroke: s[2], width: 2 }))
          ),
          axes: [{}, { size: 60 }],
          scales: {
            // One point (a server just started): a minute before it.
            x: { time: true, range: (u, min, max) => (min === max ? [min - 60, max] : [min, max]) },
            y: { range: (u, min, max) => [0, Math.max(1, max)] },
          },
        },
        data,
        el
      );
      el.dataset.drawn = "true";
    };
  }

  function feed(src, els) {
    const draws = els.map(makePlot);
    function refresh() {
      fetch(src, { credentials: "same-origin" })
        .then((r) => (r.ok ? r.json() : Promise.reject(r.status)))
        .then((json) => draws.forEach((d) => d(json)))
        .catch((e) => els.forEach((el) => (el.dataset.error = String(e))));
    }
    refresh();
    setInterval(refresh, Number(els[0].dataset.every || 5000));
  }

  function selectPage(box) {
    box.addEventListener("change", () => {
      document
        .querySelectorAll("input[type=checkbox][name=id]")
        .forEach((c) => (c.checked = box.checked));
    });
  }

  function filePicker(input) {
    const target = document.getElementById(input.dataset.into);
    input.addEventListener("change", () => {
      const f = input.files && input.files[0];
      if (!f || !target) return;
      f.text().then((t) => (target.value = t));
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    const bySrc = new Map();
    document.querySelectorAll("[data-plot]").forEach((el) => {
      const list = bySrc.get(el.dataset.src) || [];
      list.push(el);
      bySrc.set(el.dataset.src, list);
    });
    bySrc.forEach((els, src) => feed(src, els));
    document.querySelectorAll("#select-page").forEach(selectPage);
    document.querySelectorAll("input[type=file][data-into]").forEach(filePicker);
  });
})();
