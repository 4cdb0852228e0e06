// Charts of the host page. The server embeds the series with json_script
// (#pool-chart-data: times in epoch milliseconds, one entry per GPU) and this draws them
// with plotly.js, which the page loads from the project's own static files.
// Plotly renders trace names and hover text as HTML-like markup: every text that comes
// from the database (host names, GPU models) goes through esc() first, so a name with "<"
// in it shows as typed and is never read as markup.
//
// Live: the page subscribes to /ws/live/host/<name>/ (core/live_consumers.HostConsumer). A
// GPU whose readings moved (core.live_receivers: at least the thresholds) gets a point at the
// time the delta arrived in the three GPU charts (Plotly.extendTraces), and the host's state,
// the GPU table and the busy count change in place. #chart-tables has the charts as tables.
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

  function draw(el) {
    var chart = charts[el.dataset.chart];
    if (!chart) return;
    var traces = chart.traces();
    var points = traces.reduce(function (n, t) { return n + t.x.length; }, 0);
    if (!points) {
      note(el, "No samples in this range yet.");
      return;
    }
    el.dataset.drawn = "1";
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
  }
  document.querySelectorAll(".chart[data-chart]").forEach(draw);

  // --- the charts as tables ----------------------------------------------------------------
  var tables = document.getElementById("chart-tables");
  var clock = new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false });
  var SERIES = [["GPU utilization (%)", "utilization", 1], ["GPU memory used (GiB)", "memory_used_mib", GIB],
                ["GPU temperature (°C)", "temperature_c", 1], ["GPU power (W)", "power_w", 1]];
  function buildTables() {
    if (!tables || !tables.open) return;
    var body = document.getElementById("chart-tables-body");
    body.textContent = "";
    SERIES.forEach(function (s) {
      var table = document.createElement("table"), caption = table.createCaption(), head = table.createTHead().insertRow();
      caption.textContent = s[0];
      ["time"].concat(data.gpus.map(function (g) { return g.label; })).forEach(function (name) {
        var th = document.createElement("th"); th.scope = "col"; th.textContent = name; head.appendChild(th);
      });
      var times = {};
      data.gpus.forEach(function (g) { g.t.slice(-20).forEach(function (t) { times[t] = true; }); });
      var tbody = table.createTBody();
      Object.keys(times).map(Number).sort(function (a, b) { return a - b; }).slice(-20).forEach(function (t) {
        var row = tbody.insertRow();
        row.insertCell().textContent = clock.format(new Date(t));
        data.gpus.forEach(function (g) {
          var k = g.t.lastIndexOf(t), v = k >= 0 ? g[s[1]][k] : null;
          var cell = row.insertCell();
          cell.className = "num";
          cell.textContent = v == null ? "—" : String(Math.round(v * s[2] * 10) / 10);
        });
      });
      var wrap = document.createElement("div");
      wrap.className = "table-wrap";
      wrap.appendChild(table);
      body.appendChild(wrap);
    });
  }
  if (tables) tables.addEventListener("toggle", buildTables);

  // --- live ------------------------------------------------------------------------------
  var stateBox = document.getElementById("host-state"), stateEl = stateBox && stateBox.querySelector(".state");
  if (!window.FabricPoolLive || !stateEl) return;
  var byId = {};
  data.gpus.forEach(function (g, i) { byId[g.id] = i; });
  var GPU_CHARTS = [["gpu-utilization", "utilization", 1, 0], ["gpu-memory", "memory_used_mib", GIB, 1],
                    ["gpu-temperature", "temperature_c", 1, 2]];

  // A stat tile's number by the start of its label ("GPUs busy / present", "CPU (64 cores)").
  function stat(label) {
    var dt = Array.prototype.find.call(document.querySelectorAll(".stat dt"), function (d) { return d.textContent.indexOf(label) === 0; });
    return dt ? dt.nextElementSibling : null;
  }
  function setText(el, value) { if (el && el.textContent !== value) el.textContent = value; }
  function setState(state) {
    setText(stateEl, state);
    stateEl.className = "state " + ((data.state_classes || {})[state] || "state-unknown");
  }
  function setRow(id, v) {
    var first = document.querySelector('td[data-gpu-id="' + id + '"]'), row = first && first.parentNode;
    if (!row) return;
    setText(row.querySelector(".gpu-util"), v[0] == null ? "—" : Math.round(v[0]) + " %");
    setText(row.querySelector(".gpu-mem"), v[1] == null ? "—" : Number(v[1]).toLocaleString("en-US"));
    setText(row.querySelector(".gpu-temp"), v[2] == null ? "—" : Math.round(v[2]) + " °C");
    var badge = first.querySelector(".gpu-busy"), busy = v[0] != null && v[0] >= data.busy_threshold;
    if (busy && !badge) {
      badge = document.createElement("span");
      badge.className = "state state-active gpu-busy";
      badge.setAttribute("aria-describedby", "busy-legend");
      badge.textContent = "busy";
      first.appendChild(document.createTextNode(" "));
      first.appendChild(badge);
    } else if (!busy && badge) {
      first.removeChild(badge);
    }
    var tile = stat("GPUs busy");
    if (tile) setText(tile, document.querySelectorAll("td[data-gpu-id] .gpu-busy").length + " / " + tile.textContent.split(" / ")[1]);
  }
  // A point per changed GPU at `t` in the GPU charts; the x range slides to keep its span.
  function extend(values, t) {
    var ids = Object.keys(values).filter(function (id) { return id in byId; });
    if (!ids.length) return;
    ids.forEach(function (id) {
      var g = data.gpus[byId[id]], v = values[id];
      g.t.push(t); g.utilization.push(v[0]); g.memory_used_mib.push(v[1]); g.temperature_c.push(v[2]);
      if (g.power_w) g.power_w.push(null);
    });
    var span = data.end - data.start;
    data.end = Math.max(data.end, t); data.start = data.end - span;
    GPU_CHARTS.forEach(function (c) {
      var el = document.getElementById("chart-" + c[0]);
      if (!el) return;
      if (!el.dataset.drawn) { draw(el); return; }
      var idx = ids.map(function (id) { return byId[id]; });
      window.Plotly.extendTraces(el, {
        x: idx.map(function () { return [local(t)]; }),
        y: ids.map(function (id) { var v = values[id][c[3]]; return [v == null ? null : v * c[2]]; }),
      }, idx);
      window.Plotly.relayout(el, { "xaxis.range": [local(data.start), local(data.end)] });
      el.dataset.points = String(Number(el.dataset.points || 0) + ids.length);
    });
    if (tables && tables.open) buildTables();
  }

  window.FabricPoolLive.subscribe("/ws/live/host/" + encodeURIComponent(stateBox.dataset.name) + "/", {
    onSnapshot: function (snap) {
      setState(snap.host.state);
      var cpu = stat("CPU");
      setText(cpu, snap.host.cpu_percent == null ? "—" : Math.round(snap.host.cpu_percent) + " %");
      snap.gpus.forEach(function (g) { setRow(g.id, [g.util, g.mem, g.temp]); });
    },
    onDelta: function (changes) {
      if (changes.host && changes.host.state) setState(changes.host.state);
      if (changes.gpus) {
        Object.keys(changes.gpus).forEach(function (id) { if (changes.gpus[id]) setRow(id, changes.gpus[id]); });
        extend(changes.gpus, Date.now());
      }
    },
  });
})();
