"""static/js/live.js in node with a fake browser (tests/live/live_js_harness.js): snapshot then
deltas, a sequence hole turns into a resync, a drop shows "reconnecting since" and reconnects
to a fresh snapshot. Skipped where node is not installed (the browser tests cover it there)."""
import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NODE = shutil.which("node")


@pytest.fixture(scope="module")
def run_js():
    if NODE is None:
        pytest.skip("node is not installed")
    out = subprocess.run([NODE, str(ROOT / "tests/live/live_js_harness.js"), str(ROOT / "static/js/live.js")],
                         capture_output=True, text=True, timeout=30, check=True)
    return json.loads(out.stdout)


def test_snapshot_then_deltas_and_a_hole_asks_for_a_resync(run_js):
    assert run_js["seen"] == [
        ["snapshot", 5, {"jobs": {"1": {"n": 1}}}],
        ["delta", 7, {"jobs": {"1": None, "2": {"n": 2}}}],
        # since 9 did not follow 7: not applied, nor what came before the fresh snapshot
        ["snapshot", 11, {"jobs": {"2": {"n": 2}}}],
        ["snapshot", 12, {"jobs": {}}],  # after the reconnect
    ]
    assert run_js["first_sent"] == [{"type": "resync"}]
    assert run_js["urls"] == ["ws://localhost:8000/ws/heartbeat/", "ws://localhost:8000/ws/live/queue/",
                              "ws://localhost:8000/ws/live/queue/"]


def test_the_indicator_shows_each_connection_state(run_js):
    steps = run_js["steps"]
    assert steps["loaded"]["indicator"] == "connecting…"
    assert steps["heartbeat_hello"]["indicator"] == "live"
    assert steps["subscribed"]["state"] == "connecting"  # the view is not live yet
    assert steps["resynced"]["indicator"] == "live"
    assert steps["dropped"]["state"] == "down"
    assert steps["dropped"]["indicator"].startswith("reconnecting since ")
    assert steps["reconnected"]["indicator"] == "live" and steps["reconnected"]["sockets"] == 3
    assert steps["closed"]["indicator"] == "live"  # a closed view no longer counts


def test_apply_keyed_sets_and_removes_keys(run_js):
    assert run_js["keyed"] == {"2": "b", "3": "c"}
