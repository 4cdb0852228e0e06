// The GPU heatmap: one column per host (grouped by leaf, a line between leaves), one row
// per GPU index, the metric the server embedded (#heatmap-data, core/topology.py). A click
// on a cell opens the host. Names go through esc(): plotly reads text as markup.
// Live: the pool view (/ws/live/pool/, core/live_snapshots.pool) keeps the cells and the
// allocated markers current with Plotly.restyle; without websockets the server's data stays.
(function () {
  "use strict";
  var source = document.getElementById("heatmap-data");
  var graph = document.getElementById("heatmap-graph");
  if (!source || !graph) return;

  var esc = window.FabricPoolCharts.esc;
  function note(text) { window.FabricPoolCharts.note(graph, text); }
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
  // GPUs held by an active placement: an open square over the cell (trace 1), kept live.
  var held = { type: "scatter", mode: "markers", x: [], y: [], name: "allocated", hoverinfo: "skip", showlegend: false,
               marker: { symbol: "square-open", size: data.hosts.length > 128 ? 4 : 10, color: "#e4572e", line: { width: 2 } } };
  Plotly.newPlot(graph, [trace, held], layout, { responsive: true, displaylogo: false }).then(function () {
    live();
    // Time since navigation when the drawing answers clicks (read by the browser test).
    graph.dataset.readyMs = String(Math.round(performance.now()));
    graph.on("plotly_click", function (event) {
      var point = event.points && event.points[0];
      if (point && data.urls[point.x] != null) window.location.href = data.urls[point.x];
    });
  });

  // Map the pool view's GPUs onto cells: host name -> column, GPU index -> row.
  function live() {
    if (!window.FabricPoolLive) return;
    var column = {};
    data.hosts.forEach(function (name, i) { column[name] = i; });
    var cells = {};   // gpu id -> {col, row, total}
    var values = {};  // gpu id -> [utilization, memory used MiB, temperature]
    var jobs = {};    // gpu id -> job id holding it (0: free)

    function metric(v, total) {
      if (!v) return null;
      if (data.metric === "utilization") return v[0];
      if (data.metric === "temperature") return v[2];
      return v[1] != null && total ? Math.round(v[1] * 1000 / total) / 10 : null;
    }

    function draw() {
      var z = data.gpus.map(function () { return data.hosts.map(function () { return null; }); });
      var hx = [], hy = [];
      Object.keys(cells).forEach(function (id) {
        var c = cells[id];
        if (c.row >= z.length) return;  // a GPU index the page has no row for: shown after a reload
        z[c.row][c.col] = metric(values[id], c.total);
        if (jobs[id]) { hx.push(c.col); hy.push(c.row); }
      });
      Plotly.restyle(graph, { z: [z] }, [0]);
      Plotly.restyle(graph, { x: [hx], y: [hy] }, [1]);
      graph.dataset.allocated = String(hx.length);
      graph.dataset.liveAt = String(Math.round(performance.now()));
    }

    window.FabricPoolLive.subscribe("/ws/live/pool/", {
      onSnapshot: function (pool) {
        cells = {}; values = {}; jobs = {};
        var g = pool.gpus;
        for (var i = 0; i < g.id.length; i++) {
          var col = column[pool.hosts.name[g.host[i]]];
          if (col === undefined) continue;  // a host of another fabric
          cells[g.id[i]] = { col: col, row: g.index[i], total: g.memory_mib[i] };
          values[g.id[i]] = [g.util[i], g.mem[i], g.temp[i]];
          jobs[g.id[i]] = g.job[i];
        }
        draw();
      },
      onDelta: function (changes) {
        var touched = false;
        Object.keys(changes.gpus || {}).forEach(function (id) {
          if (!(id in cells)) return;
          values[id] = changes.gpus[id];
          touched = true;
        });
        Object.keys(changes.alloc || {}).forEach(function (id) {
          if (!(id in cells)) return;
          jobs[id] = changes.alloc[id] || 0;
          touched = true;
        });
        if (touched) draw();
      },
    });
  }
})();
