// The live connection indicator in the top bar. Connects to the heartbeat websocket, shows
// "live" or "disconnected since HH:MM:SS" (browser time zone) and reconnects with jittered
// exponential backoff. Pages that stream data listen for the "fabricpool:live" event and
// reload their snapshot when it says "live" again: messages sent while away are lost.
(function () {
  "use strict";
  var el = document.getElementById("live-status");
  if (!el || !("WebSocket" in window)) return;

  var MIN_DELAY = 1000, MAX_DELAY = 30000;
  var PING_EVERY = 25000, PONG_WITHIN = 10000;
  var CLOSE_UNAUTHENTICATED = 4401;
  var url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + el.dataset.url;
  var clock = new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false });
  var socket = null, delay = MIN_DELAY, downSince = null, pingTimer = null, pongTimer = null;

  function show(state, text, title) {
    el.className = "live live-" + state;
    el.dataset.state = state;
    el.textContent = text;
    el.title = title || "";
    document.dispatchEvent(new CustomEvent("fabricpool:live", { detail: { state: state } }));
  }

  function stopTimers() {
    clearInterval(pingTimer);
    clearTimeout(pongTimer);
  }

  function lost(code) {
    stopTimers();
    if (socket) {
      socket.onclose = socket.onmessage = socket.onopen = null;
      try { socket.close(); } catch (e) { /* already closed */ }
      socket = null;
    }
    if (downSince === null) downSince = new Date();
    var note = code === CLOSE_UNAUTHENTICATED ? " (session ended: reload to log in)" : "";
    show("down", "disconnected since " + clock.format(downSince) + note, "Reconnecting automatically");
    // Jitter spreads the reconnects of many dashboards after a server restart.
    setTimeout(connect, delay * (0.5 + Math.random() / 2));
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
      socket = new WebSocket(url);
    } catch (e) {
      lost(null);
      return;
    }
    socket.onopen = function () { pingTimer = setInterval(ping, PING_EVERY); };
    socket.onmessage = function (event) {
      var message;
      try { message = JSON.parse(event.data); } catch (e) { return; }
      if (message.type === "hello") {
        delay = MIN_DELAY;
        downSince = null;
        show("live", "live", "Live updates connected");
      } else if (message.type === "pong") {
        clearTimeout(pongTimer);
      }
    };
    socket.onclose = function (event) { lost(event.code); };
  }

  show("connecting", "connecting…");
  connect();
})();
