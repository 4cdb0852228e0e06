// Live updates: the connection indicator in the top bar and the client of the live views.
//
// Indicator: connects to the heartbeat websocket and shows "live", "reconnecting since
// HH:MM:SS" (the operator's time zone, static/js/time.js; the earliest time anything went
// down) while it retries, or "disconnected" when retrying cannot help (the session ended);
// a live-view subscription that is down shows there too. Every socket reconnects with
// jittered exponential backoff. It also fires the "fabricpool:live" event with the state
// ("connecting", "live" or "down"), since (a Date or null) and the indicator's text.
//
// FabricPoolLive.subscribe(path, {onSnapshot(data, seq), onDelta(changes, seq)}) connects to a
// live view (core/live_consumers.py): the server sends a snapshot first, then deltas
// {since, seq, changes: {kind: {key: value or null}}}. A delta whose `since` is not the seq the
// page holds means something was lost: the client asks for a resync and ignores deltas until
// the fresh snapshot arrives. After a reconnect the new connection's snapshot replaces
// everything. Returns {resync(), close()}.
(function () {
  "use strict";
  if (!("WebSocket" in window)) return;

  var MIN_DELAY = 1000, MAX_DELAY = 30000;
  var PING_EVERY = 25000, PONG_WITHIN = 10000;
  var CLOSE_UNAUTHENTICATED = 4401, CLOSE_NO_ROLE = 4403, CLOSE_NOT_FOUND = 4404;
  var el = document.getElementById("live-status");
  var clock = new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false });
  var zone = Intl.DateTimeFormat().resolvedOptions().timeZone || "local time";
  var sockets = {};  // name -> {state: "connecting"|"live"|"down", since: Date|null, note: string}

  function wsUrl(path) {
    return (location.protocol === "https:" ? "wss://" : "ws://") + location.host + path;
  }

  // The indicator shows the worst state of all sockets.
  function render() {
    if (!el) return;
    var state = "live", since = null, ended = false;
    Object.keys(sockets).forEach(function (name) {
      var s = sockets[name];
      if (s.state === "down") {
        state = "down";
        if (since === null || s.since < since) since = s.since;
        ended = ended || s.ended;
      } else if (s.state === "connecting" && state === "live") {
        state = "connecting";
      }
    });
    el.className = "live live-" + state;
    el.dataset.state = state;
    if (state === "down" && ended) {
      el.textContent = "disconnected (session ended: reload to log in)";
      el.title = "Live updates stopped: your session ended";
    } else if (state === "down") {
      el.textContent = "reconnecting since " + clock.format(since);
      el.title = "Live updates interrupted at " + clock.format(since) + " (" + zone + "); retrying automatically";
    } else {
      el.textContent = state === "live" ? "live" : "connecting…";
      el.title = state === "live" ? "Live updates connected" : "";
    }
    el.dataset.since = since ? since.toISOString() : "";
    document.dispatchEvent(new CustomEvent("fabricpool:live", { detail: { state: state, since: since, text: el.textContent } }));
  }

  function mark(name, state, code) {
    var s = sockets[name] || (sockets[name] = { state: "connecting", since: null, ended: false });
    if (state === "down") {
      if (s.since === null) s.since = new Date();
      s.ended = code === CLOSE_UNAUTHENTICATED;
    } else {
      s.since = null;
      s.ended = false;
    }
    s.state = state;
    render();
  }

  function forget(name) {
    delete sockets[name];
    render();
  }

  // One self-healing socket: `ready(message)` says whether a message means "up" (then the
  // backoff resets); handle(message, socket) gets every message.
  function resilient(name, path, handle, ready) {
    var socket = null, delay = MIN_DELAY, pingTimer = null, pongTimer = null, retryTimer = null, closed = false;

    function stopTimers() {
      clearInterval(pingTimer);
      clearTimeout(pongTimer);
    }

    function drop() {
      stopTimers();
      if (socket) {
        socket.onclose = socket.onmessage = socket.onopen = null;
        try { socket.close(); } catch (e) { /* already closed */ }
        socket = null;
      }
    }

    function lost(code) {
      drop();
      if (closed) return;
      if (code === CLOSE_NOT_FOUND || code === CLOSE_NO_ROLE) {
        // Retrying cannot help; the page says why (its own handler got the error message).
        forget(name);
        return;
      }
      mark(name, "down", code);
      // Jitter spreads the reconnects of many dashboards after a server restart.
      retryTimer = setTimeout(connect, delay * (0.5 + Math.random() / 2));
      delay = Math.min(delay * 2, MAX_DELAY);
    }

    function ping() {
      if (!socket || socket.readyState !== WebSocket.OPEN) return;
      socket.send(JSON.stringify({ type: "ping" }));
      clearTimeout(pongTimer);
      // A silently dead connection (sleeping laptop, dropped NAT entry) never fires close.
      pongTimer = setTimeout(function () { lost(null); }, PONG_WITHIN);
    }

    function connect() {
      try {
        socket = new WebSocket(wsUrl(path));
      } catch (e) {
        lost(null);
        return;
      }
      socket.onopen = function () { pingTimer = setInterval(ping, PING_EVERY); };
      socket.onmessage = function (event) {
        var message;
        try { message = JSON.parse(event.data); } catch (e) { return; }
        if (message.type === "pong") {
          clearTimeout(pongTimer);
          return;
        }
        if (ready(message)) {
          delay = MIN_DELAY;
          mark(name, "live");
        }
        handle(message);
      };
      socket.onclose = function (event) { lost(event.code); };
    }

    mark(name, "connecting");
    connect();
    return {
      send: function (message) {
        if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify(message));
      },
      close: function () {
        closed = true;
        clearTimeout(retryTimer);
        drop();
        forget(name);
      },
    };
  }

  var counter = 0;

  function subscribe(path, handlers) {
    var seq = null, waiting = false;
    var conn = resilient("view" + (++counter) + ":" + path, path, function (message) {
      if (message.type === "snapshot") {
        seq = message.seq;
        waiting = false;
        if (handlers.onSnapshot) handlers.onSnapshot(message.data, message.seq);
      } else if (message.type === "delta") {
        if (waiting) return;  // a fresh snapshot is on its way
        if (seq === null || message.since !== seq) {
          waiting = true;
          conn.send({ type: "resync" });
          return;
        }
        seq = message.seq;
        if (handlers.onDelta) handlers.onDelta(message.changes, message.seq);
      } else if (message.type === "error" && handlers.onError) {
        handlers.onError(message.message);
      }
    }, function (message) { return message.type === "snapshot"; });
    return {
      resync: function () { waiting = true; conn.send({ type: "resync" }); },
      close: conn.close,
    };
  }

  // Apply one kind's changes to an object keyed like the snapshot (null removes the key).
  function applyKeyed(target, changes) {
    Object.keys(changes || {}).forEach(function (key) {
      if (changes[key] === null) delete target[key];
      else target[key] = changes[key];
    });
    return target;
  }

  window.FabricPoolLive = { subscribe: subscribe, applyKeyed: applyKeyed };

  if (el) {
    resilient("heartbeat", el.dataset.url, function () {}, function (message) { return message.type === "hello"; });
  }
})();

// Pages with a #live-banner (queue, heatmap) call this: while the live connection is down the
// banner says so in plain words, with since when; the live views catch up by themselves when
// it is back (a fresh snapshot on reconnect).
function liveBanner() {
  "use strict";
  var banner = document.getElementById("live-banner");
  if (!banner) return;
  var clock = new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false });
  var since = null;
  document.addEventListener("fabricpool:live", function (event) {
    var state = event.detail && event.detail.state;
    if (state === "down") {
      if (since === null) since = new Date();
      banner.textContent = "Live updates interrupted since " + clock.format(since) + ": reconnecting… " +
        "What you see may be out of date; it catches up by itself when the connection is back.";
      banner.hidden = false;
    } else if (state === "live" && since !== null) {
      since = null;
      banner.hidden = true;
    }
    banner.dataset.state = state || "";
  });
}
