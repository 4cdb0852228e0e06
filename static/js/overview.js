// The overview page, live: it subscribes to /ws/live/overview/ (core/live_consumers.py) and
// patches its numbers in place from the snapshot (core/live_snapshots.overview) and the
// deltas that follow (whole keys replaced); the utilization chart gains a point per poll.
// Every number stays a link to the list behind it. Names are set as text, never as markup.
(function () {
  "use strict";
  function json(id) {
    var el = document.getElementById(id);
    try { return el ? JSON.parse(el.textContent) : null; } catch (e) { return null; }
  }
  var state = json("overview-data"), history = json("overview-history"), config = json("overview-config");
  if (!state || !config) return;
  var HOUR = 3600 * 1000;

  function get(path) {
    return path.split(".").reduce(function (v, k) { return v == null ? undefined : v[k]; }, state);
  }
  function sum(obj) { return Object.keys(obj || {}).reduce(function (n, k) { return n + (obj[k] || 0); }, 0); }
  function link(href, text, label) {
    var a = document.createElement("a");
    a.href = href;
    a.textContent = String(text);
    if (label) a.setAttribute("aria-label", label);
    return a;
  }
  function q(params) {
    return "?" + Object.keys(params).map(function (k) { return k + "=" + encodeURIComponent(params[k]); }).join("&");
  }

  function derived() {
    var hostsTotal = sum(state.hosts);
    return {
      hosts_total: hostsTotal,
      hosts_not_up: hostsTotal - ((state.hosts || {}).up || 0),
      gpus_total: (state.gpu_pools || []).reduce(function (n, p) { return n + p.total; }, 0),
    };
  }

  // One table of GPU counts (per pool or per site), rebuilt: rows come and go with pools.
  function gpuTable(key, rows) {
    var table = document.getElementById("gpus-by-" + key);
    if (!table) return;
    var body = document.createElement("tbody");
    rows.forEach(function (r) {
      var tr = document.createElement("tr");
      var hosts = config.pool_url + q({ [key]: r.filter }) + "#hosts";
      var jobs = key === "pool" && r.name ? config.jobs_url + q({ pool: r.name }) : hosts;
      var running = key === "pool" && r.name ? config.jobs_url + q({ pool: r.name, state: "running" }) : hosts;
      var th = document.createElement("th");
      th.scope = "row";
      var name = link(hosts, r.name || "no " + key);
      if (!r.name) name.style.fontStyle = "italic";
      th.appendChild(name);
      tr.appendChild(th);
      [[hosts, r.total, "total"], [jobs, r.allocated, "allocated"], [running, r.idle_allocated, "idle but allocated"],
       [hosts, r.free, "free"]].forEach(function (c) {
        var td = document.createElement("td");
        td.className = "num";
        td.appendChild(link(c[0], c[1], c[1] + " GPUs " + c[2] + " in " + (r.name ? key + " " + r.name : "no " + key)));
        tr.appendChild(td);
      });
      body.appendChild(tr);
    });
    if (!rows.length) {
      var tr = document.createElement("tr"), td = document.createElement("td");
      td.colSpan = 5; td.className = "empty"; td.textContent = "No GPU yet.";
      tr.appendChild(td); body.appendChild(tr);
    }
    table.replaceChild(body, table.tBodies[0]);
  }

  function reasons() {
    var list = document.getElementById("pending-reasons");
    if (!list) return;
    list.textContent = "";
    var items = Object.keys(state.pending_reasons || {}).map(function (k) { return [k, state.pending_reasons[k]]; })
      .sort(function (a, b) { return b[1] - a[1] || (a[0] < b[0] ? -1 : 1); });
    items.forEach(function (item) {
      var li = document.createElement("li");
      var label = config.reasons[item[0]] || item[0];
      li.appendChild(link(config.jobs_url + "?state=pending&reason=" + encodeURIComponent(item[0]), item[1], item[1] + " jobs waiting: " + label));
      li.appendChild(document.createTextNode(" " + label));
      list.appendChild(li);
    });
    if (!items.length) {
      var li = document.createElement("li");
      li.className = "muted"; li.textContent = "No job waiting.";
      list.appendChild(li);
    }
  }

  function lastCycle() {
    var el = document.getElementById("last-cycle"), c = state.last_cycle;
    if (!el) return;
    el.textContent = "";
    if (!c) { var s = document.createElement("span"); s.className = "muted"; s.textContent = "none yet"; el.appendChild(s); return; }
    var text = (c.duration_s == null ? "—" : c.duration_s) + " s";
    el.appendChild(link(config.cycle_url + c.id + "/", text, "last cycle took " + text));
  }

  function fabricLinks() {
    var table = document.getElementById("fabric-table");
    if (!table) return;
    Object.keys(state.fabric_links || {}).forEach(function (name) {
      var row = Array.prototype.find.call(table.tBodies[0].rows, function (r) { return r.dataset.fabric === name; });
      if (!row) return;
      var counts = state.fabric_links[name];
      Object.keys(counts).forEach(function (s) {
        var a = row.querySelector('a[href$="?state=' + s + '"]');
        if (!a) return;
        var n = counts[s];
        a.textContent = String(n);
        a.setAttribute("aria-label", n + " links " + s + " in " + name);
        a.className = n ? "state state-" + s : "count-zero";
      });
    });
  }

  function render() {
    var extra = derived();
    document.querySelectorAll("[data-live]").forEach(function (el) {
      var key = el.dataset.live;
      var value = key in extra ? extra[key] : get(key);
      if (value === undefined) value = 0;
      if (el.textContent === String(value)) return;
      el.textContent = String(value);
      var label = el.getAttribute("aria-label");
      if (label) el.setAttribute("aria-label", label.replace(/^\d+/, String(value)));
      if (el.classList.contains("count-zero") || key.indexOf("hosts.") === 0) el.classList.toggle("count-zero", !value);
    });
    gpuTable("pool", state.gpu_pools || []);
    gpuTable("site", state.gpu_sites || []);
    reasons();
    lastCycle();
    fabricLinks();
    var now = document.getElementById("utilization-now"), u = state.utilization || {};
    if (now) now.textContent = u.mean == null ? "—" : u.mean + " %";
  }

  // --- utilization chart: the last hour, extended by each poll's mean ---------------------
  var graph = document.getElementById("utilization-chart");
  var points = { t: (history && history.t) || [], mean: (history && history.mean) || [] };
  var drawn = false;
  function local(ms) { return ms - new Date(ms).getTimezoneOffset() * 60000; }

  function addRow(t, mean) {
    var body = document.querySelector("#utilization-table tbody");
    if (!body) return;
    var empty = body.querySelector("td.empty");
    if (empty) body.removeChild(empty.parentNode);
    var tr = document.createElement("tr"), td = document.createElement("td"), time = document.createElement("time");
    time.setAttribute("datetime", new Date(t).toISOString());
    time.textContent = new Date(t).toISOString();
    td.appendChild(time); tr.appendChild(td);
    var v = document.createElement("td"); v.className = "num"; v.textContent = String(mean); tr.appendChild(v);
    body.appendChild(tr);
    if (window.FabricPool && window.FabricPool.localizeTimes) window.FabricPool.localizeTimes(tr);
  }

  function addPoint(u) {
    if (!u || u.t == null || u.mean == null) return;
    var last = points.t.length ? points.t[points.t.length - 1] : null;
    if (last !== null && u.t <= last) return;  // a snapshot after a reconnect repeats the latest
    points.t.push(u.t); points.mean.push(u.mean);
    addRow(u.t, u.mean);
    if (!drawn) { draw(); return; }
    window.Plotly.extendTraces(graph, { x: [[local(u.t)]], y: [[u.mean]] }, [0]);
    window.Plotly.relayout(graph, { "xaxis.range": [local(u.t - HOUR), local(Math.max(u.t, Date.now()))] });
    graph.dataset.points = String(points.t.length);
  }

  function draw() {
    if (!graph || typeof window.Plotly === "undefined") return;
    if (!points.t.length) {
      window.FabricPoolCharts.note(graph, "No utilization sample in the last hour yet: the chart starts with the next poll.");
      graph.dataset.points = "0";
      return;
    }
    var style = getComputedStyle(document.documentElement);
    var text = style.getPropertyValue("--text").trim() || "#1b1f24", grid = style.getPropertyValue("--border").trim() || "#d0d7de";
    var end = Math.max(points.t[points.t.length - 1], Date.now());
    graph.textContent = "";
    window.Plotly.newPlot(graph, [{ type: "scatter", mode: "lines+markers", x: points.t.map(local), y: points.mean.slice(),
                                    name: "mean GPU utilization", line: { width: 2 }, marker: { size: 4 },
                                    hovertemplate: "%{x|%H:%M:%S}: %{y} %<extra></extra>" }],
      { height: 260, margin: { l: 48, r: 12, t: 8, b: 36 }, paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
        font: { color: text, size: 12 }, showlegend: false,
        xaxis: { type: "date", range: [local(end - HOUR), local(end)], gridcolor: grid },
        yaxis: { title: { text: "%" }, range: [0, 105], gridcolor: grid, zeroline: false } },
      { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["select2d", "lasso2d", "toImage"] });
    drawn = true;
    graph.dataset.points = String(points.t.length);
  }

  draw();
  if (!window.FabricPoolLive) return;
  window.FabricPoolLive.subscribe("/ws/live/overview/", {
    onSnapshot: function (data) {
      state = data;
      render();
      addPoint(state.utilization);
    },
    onDelta: function (changes) {
      if (!changes.overview) return;
      window.FabricPoolLive.applyKeyed(state, changes.overview);
      render();
      if (changes.overview.utilization) addPoint(changes.overview.utilization);
    },
  });
})();
