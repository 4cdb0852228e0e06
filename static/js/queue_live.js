// The Scheduler page kept live (/ws/live/queue/, core/live_snapshots.queue): proposals that
// appear get a row (with approve / reject forms for users who may decide), proposals decided
// by anyone lose theirs, and the queue table follows the jobs that join or leave it. The page
// works without this script: the server renders every row first.
// Rows are built with textContent only: job and tenant names never go through markup.
(function () {
  "use strict";
  liveBanner();
  var config = document.getElementById("queue-live");
  if (!config || !window.FabricPoolLive) return;
  var proposalBody = document.querySelector("#proposal-table tbody");
  var queueBody = document.querySelector("#queue-table tbody");
  var canDecide = config.dataset.canDecide === "1";
  // New rows only where the server would have shown them: unfiltered, first page.
  var mayInsert = config.dataset.insert === "1";
  // Ids grow: one above every row the server rendered is new since the page loaded (a
  // snapshot may hold more than this page shows; only the new ones are added).
  var seen = {};
  [["data-placement", proposalBody], ["data-job", queueBody]].forEach(function (pair) {
    var max = 0;
    if (pair[1]) Array.prototype.forEach.call(pair[1].rows, function (tr) { max = Math.max(max, +tr.getAttribute(pair[0]) || 0); });
    seen[pair[0]] = max;
  });
  var clock = new Intl.DateTimeFormat(undefined, { dateStyle: "medium", timeStyle: "short" });

  // The server renders each URL with id 0 (no other "/0/" in these paths).
  function url(template, id) { return template.replace("/0/", "/" + id + "/"); }

  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (key) {
      if (key === "text") node.textContent = attrs[key];
      else if (key === "className") node.className = attrs[key];
      else node.setAttribute(key, attrs[key]);
    });
    (children || []).forEach(function (child) { if (child) node.appendChild(child); });
    return node;
  }

  function cell(text, className) { return el("td", { text: text == null ? "" : String(text), className: className || "" }); }

  function hidden(name, value) { return el("input", { type: "hidden", name: name, value: String(value) }); }

  function decideForm(p, action) {
    var form = el("form", { method: "post", action: url(config.dataset.placementUrl, p.id), className: "filters decide-form" });
    form.appendChild(hidden("csrfmiddlewaretoken", config.dataset.csrf));
    form.appendChild(hidden("version", p.version));
    form.appendChild(hidden("next", config.dataset.next));
    if (action === "reject") {
      var label = el("label", { text: "Reason " });
      label.appendChild(el("input", { type: "text", name: "reason", maxlength: "500", size: "16",
                                      "aria-label": "Why placement " + p.id + " is rejected" }));
      form.appendChild(label);
    }
    form.appendChild(el("button", { type: "submit", name: "action", value: action,
                                    text: action === "approve" ? "Approve" : "Reject",
                                    "aria-label": (action === "approve" ? "Approve" : "Reject") + " placement " + p.id }));
    return form;
  }

  function proposalRow(p) {
    var first = el("td", {}, [el("a", { href: url(config.dataset.placementUrl, p.id), text: String(p.id) })]);
    if (p.is_override) {
      first.appendChild(document.createTextNode(" "));
      first.appendChild(el("span", { className: "state state-degraded", text: "override" }));
    }
    var job = el("td", {}, [el("a", { href: url(config.dataset.jobUrl, p.job), text: p.job_name || ("job " + p.job) }),
                            el("div", { className: "muted", text: p.tenant })]);
    var cells = [first, job, cell(p.gpus, "num"), cell(p.hosts + " host" + (p.hosts === 1 ? "" : "s")),
                 cell(p.leaves, "num"), cell("open the placement for its cost", "muted"), cell(""),
                 cell(p.expires_at ? clock.format(new Date(p.expires_at)) : "never", "nowrap")];
    if (canDecide) {
      cells.push(el("td", {}, [el("div", { className: "decide" }, [
        decideForm(p, "approve"), decideForm(p, "reject"),
        el("a", { className: "button", href: url(config.dataset.overrideUrl, p.id), text: "Override…",
                  "aria-label": "Override placement " + p.id + ": pick other GPUs" }),
        el("a", { className: "button", href: config.dataset.heatmapUrl + "?pick=" + p.id, text: "Pick GPUs on the heatmap",
                  "aria-label": "Pick GPUs for placement " + p.id + " on the heatmap" })])]));
    }
    return el("tr", { "data-placement": String(p.id), "data-version": String(p.version) }, cells);
  }

  function jobRow(j) {
    var first = el("td", {}, [el("a", { href: url(config.dataset.jobUrl, j.id), text: j.name || ("job " + j.id) })]);
    if (j.state === "preempted") {
      first.appendChild(document.createTextNode(" "));
      first.appendChild(el("span", { className: "state state-degraded", text: "preempted" }));
    }
    return el("tr", { "data-job": String(j.id) }, [
      first, cell(j.tenant), cell(j.pool), cell(j.gpus, "num"), cell(j.priority, "num"), cell("just now", "nowrap"),
      cell(j.reason ? j.reason : "Not looked at by a cycle yet."),
      cell(j.expected_start ? clock.format(new Date(j.expected_start)) : "unknown", "nowrap")]);
  }

  // Show the table or its "nothing here" line, whichever fits.
  function refresh(body, emptyId) {
    if (!body) return;
    var wrap = body.closest(".table-wrap"), empty = document.getElementById(emptyId);
    var any = body.rows.length > 0;
    if (wrap) wrap.hidden = !any;
    if (empty) empty.hidden = any;
  }

  // Apply {key: value or null} to the rows of a tbody keyed by `attr`.
  function patch(body, attr, changes, build, emptyId, full) {
    if (!body) return;
    var rows = {};
    Array.prototype.forEach.call(body.rows, function (tr) { rows[tr.getAttribute(attr)] = tr; });
    if (full) {
      // A snapshot: rows it does not hold were decided or left meanwhile.
      Object.keys(rows).forEach(function (key) { if (!(key in changes)) body.removeChild(rows[key]); });
    }
    Object.keys(changes).forEach(function (key) {
      var value = changes[key], row = rows[key];
      if (value === null) {
        if (row && row.parentNode) body.removeChild(row);
      } else if (row) {
        // Keep the server's richer row; only a new version means new forms.
        if (attr === "data-placement" && row.getAttribute("data-version") !== String(value.version)) {
          body.replaceChild(build(value), row);
        }
      } else if (mayInsert && (!full || +key > seen[attr])) {
        body.appendChild(build(value));
      }
    });
    refresh(body, emptyId);
  }

  window.FabricPoolLive.subscribe("/ws/live/queue/", {
    onSnapshot: function (data) {
      patch(proposalBody, "data-placement", data.proposals || {}, proposalRow, "proposals-empty", true);
      patch(queueBody, "data-job", data.jobs || {}, jobRow, "queue-empty", true);
    },
    onDelta: function (changes) {
      if (changes.proposals) patch(proposalBody, "data-placement", changes.proposals, proposalRow, "proposals-empty", false);
      if (changes.jobs) patch(queueBody, "data-job", changes.jobs, jobRow, "queue-empty", false);
    },
  });
})();
