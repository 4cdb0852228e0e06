// The pool page's host list, live: it subscribes to /ws/live/pool/ (core/live_consumers.PoolConsumer)
// and changes the rows on the page in place: state, GPUs busy and free, mean utilization. The
// snapshot is column arrays (core.live_snapshots.pool); deltas carry changed GPUs [util, mem,
// temp] by GPU id and changed host states by host id. Rows not on this page are left alone.
(function () {
  "use strict";
  var table = document.getElementById("host-table");
  if (!table || !window.FabricPoolLive) return;
  var threshold = parseFloat(table.dataset.busyThreshold);
  var classes = {};
  try { classes = JSON.parse(table.dataset.stateClasses || "{}"); } catch (e) { /* unstyled states */ }
  var rows = {};
  table.querySelectorAll("td[data-host-id]").forEach(function (td) { rows[td.dataset.hostId] = td.parentNode; });
  var snap = null, gpuAt = {}, hostAt = {};

  function text(el, value) { if (el && el.textContent !== value) el.textContent = value; }
  function setState(id, state) {
    var el = rows[id] && rows[id].querySelector(".host-state");
    if (!el) return;
    text(el, state);
    el.className = "state " + (classes[state] || "state-unknown") + " host-state";
  }
  // Busy, free and mean utilization of the hosts at these positions, from the GPU arrays.
  function refresh(positions) {
    var G = snap.gpus, per = {};
    positions.forEach(function (p) { per[p] = { n: 0, busy: 0, sum: 0, read: 0 }; });
    for (var i = 0; i < G.id.length; i++) {
      var e = per[G.host[i]];
      if (!e) continue;
      e.n++;
      if (G.util[i] != null) { e.read++; e.sum += G.util[i]; if (G.util[i] >= threshold) e.busy++; }
    }
    positions.forEach(function (p) {
      var tr = rows[snap.hosts.id[p]], e = per[p];
      if (!tr) return;
      text(tr.querySelector(".host-busy"), String(e.busy));
      text(tr.querySelector(".host-free"), String(e.n - e.busy));
      text(tr.querySelector(".host-util"), e.read ? Math.round(e.sum / e.read) + " %" : "—");
    });
    table.dataset.updates = String(Number(table.dataset.updates || 0) + 1);
  }

  window.FabricPoolLive.subscribe("/ws/live/pool/", {
    onSnapshot: function (data) {
      snap = data; gpuAt = {}; hostAt = {};
      data.gpus.id.forEach(function (id, i) { gpuAt[id] = i; });
      data.hosts.id.forEach(function (id, i) { hostAt[id] = i; setState(id, data.hosts.state[i]); });
      refresh(Object.keys(rows).map(function (id) { return hostAt[id]; }).filter(function (p) { return p !== undefined; }));
    },
    onDelta: function (changes) {
      if (!snap) return;
      var touched = {};
      Object.keys(changes.gpus || {}).forEach(function (id) {
        var i = gpuAt[id], v = changes.gpus[id];
        if (i === undefined || !v) return;
        snap.gpus.util[i] = v[0]; snap.gpus.mem[i] = v[1]; snap.gpus.temp[i] = v[2];
        if (rows[snap.hosts.id[snap.gpus.host[i]]]) touched[snap.gpus.host[i]] = true;
      });
      Object.keys(changes.hosts || {}).forEach(function (id) {
        if (changes.hosts[id] != null) setState(id, changes.hosts[id]);
      });
      var positions = Object.keys(touched).map(Number);
      if (positions.length) refresh(positions);
    },
  });
})();
