// Runs static/js/live.js in node with a fake browser (WebSocket, timers, DOM element) through
// one scenario and prints what the page saw as JSON; tests/live/test_live_js.py checks it.
"use strict";
const fs = require("fs");
const vm = require("vm");

let now = 0, timers = [], nextId = 1;
function setTimeout_(fn, ms) { const id = nextId++; timers.push({ id, at: now + (ms || 0), fn }); return id; }
function setInterval_(fn, ms) { const id = nextId++; timers.push({ id, at: now + ms, fn, every: ms }); return id; }
function clear(id) { timers = timers.filter((t) => t.id !== id); }
function advance(ms) {
  const end = now + ms;
  for (;;) {
    timers.sort((a, b) => a.at - b.at);
    const t = timers[0];
    if (!t || t.at > end) break;
    now = t.at;
    if (t.every) t.at += t.every; else timers.shift();
    t.fn();
  }
  now = end;
}

const sockets = [];
class FakeSocket {
  constructor(url) { this.url = url; this.readyState = 0; this.sent = []; sockets.push(this); }
  send(text) { this.sent.push(JSON.parse(text)); }
  close() { this.readyState = 3; }
  open() { this.readyState = 1; if (this.onopen) this.onopen(); }
  receive(message) { this.onmessage({ data: JSON.stringify(message) }); }
  drop(code) { this.readyState = 3; this.onclose({ code }); }
}
FakeSocket.OPEN = 1;

const el = { dataset: { url: "/ws/heartbeat/" }, className: "", textContent: "", title: "" };
const window = {};
const context = {
  window, WebSocket: FakeSocket, setTimeout: setTimeout_, setInterval: setInterval_, clearTimeout: clear,
  clearInterval: clear, Intl, Math, JSON, Object, Date, location: { protocol: "http:", host: "localhost:8000" },
  CustomEvent: class { constructor(type, init) { this.type = type; this.detail = init.detail; } },
  document: { getElementById: (id) => (id === "live-status" ? el : null), dispatchEvent: () => true },
};
window.WebSocket = FakeSocket;
vm.createContext(context);
vm.runInContext(fs.readFileSync(process.argv[2], "utf8"), context);

const seen = [], steps = {};
const step = (name) => { steps[name] = { indicator: el.textContent, state: el.dataset.state, sockets: sockets.length }; };
step("loaded");
sockets[0].open();
sockets[0].receive({ type: "hello", user: "vera" });
step("heartbeat_hello");

const view = window.FabricPoolLive.subscribe("/ws/live/queue/", {
  onSnapshot: (data, seq) => seen.push(["snapshot", seq, data]),
  onDelta: (changes, seq) => seen.push(["delta", seq, changes]),
});
const first = sockets[1];
step("subscribed");
first.open();
first.receive({ type: "snapshot", seq: 5, data: { jobs: { "1": { n: 1 } } } });
first.receive({ type: "delta", since: 5, seq: 7, changes: { jobs: { "1": null, "2": { n: 2 } } } });
first.receive({ type: "delta", since: 9, seq: 10, changes: { jobs: { "3": { n: 3 } } } });  // 8..9 lost
first.receive({ type: "delta", since: 10, seq: 11, changes: { jobs: { "4": { n: 4 } } } });  // while resyncing
first.receive({ type: "snapshot", seq: 11, data: { jobs: { "2": { n: 2 } } } });
step("resynced");
first.drop(1006);
step("dropped");
advance(1100);  // the first retry comes within MIN_DELAY
const second = sockets[2];
second.open();
second.receive({ type: "snapshot", seq: 12, data: { jobs: {} } });
step("reconnected");
const keyed = window.FabricPoolLive.applyKeyed({ "1": "a", "2": "b" }, { "1": null, "3": "c" });
view.close();
step("closed");
console.log(JSON.stringify({ seen, steps, urls: sockets.map((s) => s.url), first_sent: first.sent, keyed }));
