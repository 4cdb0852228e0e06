// The topology page: the fat tree drawn with plotly.js WebGL traces (scattergl) from the
// data the server embeds (#topology-data, built by core/topology.py). Tiers are rows,
// hosts sit under their leaves; clicking a host or switch opens its page. Above
// data.aggregate_above hosts, hosts start folded into one marker per leaf: a click on it
// unfolds that leaf, and zooming in to few enough hosts shows them all; the leaves of a
// highlighted placement start unfolded.
// Plotly reads text as markup: every name from the database goes through esc() first.
//
// Live: the page subscribes to /ws/live/topology/ (core/live_consumers.TopologyConsumer):
// host values [state, mean utilization, busy GPUs, tenant] by host id and link states by
// link id; they are applied with Plotly.restyle (colours, hover text, link segments moved
// between the state traces), never a new plot. #topology-table is the same data as a
// table (keyboard and screen readers), refreshed while it is open.
(function () {
  "use strict";
  var source = document.getElementById("topology-data");
  var graph = document.getElementById("topology-graph");
  if (!source || !graph) return;

  var esc = window.FabricPoolCharts.esc;
  function note(text) { window.FabricPoolCharts.note(graph, text); }

  var data;
  try { data = JSON.parse(source.textContent); } catch (e) { note("The topology data could not be read."); return; }
  if (typeof window.Plotly === "undefined") { note("plotly.js did not load: no drawing."); return; }

  var style = getComputedStyle(document.documentElement);
  function css(name, fallback) { return style.getPropertyValue(name).trim() || fallback; }
  var textColor = css("--text", "#1b1f24"), gridColor = css("--border", "#d0d7de"), muted = css("--muted", "#57606a");
  var LINK_COLORS = {
    up: "rgba(17,99,41,0.35)", degraded: "#d29922", down: "#cf222e", missing: "#8c959f",
    "0-25 %": "rgba(31,119,180,0.45)", "25-50 %": "#2ca02c", "50-75 %": "#ff7f0e", "75-100 %": "#d62728",
    unknown: "rgba(140,149,159,0.35)", unusable: "#cf222e",
  };
  var TENANT_PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#d62728", "#7f7f7f"];
  var IDLE = "#c9d1d9";

  // Utilization 0..100 -> blue, yellow, red; no reading -> grey.
  function utilColor(u) {
    if (u == null) return IDLE;
    var t = Math.max(0, Math.min(1, u / 100)), r, g, b;
    if (t < 0.5) { var s = t / 0.5; r = 49 + s * (240 - 49); g = 130 + s * (200 - 130); b = 189 - s * 150; }
    else { var s2 = (t - 0.5) / 0.5; r = 240 - s2 * 25; g = 200 - s2 * 170; b = 39 - s2 * 9; }
    return "rgb(" + Math.round(r) + "," + Math.round(g) + "," + Math.round(b) + ")";
  }
  var tenantIndex = {};
  data.tenants.forEach(function (t, i) { tenantIndex[t.name] = i; });
  function tenantColor(t) { return t == null ? IDLE : TENANT_PALETTE[tenantIndex[t] % TENANT_PALETTE.length]; }
  function fmt(v, unit) { return v == null ? "—" : v + (unit || ""); }

  var H = data.hosts, n = H.name.length, switches = data.switches;
  var tenantNext = data.tenants.length;
  function tenantSeen(t) { if (t != null && !(t in tenantIndex)) tenantIndex[t] = tenantNext++; }
  function hostColor(i) { return data.color === "tenant" ? tenantColor(H.tenant[i]) : utilColor(H.util[i]); }
  function hostHover(i) {
    var leaf = H.leaf[i] == null ? "no leaf" : switches[H.leaf[i]].name;
    return "<b>" + esc(H.name[i]) + "</b> (" + esc(H.state[i]) + ")<br>leaf " + esc(leaf) +
      "<br>GPUs busy " + H.busy[i] + " / " + H.gpus[i] + " · mean util. " + fmt(H.util[i], " %") +
      "<br>tenant " + esc(H.tenant[i] || "none") + " · IB " + fmt(H.ib_gbps[i], " Gb/s");
  }
  function switchHover(s) {
    var text = "<b>" + esc(s.name) + "</b><br>" + esc(s.tier) + (s.present ? "" : " · missing") + "<br>GUID 0x" + esc(s.guid);
    if (s.tier === "leaf") text += "<br>" + s.hosts + " hosts · GPUs busy " + s.busy + " / " + s.gpus + " · mean util. " + fmt(s.util, " %");
    return text;
  }

  // Which hosts are drawn one by one: all when not aggregated; otherwise the unfolded
  // leaves and, when zoomed in to few enough hosts, those in view.
  var expanded = {}, view = null;
  // A highlighted placement's leaves start unfolded, so its hosts show one by one.
  for (var k = 0; k < n; k++) if (H.highlight[k] && H.leaf[k] != null) expanded[H.leaf[k]] = true;
  function hostShown(i) {
    if (!data.aggregated) return true;
    if (H.leaf[i] != null && expanded[H.leaf[i]]) return true;
    return view !== null && H.x[i] >= view[0] && H.x[i] <= view[1];
  }
  function inViewCount(range) {
    var c = 0;
    for (var i = 0; i < n; i++) if (H.x[i] >= range[0] && H.x[i] <= range[1]) c++;
    return c;
  }

  function traces() {
    var out = [];
    data.links.groups.forEach(function (g) {
      var x = g.x, y = g.y;
      if (data.aggregated) {  // host cables only for the hosts drawn one by one
        x = []; y = [];
        g.host.forEach(function (h, k) {
          if (h === null || hostShown(h)) { x.push(g.x[3 * k], g.x[3 * k + 1], null); y.push(g.y[3 * k], g.y[3 * k + 1], null); }
        });
      }
      out.push({ type: "scattergl", mode: "lines", x: x, y: y, name: esc(g.label) + " (" + g.count + ")",
                 hoverinfo: "skip", line: { color: LINK_COLORS[g.key] || muted, width: g.key === "up" ? 1 : 2 }, legendgroup: "links" });
    });
    var p = data.links.problems;
    if (p.length) {
      out.push({ type: "scattergl", mode: "markers", x: p.map(function (l) { return l.x; }), y: p.map(function (l) { return l.y; }),
                 name: "links not up", marker: { size: 7, symbol: "x", color: p.map(function (l) { return LINK_COLORS[l.state]; }) },
                 hoverinfo: "text", text: p.map(function (l) {
                   return "<b>" + esc(l.state) + "</b>: " + esc(l.a) + " ↔ " + esc(l.b) + (l.reason ? "<br>" + esc(l.reason) : "");
                 }) });
    }
    var hx = [], hy = [], hc = [], ht = [], hd = [];
    for (var i = 0; i < n; i++) {
      if (!hostShown(i)) continue;
      hx.push(H.x[i]); hy.push(0); hc.push(hostColor(i)); ht.push(hostHover(i)); hd.push(H.url[i]);
    }
    out.push({ type: "scattergl", mode: "markers", x: hx, y: hy, name: "hosts", text: ht, customdata: hd, hoverinfo: "text",
               marker: { size: n > 1024 ? 5 : 9, color: hc, line: { width: 0 } } });
    if (data.aggregated) {
      var ax = [], ac = [], at = [], ad = [], as = [];
      switches.forEach(function (s, k) {
        if (s.tier !== "leaf" || !s.hosts || expanded[k]) return;
        ax.push(s.x); as.push(6 + Math.sqrt(s.hosts) * 2); at.push(switchHover(s) + "<br><i>click to show its hosts</i>"); ad.push("expand:" + k);
        var lead = null;
        if (data.color === "tenant") {
          var seen = {};
          for (var j = 0; j < n; j++) if (H.leaf[j] === k && H.tenant[j]) seen[H.tenant[j]] = (seen[H.tenant[j]] || 0) + 1;
          Object.keys(seen).forEach(function (t) { if (lead === null || seen[t] > seen[lead]) lead = t; });
          ac.push(tenantColor(lead));
        } else ac.push(utilColor(s.util));
      });
      out.push({ type: "scattergl", mode: "markers", x: ax, y: ax.map(function () { return 0; }), name: "hosts per leaf",
                 text: at, customdata: ad, hoverinfo: "text", marker: { size: as, color: ac, symbol: "circle", line: { width: 1, color: textColor } } });
    }
    out.push({ type: "scattergl", mode: "markers", x: switches.map(function (s) { return s.x; }), y: switches.map(function (s) { return s.y; }),
               name: "switches", text: switches.map(switchHover), customdata: switches.map(function (s) { return s.url; }), hoverinfo: "text",
               marker: { size: 10, symbol: "square", color: switches.map(function (s) { return s.present ? (s.tier === "leaf" && data.color === "utilization" ? utilColor(s.util) : "#57606a") : "#cf222e"; }),
                         line: { width: 1, color: textColor } } });
    if (data.highlight) {
      var lx = [], ly = [];
      for (var h = 0; h < n; h++) if (H.highlight[h]) { lx.push(H.x[h]); ly.push(0); }
      switches.forEach(function (s) { if (s.highlight) { lx.push(s.x); ly.push(s.y); } });
      out.push({ type: "scattergl", mode: "markers", x: lx, y: ly, name: "placement " + data.highlight.placement, hoverinfo: "skip",
                 marker: { size: 16, symbol: "circle-open", color: "#ff00aa", line: { width: 3, color: "#ff00aa" } } });
    }
    return out;
  }

  var tickRows = data.rows;
  var layout = {
    margin: { l: 60, r: 10, t: 10, b: 30 }, paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
    font: { color: textColor }, showlegend: true, legend: { orientation: "h", y: -0.05 }, hovermode: "closest", dragmode: "zoom",
    xaxis: { showgrid: false, zeroline: false, showticklabels: false },
    yaxis: { tickvals: tickRows.map(function (r) { return r.y; }), ticktext: tickRows.map(function (r) { return r.tier; }),
             gridcolor: gridColor, zeroline: false, fixedrange: true, range: [-0.5, Math.max.apply(null, tickRows.map(function (r) { return r.y; })) + 0.5] },
  };
  var config = { responsive: true, displaylogo: false, scrollZoom: true };

  function redraw() { return Plotly.react(graph, traces(), layout, config); }

  // --- live updates -------------------------------------------------------------------------
  var hostById = {}, linkById = {};
  for (var h0 = 0; h0 < n; h0++) hostById[H.id[h0]] = h0;
  function indexLinks() {
    linkById = {};
    data.links.groups.forEach(function (g, gi) { g.link.forEach(function (id, k) { linkById[id] = [gi, k]; }); });
  }
  indexLinks();
  // Names at a segment's ends (for the hover text of a link that went down live).
  var endName = {};
  switches.forEach(function (s) { endName[s.x + "," + s.y] = s.name; });
  for (var h1 = 0; h1 < n; h1++) endName[H.x[h1] + ",0"] = H.name[h1];

  // A leaf's numbers follow its hosts' (the server computes them alike in core/topology.py).
  function refreshLeaves(leaves) {
    Object.keys(leaves).forEach(function (k) {
      var s = switches[k], sum = 0, count = 0, busy = 0;
      for (var i = 0; i < n; i++) {
        if (H.leaf[i] !== Number(k)) continue;
        busy += H.busy[i];
        if (H.util[i] != null) { sum += H.util[i]; count++; }
      }
      s.busy = busy;
      s.util = count ? Math.round(sum / count * 10) / 10 : null;
    });
  }

  function applyHosts(values) {
    var leaves = {}, changed = false;
    Object.keys(values || {}).forEach(function (id) {
      var i = hostById[id], v = values[id];
      if (i === undefined || !v) return;  // another fabric's host, or gone
      if (H.state[i] === v[0] && H.util[i] === v[1] && H.busy[i] === v[2] && H.tenant[i] === v[3]) return;
      H.state[i] = v[0]; H.util[i] = v[1]; H.busy[i] = v[2]; H.tenant[i] = v[3];
      tenantSeen(v[3]);
      if (H.leaf[i] != null) leaves[H.leaf[i]] = true;
      changed = true;
    });
    refreshLeaves(leaves);
    return changed;
  }

  function groupFor(key, label) {
    var g = data.links.groups.find(function (x) { return x.key === key; });
    if (!g) { g = { key: key, label: label, count: 0, x: [], y: [], host: [], link: [] }; data.links.groups.push(g); }
    return g;
  }

  function applyLinks(states) {
    var changed = false;
    Object.keys(states || {}).forEach(function (id) {
      var at = linkById[id], state = states[id];
      if (!at || state == null) return;
      var g = data.links.groups[at[0]], k = at[1];
      var key = data.links_color === "health" ? state : (state === "up" ? "unknown" : "unusable");
      var label = data.links_color === "health" ? state : (state === "up" ? "no traffic data" : "not up");
      var problems = data.links.problems, p = problems.findIndex(function (x) { return String(x.link) === id; });
      var wasUp = p < 0;
      if (wasUp === (state === "up") && (g.key === key || data.links_color !== "health")) return;
      var x = g.x.splice(3 * k, 3), y = g.y.splice(3 * k, 3), host = g.host.splice(k, 1)[0];
      g.link.splice(k, 1); g.count--;
      var target = groupFor(key, label);
      target.x.push.apply(target.x, x); target.y.push.apply(target.y, y); target.host.push(host); target.link.push(Number(id));
      target.count++;
      if (p >= 0) problems.splice(p, 1);
      if (state !== "up") {
        problems.push({ link: Number(id), x: Math.round((x[0] + x[1]) / 2 * 100) / 100, y: (y[0] + y[1]) / 2, state: state,
                        reason: "changed live", a: endName[x[0] + "," + y[0]] || "?", b: endName[x[1] + "," + y[1]] || "?" });
      }
      data.links.groups = data.links.groups.filter(function (x) { return x.count > 0; });
      indexLinks();
      changed = true;
    });
    return changed;
  }

  // The drawing follows the data: same traces -> one Plotly.restyle of what changes;
  // a trace appearing or going (the first down link) -> Plotly.react, which diffs.
  function update(linksToo) {
    var next = traces(), gd = graph;
    var same = next.length === gd.data.length && next.every(function (t, i) {
      var old = gd.data[i];
      return t.mode === old.mode && t.name.split(" (")[0] === old.name.split(" (")[0];
    });
    if (!same) { redraw(); table.refresh(); return; }
    var markers = [], lines = [];
    next.forEach(function (t, i) {
      if (t.mode === "lines") lines.push(i);
      else if (t.text) markers.push(i);  // the placement's rings (no text) never change
    });
    function pick(list, f) { return list.map(function (i) { return f(next[i]); }); }
    Plotly.restyle(gd, { x: pick(markers, function (t) { return t.x; }), y: pick(markers, function (t) { return t.y; }),
                         "marker.color": pick(markers, function (t) { return t.marker.color; }),
                         text: pick(markers, function (t) { return t.text; }),
                         customdata: pick(markers, function (t) { return t.customdata; }) }, markers);
    if (linksToo) {
      Plotly.restyle(gd, { x: pick(lines, function (t) { return t.x; }), y: pick(lines, function (t) { return t.y; }),
                           name: pick(lines, function (t) { return t.name; }) }, lines);
    }
    graph.dataset.updates = String(Number(graph.dataset.updates || 0) + 1);
    table.refresh();
  }

  function linkLegend() {
    var list = document.getElementById("topology-link-legend");
    if (!list) return;
    list.textContent = "";
    data.links.groups.forEach(function (g) {
      var li = document.createElement("li");
      li.textContent = g.label + ": " + g.count + " link" + (g.count === 1 ? "" : "s");
      list.appendChild(li);
    });
  }

  function subscribe() {
    if (!window.FabricPoolLive) return;
    var notice = document.getElementById("topology-reload");
    window.FabricPoolLive.subscribe("/ws/live/topology/", {
      onSnapshot: function (snap) {
        var hosts = applyHosts(snap.hosts), links = applyLinks(snap.links);
        if (hosts || links) update(links);
        if (links) linkLegend();
        graph.dataset.live = "1";
      },
      onDelta: function (changes) {
        var hosts = applyHosts(changes.hosts), links = applyLinks(changes.links);
        if (hosts || links) update(links);
        if (links) linkLegend();
        if (changes.fabric && data.fabric in changes.fabric && notice) notice.hidden = false;
      },
    });
  }

  // --- the same data as a table (#topology-table), built when opened --------------------------
  var table = (function () {
    var box = document.getElementById("topology-table");
    var pending = null;
    function cell(row, text, cls) { var td = document.createElement("td"); td.textContent = text; if (cls) td.className = cls; row.appendChild(td); return td; }
    function linkCell(row, href, text) {
      var th = document.createElement("th"), a = document.createElement("a");
      th.scope = "row"; a.href = href; a.textContent = text; th.appendChild(a); row.appendChild(th);
    }
    function build() {
      if (!box || !box.open) return;
      var sw = box.querySelector("#topology-switch-rows"), hosts = box.querySelector("#topology-host-rows");
      var a = document.createDocumentFragment(), b = document.createDocumentFragment();
      switches.forEach(function (s) {
        var tr = document.createElement("tr");
        linkCell(tr, s.url, s.name);
        cell(tr, s.tier + (s.present ? "" : " (missing)"));
        cell(tr, s.tier === "leaf" ? String(s.hosts) : "", "num");
        cell(tr, s.tier === "leaf" ? s.busy + " / " + s.gpus : "", "num");
        cell(tr, s.tier === "leaf" ? fmt(s.util, " %") : "", "num");
        a.appendChild(tr);
      });
      for (var i = 0; i < n; i++) {
        var tr = document.createElement("tr");
        linkCell(tr, H.url[i], H.name[i]);
        cell(tr, H.leaf[i] == null ? "no leaf" : switches[H.leaf[i]].name);
        cell(tr, H.state[i]);
        cell(tr, H.busy[i] + " / " + H.gpus[i], "num");
        cell(tr, fmt(H.util[i], " %"), "num");
        cell(tr, H.tenant[i] || "none");
        b.appendChild(tr);
      }
      sw.textContent = ""; sw.appendChild(a);
      hosts.textContent = ""; hosts.appendChild(b);
      var problems = box.querySelector("#topology-problem-rows");
      problems.textContent = "";
      data.links.problems.forEach(function (p) {
        var li = document.createElement("li");
        li.textContent = p.state + ": " + p.a + " ↔ " + p.b + (p.reason ? " (" + p.reason + ")" : "");
        problems.appendChild(li);
      });
      if (!data.links.problems.length) { var li = document.createElement("li"); li.textContent = "every drawn link is up"; problems.appendChild(li); }
    }
    if (box) box.addEventListener("toggle", build);
    return {
      // Live updates come a few times a second at most; the table follows once a second.
      refresh: function () { if (box && box.open && !pending) pending = setTimeout(function () { pending = null; build(); }, 1000); },
      build: build,
    };
  })();
  graph.textContent = "";
  Plotly.newPlot(graph, traces(), layout, config).then(function () {
    subscribe();
    // Time since navigation when the drawing answers clicks (read by the browser test).
    graph.dataset.readyMs = String(Math.round(performance.now()));
    graph.on("plotly_click", function (event) {
      var target = event.points && event.points[0] && event.points[0].customdata;
      if (!target) return;
      if (String(target).indexOf("expand:") === 0) { expanded[Number(target.slice(7))] = true; redraw(); return; }
      window.location.href = target;
    });
    graph.on("plotly_relayout", function (ev) {
      if (!data.aggregated) return;
      var range = ev["xaxis.range[0]"] != null ? [ev["xaxis.range[0]"], ev["xaxis.range[1]"]] : null;
      var next = range && inViewCount(range) <= data.aggregate_above ? range : null;
      if (ev["xaxis.autorange"]) next = null;
      if ((next === null) !== (view === null) || next !== null) { view = next; redraw(); }
    });
  });
})();
