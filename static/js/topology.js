// The topology page: the fat tree drawn with plotly.js WebGL traces (scattergl) from the
// data the server embeds (#topology-data, built by core/topology.py). Tiers are rows,
// hosts sit under their leaves; clicking a host or switch opens its page. Above
// data.aggregate_above hosts, hosts start folded into one marker per leaf: a click on it
// unfolds that leaf, and zooming in to few enough hosts shows them all; the leaves of a
// highlighted placement start unfolded.
// Plotly reads text as markup: every name from the database goes through esc() first.
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
  graph.textContent = "";
  Plotly.newPlot(graph, traces(), layout, config).then(function () {
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
