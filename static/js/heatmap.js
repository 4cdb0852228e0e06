// The GPU heatmap: one column per host (grouped by leaf, a line between leaves), one row
// per GPU index, the metric the server embedded (#heatmap-data, core/topology.py). A click
// on a cell opens the host. Names go through esc(): plotly reads text as markup.
(function () {
  "use strict";
  var source = document.getElementById("heatmap-data");
  var graph = document.getElementById("heatmap-graph");
  if (!source || !graph) return;

  function esc(text) {
    return String(text == null ? "" : text)
      .replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
      .replace(/"/g, "&#34;").replace(/'/g, "&#39;");
  }
  function note(text) {
    graph.textContent = "";
    var p = document.createElement("p");
    p.className = "muted chart-note";
    p.textContent = text;
    graph.appendChild(p);
  }
  var data;
  try { data = JSON.parse(source.textContent); } catch (e) { note("The heatmap data could not be read."); return; }
  if (typeof window.Plotly === "undefined") { note("plotly.js did not load: no heatmap."); return; }
  if (!data.hosts.length || !data.gpus.length) { note("No GPU in this fabric yet."); return; }

  var style = getComputedStyle(document.documentElement);
  var textColor = style.getPropertyValue("--text").trim() || "#1b1f24";
  var lineColor = style.getPropertyValue("--text").trim() || "#1b1f24";

  // Hover text per column (host and leaf), shared by every row of that column.
  var leafOf = new Array(data.hosts.length);
  data.leaves.forEach(function (l) { for (var i = l.start; i < l.start + l.count; i++) leafOf[i] = l.name; });
  var columnText = data.hosts.map(function (h, i) { return esc(h) + " · leaf " + esc(leafOf[i]); });
  var text = data.gpus.map(function () { return columnText; });
  var x = data.hosts.map(function (_, i) { return i; });

  var shapes = data.leaves.slice(1).map(function (l) {
    return { type: "line", xref: "x", yref: "paper", x0: l.start - 0.5, x1: l.start - 0.5, y0: 0, y1: 1,
             line: { color: lineColor, width: data.leaves.length > 64 ? 0.5 : 1 } };
  });
  // Leaf names under their columns; with many leaves every k-th, so that they stay legible.
  var step = Math.max(1, Math.ceil(data.leaves.length / 32));
  var ticks = data.leaves.filter(function (_, i) { return i % step === 0; });

  var trace = {
    type: "heatmap", x: x, y: data.gpus, z: data.z, text: text, zmin: data.zmin, zmax: data.zmax, colorscale: "Viridis",
    hoverongaps: false, colorbar: { title: { text: esc(data.unit) } }, xgap: data.hosts.length > 512 ? 0 : 1, ygap: 1,
    hovertemplate: "%{text}<br>GPU %{y}: %{z:.1f} " + esc(data.unit) + "<extra></extra>",
  };
  var layout = {
    margin: { l: 60, r: 10, t: 10, b: 90 }, paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)", font: { color: textColor },
    xaxis: { tickvals: ticks.map(function (l) { return l.start + (l.count - 1) / 2; }), ticktext: ticks.map(function (l) { return esc(l.name); }),
             tickangle: -45, showgrid: false, zeroline: false },
    yaxis: { title: { text: "GPU index" }, dtick: 1, autorange: "reversed", zeroline: false },
    shapes: shapes,
  };
  graph.textContent = "";
  Plotly.newPlot(graph, [trace], layout, { responsive: true, displaylogo: false }).then(function () {
    // Time since navigation when the drawing answers clicks (read by the browser test).
    graph.dataset.readyMs = String(Math.round(performance.now()));
    graph.on("plotly_click", function (event) {
      var point = event.points && event.points[0];
      if (point && data.urls[point.x] != null) window.location.href = data.urls[point.x];
    });
  });
})();
