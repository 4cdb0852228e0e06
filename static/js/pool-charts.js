// Charts of the host page. The server embeds the series with json_script
// (#pool-chart-data: times in epoch milliseconds, one entry per GPU) and this draws them
// with plotly.js, which the page loads from the project's own static files.
// Plotly renders trace names and hover text as HTML-like markup: every text that comes
// from the database (host names, GPU models) goes through esc() first, so a name with "<"
// in it shows as typed and is never read as markup.
(function () {
  "use strict";
  var source = document.getElementById("pool-chart-data");
  if (!source) return;

  var esc = window.FabricPoolCharts.esc;
  var note = window.FabricPoolCharts.note;

  var data;
  try {
    data = JSON.parse(source.textContent);
  } catch (e) {
    document.querySelectorAll(".chart[data-chart]").forEach(function (el) { note(el, "The chart data could not be read."); });
    return;
  }
  if (typeof window.Plotly === "undefined") {
    document.querySelectorAll(".chart[data-chart]").forEach(function (el) { note(el, "plotly.js did not load: no charts."); });
    return;
  }

  // Plotly shows epoch times as UTC; shift them so the axis reads the browser's wall clock,
  // like the <time> elements of the page (static/js/time.js).
  function local(ms) { return ms - new Date(ms).getTimezoneOffset() * 60000; }
  function times(list) { return list.map(local); }
  function scaled(list, factor) { return list.map(function (v) { return v == null ? null : v * factor; }); }
  var zone = (Intl.DateTimeFormat().resolvedOptions().timeZone) || "local time";
  var hostText = esc(data.host.name);

  function gpuTraces(metric, factor) {
    return data.gpus.map(function (g) {
      return {
        type: "scatter", mode: "lines", x: times(g.t), y: scaled(g[metric], factor),
        name: esc(g.label), text: esc(data.host.name + " · " + g.model), hoverinfo: "x+y+name+text",
        line: { width: 1.5 },
      };
    });
  }

  function hostTrace(metric, factor, name) {
    var h = data.host;
    return { type: "scatter", mode: "lines", x: times(h.t), y: scaled(h[metric], factor), name: name, text: hostText,
             hoverinfo: "x+y+name+text", line: { width: 1.5 } };
  }

  var GIB = 1 / 1024, GBIT = 8 / 1e9;
  var charts = {
    "gpu-utilization": { traces: function () { return gpuTraces("utilization", 1); }, unit: "%", range: [0, 105] },
    "gpu-memory": { traces: function () { return gpuTraces("memory_used_mib", GIB); }, unit: "GiB" },
    "gpu-temperature": { traces: function () { return gpuTraces("temperature_c", 1); }, unit: "°C" },
    "gpu-power": { traces: function () { return gpuTraces("power_w", 1); }, unit: "W" },
    "host-cpu": { traces: function () { return [hostTrace("cpu_percent", 1, "CPU")]; }, unit: "%", range: [0, 105] },
    "host-ib": {
      traces: function () { return [hostTrace("ib_tx_bytes_per_s", GBIT, "tx"), hostTrace("ib_rx_bytes_per_s", GBIT, "rx")]; },
      unit: "Gb/s",
    },
  };

  var style = getComputedStyle(document.documentElement);
  var text = style.getPropertyValue("--text").trim() || "#1b1f24";
  var grid = style.getPropertyValue("--border").trim() || "#d0d7de";

  document.querySelectorAll(".chart[data-chart]").forEach(function (el) {
    var chart = charts[el.dataset.chart];
    if (!chart) return;
    var traces = chart.traces();
    var points = traces.reduce(function (n, t) { return n + t.x.length; }, 0);
    if (!points) {
      note(el, "No samples in this range yet.");
      return;
    }
    el.textContent = "";
    var layout = {
      height: el.clientHeight || 300,
      margin: { l: 48, r: 12, t: 8, b: 36 },
      paper_bgcolor: "rgba(0,0,0,0)",
      plot_bgcolor: "rgba(0,0,0,0)",
      font: { color: text, size: 12 },
      hoverlabel: { namelength: -1 },
      showlegend: traces.length > 1,
      legend: { orientation: "h", y: -0.18 },
      xaxis: { type: "date", range: [local(data.start), local(data.end)], gridcolor: grid, title: { text: "" },
               hoverformat: "%Y-%m-%d %H:%M:%S" },
      yaxis: { title: { text: chart.unit }, gridcolor: grid, rangemode: "tozero", zeroline: false },
    };
    if (chart.range) layout.yaxis.range = chart.range;
    el.setAttribute("title", "times in " + zone);
    window.Plotly.newPlot(el, traces, layout, { displaylogo: false, responsive: true,
                                                modeBarButtonsToRemove: ["select2d", "lasso2d", "toImage"] });
  });
})();
