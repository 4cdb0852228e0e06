// The GPU heatmap: one column per host (grouped by leaf, a line between leaves), one row
// per GPU index, the metric the server embedded (#heatmap-data, core/topology.py). A click
// on a cell opens the host. Names go through esc(): plotly reads text as markup.
// Live: the pool view (/ws/live/pool/, core/live_snapshots.pool) keeps the cells and the
// allocated markers current with Plotly.restyle; without websockets the server's data stays.
//
// Pick mode (?pick=<placement>, #pick-data and #pick-panel): the proposal's GPUs are outlined
// (trace 2), the operator's pick is a dot (trace 3); a click on a cell or a checkbox of the
// GPU list toggles a GPU, every change asks the dry-run endpoint for the pick's cost or the
// rules it breaks (Confirm only when it breaks none), Confirm posts the override with the
// version the page was rendered with.
(function () {
  "use strict";
  liveBanner();
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

  var pick = readPick();
  var trace = {
    type: "heatmap", x: x, y: data.gpus, z: data.z, text: text, zmin: data.zmin, zmax: data.zmax, colorscale: "Viridis",
    // Picking needs every cell clickable, also a GPU with no reading yet.
    hoverongaps: !!(pick && pick.can_pick), colorbar: { title: { text: esc(data.unit) } }, xgap: data.hosts.length > 512 ? 0 : 1, ygap: 1,
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
  var traces = [trace, held];
  if (pick) {
    var big = data.hosts.length > 128;
    traces.push({ type: "scatter", mode: "markers", x: [], y: [], name: "proposal", hoverinfo: "skip", showlegend: false,
                  marker: { symbol: "square-open", size: big ? 7 : 18, color: "#1f6feb", line: { width: 3 } } });
    traces.push({ type: "scatter", mode: "markers", x: [], y: [], name: "your pick", hoverinfo: "skip", showlegend: false,
                  marker: { symbol: "circle", size: big ? 4 : 9, color: "#ffffff", line: { width: 2, color: "#111111" } } });
  }
  Plotly.newPlot(graph, traces, layout, { responsive: true, displaylogo: false }).then(function () {
    live();
    var picker = pick ? pickMode(pick) : null;
    // Time since navigation when the drawing answers clicks (read by the browser test).
    graph.dataset.readyMs = String(Math.round(performance.now()));
    graph.on("plotly_click", function (event) {
      var point = event.points && event.points[0];
      if (!point || point.curveNumber !== 0) return;
      if (picker) picker.click(point.x, point.y);
      else if (data.urls[point.x] != null) window.location.href = data.urls[point.x];
    });
  });

  function readPick() {
    var el = document.getElementById("pick-data");
    if (!el) return null;
    try { return JSON.parse(el.textContent); } catch (e) { return null; }
  }

  function pickMode(pick) {
    var panel = document.getElementById("pick-panel");
    var cellOf = {};  // gpu id -> [column, row] on this heatmap
    (pick.cells || []).forEach(function (row, r) {
      row.forEach(function (id, c) { if (id !== null) cellOf[id] = [c, r]; });
    });
    function xy(ids) {
      var xs = [], ys = [];
      ids.forEach(function (id) { var c = cellOf[id]; if (c) { xs.push(c[0]); ys.push(c[1]); } });
      return { x: [xs], y: [ys] };
    }
    Plotly.restyle(graph, xy(pick.proposal), [2]);
    graph.dataset.proposal = pick.proposal.join(",");
    if (!pick.can_pick) return null;  // viewers and decided placements: outlined, nothing to pick

    var chosen = {};
    var boxes = {};  // gpu id -> its checkbox, once the list was opened
    var names = {};  // gpu id -> "host GPU i"
    pick.groups.forEach(function (group) {
      group.hosts.forEach(function (host) {
        host.gpus.forEach(function (g) { names[g[0]] = host.name + " GPU " + g[1]; });
      });
    });
    // The keyboard list: built when first opened (a pool of thousands of GPUs stays cheap).
    var details = document.getElementById("pick-list");
    details.addEventListener("toggle", function () { if (details.open) buildList(); });
    function buildList() {
      var target = document.getElementById("pick-gpus");
      if (target.dataset.built) return;
      target.dataset.built = "1";
      pick.groups.forEach(function (group) {
        var fieldset = document.createElement("fieldset");
        fieldset.appendChild(el("legend", group.leaf));
        group.hosts.forEach(function (host) {
          var line = el("div", host.name + ": ");
          host.gpus.forEach(function (g) {
            var label = document.createElement("label"), box = document.createElement("input");
            label.className = "nowrap";
            box.type = "checkbox";
            box.dataset.gpu = String(g[0]);
            box.checked = !!chosen[g[0]];
            box.setAttribute("aria-label", host.name + " GPU " + g[1] + " (" + g[2] + ")");
            box.addEventListener("change", function () { set(box.dataset.gpu, box.checked); });
            boxes[g[0]] = box;
            label.appendChild(box);
            label.appendChild(document.createTextNode(" " + g[1] + " "));
            if (g[2] !== "free") { var note = el("span", g[2] + " "); note.className = "muted"; label.appendChild(note); }
            line.appendChild(label);
          });
          fieldset.appendChild(line);
        });
        target.appendChild(fieldset);
      });
    }
    var status = document.getElementById("pick-status");
    var problems = document.getElementById("pick-problems");
    var notes = document.getElementById("pick-notes");
    var confirm = document.getElementById("pick-confirm");
    // serial: which pick is on screen (an answer about an older one is ignored); answered:
    // how many dry runs came back for the pick on screen (read by the browser test).
    var timer = null, serial = 0, answered = 0, refused = false;

    function ids() { return Object.keys(chosen).map(Number).sort(function (a, b) { return a - b; }); }
    function describe(id) { return names[id] || "GPU " + id; }

    function set(id, on) {
      if (on) chosen[id] = true; else delete chosen[id];
      changed();
    }

    function changed() {
      var picked = ids();
      serial++;
      Plotly.restyle(graph, xy(picked), [3]);
      graph.dataset.picked = picked.join(",");
      Object.keys(boxes).forEach(function (id) { boxes[id].checked = !!chosen[id]; });
      confirm.disabled = true;  // until the dry run of exactly this pick says yes
      if (refused) return;  // the proposal changed: the panel says to reload
      status.textContent = "Your pick: " + picked.length + " GPU" + (picked.length === 1 ? "" : "s") + "; checking…";
      clearTimeout(timer);
      timer = setTimeout(check, 120);
    }

    function post(url, body) {
      return fetch(url, { method: "POST", credentials: "same-origin",
                          headers: { "Content-Type": "application/json", "X-CSRFToken": panel.dataset.csrf },
                          body: JSON.stringify(body) })
        .then(function (response) {
          return response.json().catch(function () { return { error: "The server answered " + response.status + "." }; })
            .then(function (answer) { answer.status = response.status; return answer; });
        });
    }

    function list(target, lead, items) {
      target.textContent = "";
      if (lead) target.appendChild(el("p", lead));
      if (items && items.length) {
        var ul = document.createElement("ul");
        items.forEach(function (item) { ul.appendChild(el("li", item)); });
        target.appendChild(ul);
      }
      target.hidden = !lead && !(items && items.length);
    }

    function el(tag, text) { var node = document.createElement(tag); node.textContent = text; return node; }

    function number(v) { return v === null || v === undefined ? "—" : String(Math.round(v * 1000) / 1000); }

    function showCost(table) {
      (table || []).forEach(function (row) {
        var tr = panel.querySelector('#pick-cost tr[data-key="' + row.key + '"]');
        if (!tr) return;
        var cell = tr.cells[2];
        cell.textContent = "";
        var text = document.createTextNode(number(row.pick));
        if (row.differs) { var strong = document.createElement("strong"); strong.appendChild(text); cell.appendChild(strong); }
        else cell.appendChild(text);
      });
    }

    function check() {
      if (refused) return;
      var mine = serial, picked = ids();
      post(panel.dataset.checkUrl, { gpus: picked, version: pick.version }).then(function (answer) {
        if (mine !== serial) return;  // the pick changed meanwhile: its own dry run follows
        if (answer.status !== 200) return stop(answer);
        showCost(answer.table);
        if (answer.ok) {
          list(problems, "", []);
          status.textContent = "Your pick: " + picked.length + " GPU" + (picked.length === 1 ? "" : "s") +
            " breaks no rule; its cost is next to the proposal's. Confirm to override.";
          confirm.disabled = false;
        } else {
          list(problems, "This pick breaks " + answer.problems.length + " rule" + (answer.problems.length === 1 ? "" : "s") +
               "; Confirm stays disabled:", answer.problems);
          status.textContent = "Your pick: " + picked.length + " GPU" + (picked.length === 1 ? "" : "s") + " cannot be used.";
          confirm.disabled = true;
        }
        list(notes, "", answer.notes || []);
        panel.dataset.checked = String(++answered);
      }).catch(function () {
        if (mine !== serial) return;
        status.textContent = "The dry run could not reach the server; Confirm stays disabled. Toggle a GPU to try again.";
        panel.dataset.checked = String(++answered);
      });
    }

    // A refusal of the request itself (changed under you, not allowed, malformed): said plainly.
    function stop(answer) {
      list(problems, answer.error || "Refused.", answer.problems || []);
      confirm.disabled = true;
      if (answer.changed) {
        refused = true;
        status.textContent = "Nothing was changed. Reload the page to see the placement as it is now.";
      } else {
        status.textContent = "Nothing was changed.";
      }
      panel.dataset.checked = String(++answered);
    }

    confirm.addEventListener("click", function () {
      confirm.disabled = true;
      status.textContent = "Overriding…";
      post(panel.dataset.confirmUrl, { gpus: ids(), version: pick.version }).then(function (answer) {
        if (answer.status === 200 && answer.ok) { window.location.href = answer.url; return; }
        stop(answer);
      }).catch(function () {
        status.textContent = "The override could not reach the server; nothing was changed.";
      });
    });
    document.getElementById("pick-reset").addEventListener("click", function () {
      chosen = {};
      pick.proposal.forEach(function (id) { chosen[id] = true; });
      changed();
    });
    document.getElementById("pick-clear").addEventListener("click", function () { chosen = {}; changed(); });

    pick.proposal.forEach(function (id) { chosen[id] = true; });
    changed();

    return {
      click: function (col, row) {
        var id = pick.cells[row] && pick.cells[row][col];
        if (id === null || id === undefined) { status.textContent = "No GPU there."; return; }
        set(String(id), !chosen[id]);
        status.textContent = (chosen[id] ? "Added " : "Took out ") + describe(id) + ". " + status.textContent;
      },
    };
  }

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
