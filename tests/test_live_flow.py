"""End to end through the real ASGI server (daphne), the real Redis channel layer and two
Chromium sessions: a job's proposal appears on both operators' Scheduler pages without a
reload, one approves it and the other sees it go, and the GPU heatmap marks the GPUs the
placement holds and follows a poll's readings, all without reloads.

Every Django process here (daphne, the setup, the cycle) runs in a subprocess on one SQLite
file under a temporary directory, with Redis keys (DB 9, a prefix of the run's own) that
nothing else reads."""
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import redis

from tests.servers import running_daphne

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOTS = ROOT / "docs" / "screenshots"
PASSWORD = "live-flow-password-1"
JOB_NAME = "<b>live-job</b>"  # must show as typed: rows are built with textContent

SETUP = f"""
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from pool.models import Host, Pool
from scheduler.models import PoolPolicy, Tenant
call_command("build_fattree", "--fabric", "live", "--spines", "2", "--leaves", "2", "--hosts-per-leaf", "2",
             "--gpus-per-host", "4", "--speed", "EDR", verbosity=0)
pool, _ = Pool.objects.get_or_create(name="main")
Host.objects.filter(fabric__name="live").update(pool=pool, state=Host.State.UP)
PoolPolicy.objects.create(pool=pool, mode=PoolPolicy.Mode.MANUAL)
Tenant.objects.create(name="physics")
for name in ("alice", "bob"):
    User.objects.create_user(name, password={PASSWORD!r}).groups.add(Group.objects.get(name="operator"))
User.objects.create_user("vera", password={PASSWORD!r}).groups.add(Group.objects.get(name="viewer"))
"""

SUBMIT_AND_CYCLE = f"""
import json
from scheduler import cycle, services
from scheduler.models import Placement
job = services.submit_job(None, tenant="physics", pool="main", gpus=4, command=["train"], name={JOB_NAME!r})
result = cycle.run_cycle()
p = Placement.objects.get(job=job, state=Placement.State.PROPOSED)
print(json.dumps({{"placement": p.pk, "gpus": list(p.placement_gpus.values_list("gpu_id", flat=True))}}))
"""

# What a poll round does after it stored new readings: the receivers publish what changed.
REPORT = """
from core import live_receivers
from pool.models import Gpu
ids = {ids}
Gpu.objects.filter(pk__in=ids).update(utilization=97.0, temperature_c=71.0)
live_receivers.publish_gpus(list(Gpu.objects.filter(pk__in=ids).values_list("host_id", flat=True).distinct()))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server(tmp_path):
    """daphne serving config.asgi on a free port, on a fresh SQLite database; yields
    (base URL, manage(code) running Django code in a subprocess with the same settings)."""
    if shutil.which("chromium") is None:
        pytest.skip("no chromium on this machine")
    pytest.importorskip("playwright.sync_api")
    tag = uuid.uuid4().hex[:10]
    redis_url = "redis://127.0.0.1:6379/9"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings.test", "FABRICPOOL_VAR_DIR": str(tmp_path),
           "REDIS_URL": redis_url, "LIVE_KEY_PREFIX": f"test-flow-{tag}:", "LOG_LEVEL": "WARNING"}
    env.pop("DATABASE_URL", None)  # SQLite in tmp_path whatever the suite runs on

    def manage(code, timeout=120):
        done = subprocess.run([sys.executable, "manage.py", "shell", "-c", code], check=False, cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env,
                   check=True, timeout=300)
    manage(SETUP)
    try:
        with running_daphne(tmp_path, env) as base:
            yield base, manage
    finally:
        client = redis.Redis.from_url(redis_url)
        keys = list(client.scan_iter(f"test-flow-{tag}:*"))
        if keys:
            client.delete(*keys)


def _log_in(page, base, username):
    page.goto(base + "/login/")
    page.fill('input[name="username"]', username)
    page.fill('input[name="password"]', PASSWORD)
    page.click('form button[type="submit"], form input[type="submit"]')
    page.wait_for_load_state()


def _live(page):
    """Wait for the page's live views to be connected (the top bar says "live")."""
    page.wait_for_function("document.getElementById('live-status').dataset.state === 'live'", timeout=15000)


def test_proposals_and_decisions_reach_every_browser_live(server):
    from playwright.sync_api import sync_playwright

    base, manage = server
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium",
                                    args=["--no-sandbox", "--disable-background-networking"])
        try:
            a = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
            context_b = browser.new_context(viewport={"width": 1400, "height": 900})
            b = context_b.new_page()
            errors = []
            viewer = browser.new_context().new_page()  # sees proposals, may not decide
            for page in (a, b, viewer):
                page.on("pageerror", lambda exc: errors.append(str(exc)))
            _log_in(a, base, "alice")
            _log_in(b, base, "bob")
            _log_in(viewer, base, "vera")
            heat = context_b.new_page()
            heat.on("pageerror", lambda exc: errors.append(str(exc)))
            heat.goto(base + "/heatmap/?fabric=live")
            heat.wait_for_function("document.getElementById('heatmap-graph').dataset.allocated === '0'", timeout=15000)
            for page in (a, b, viewer):
                page.goto(base + "/scheduler/")
                _live(page)
                assert page.locator("#proposal-table tbody tr").count() == 0
                page.evaluate("window.__notReloaded = true")
            heat.evaluate("window.__notReloaded = true")

            started = time.perf_counter()
            made = json.loads(manage(SUBMIT_AND_CYCLE).strip().splitlines()[-1])
            submitted = time.perf_counter()
            row = f'#proposal-table tbody tr[data-placement="{made["placement"]}"]'
            for page in (a, b, viewer):
                page.wait_for_selector(row, timeout=10000)
            appeared = time.perf_counter()
            # The job's name is text, not markup; bob may decide, so his row has the forms.
            assert b.locator(row).locator("td").nth(1).locator("a").inner_text() == JOB_NAME
            assert b.locator(row).get_by_role("button", name=f"Approve placement {made['placement']}").count() == 1
            assert b.locator(row + ' input[name="csrfmiddlewaretoken"]').count() == 2
            assert viewer.locator(row + " button, " + row + " form").count() == 0
            heat.wait_for_function("document.getElementById('heatmap-graph').dataset.allocated === '4'", timeout=10000)
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            b.screenshot(path=str(SCREENSHOTS / "queue-live.png"), full_page=True)

            decided = time.perf_counter()
            a.get_by_role("button", name=f"Approve placement {made['placement']}").click()
            a.wait_for_load_state()
            for page in (b, viewer):
                page.wait_for_selector(row, state="detached", timeout=10000)
            gone = time.perf_counter()
            assert b.locator("#proposals-empty").is_visible()

            # A poll round's readings for the placement's GPUs colour their cells in place.
            reported = time.perf_counter()
            manage(REPORT.format(ids=made["gpus"]))
            heat.wait_for_function(
                "(() => { const z = document.getElementById('heatmap-graph').data[0].z;"
                " return z.flat().filter(v => v === 97).length === 4; })()", timeout=10000)
            busy = time.perf_counter()
            for page in (b, heat):
                assert page.evaluate("window.__notReloaded === true")
            assert errors == []
            print(f"\nproposal shown in both browsers {appeared - submitted:.2f} s after the cycle's subprocess "
                  f"returned ({submitted - started:.2f} s submit+cycle); approval seen by the other browser after "
                  f"{gone - decided:.2f} s (click included); heatmap cells busy {busy - reported:.2f} s after the "
                  f"report (subprocess included)")
        finally:
            browser.close()
