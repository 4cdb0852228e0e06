"""The overview, topology, pool and host pages live, end to end: the real ASGI server (daphne),
the real Redis channel layer and Chromium. A poll round (pool.ingest, as a worker applies it)
and a job submission with its cycle change the pages without a reload: the overview's
numbers and utilization chart, the topology's host colours (Plotly.restyle), the pool list's
rows, the host page's GPU table and charts. The plots' information is reachable by keyboard.
Screenshots are kept in docs/screenshots/.

Every Django process (daphne, the setup, the polls) runs in a subprocess on one SQLite file
under a temporary directory, with Redis keys (DB 1, a prefix of the run's own)."""
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import redis
from tests.servers import running_daphne


# Slow: four Django subprocesses and daphne's start take most of its ~90 s.
pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOTS = ROOT / "docs" / "screenshots"
PASSWORD = "live-pages-password-1"

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
User.objects.create_user("vera", password={PASSWORD!r}).groups.add(Group.objects.get(name="viewer"))
"""

# A poll round as a worker applies it: every host reports; its GPUs at `util` %.
POLL = """
import time
from pool import ingest
from pool.models import Host
from tests.pool.test_ingest import gpu, ok
hosts = list(Host.objects.filter(fabric__name="live").order_by("name"))
util = {util!r}
ingest.apply_results([ok(h, gpus=[gpu(i, utilization_pct=util.get(h.name, 5.0), temperature_c=40.0 + util.get(h.name, 5.0) / 4)
                                  for i in range(4)]) for h in hosts])
"""

# What a link health check (fabric.tasks.check_link_health in a worker) leaves behind.
LINK_DOWN = """
from celery.signals import task_postrun
from fabric import tasks
from fabric.models import Link
link = Link.objects.filter(kind="switch_switch").order_by("key").first()
Link.objects.filter(pk=link.pk).update(state="down", state_reason="port went down")
task_postrun.send(sender=tasks.check_link_health, task_id="t", task=tasks.check_link_health, args=(), kwargs={},
                  retval={}, state="SUCCESS")
"""

SUBMIT_AND_CYCLE = """
from scheduler import cycle, services
services.submit_job(None, tenant="physics", pool="main", gpus=4, command=["train"], name="live-pages")
cycle.run_cycle()
"""


@pytest.fixture
def server(tmp_path):
    """daphne on a free port over a fresh SQLite database; yields (base URL, manage(code))."""
    if shutil.which("chromium") is None:
        pytest.skip("no chromium on this machine")
    pytest.importorskip("playwright.sync_api")
    tag = uuid.uuid4().hex[:10]
    redis_url = "redis://127.0.0.1:6379/1"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings.test", "FABRICPOOL_VAR_DIR": str(tmp_path),
           "REDIS_URL": redis_url, "LIVE_KEY_PREFIX": f"test-pages-{tag}:", "LOG_LEVEL": "WARNING"}
    env.pop("DATABASE_URL", None)

    def manage(code, timeout=120):
        done = subprocess.run([sys.executable, "manage.py", "shell", "-c", code], check=False, cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env,
                   check=True, timeout=300)
    manage(SETUP + POLL.format(util={}))  # the pages start from one round of readings
    try:
        with running_daphne(tmp_path, env) as base:
            yield base, manage
    finally:
        client = redis.Redis.from_url(redis_url)
        keys = list(client.scan_iter(f"test-pages-{tag}:*"))
        if keys:
            client.delete(*keys)


def _live(page):
    page.wait_for_function("document.getElementById('live-status').dataset.state === 'live'", timeout=15000)
    page.evaluate("window.__notReloaded = true")


def _tab_to(page, predicate, limit=80):
    """Press Tab until the focused element satisfies `predicate` (JS, `el` is the element)."""
    for _ in range(limit):
        page.keyboard.press("Tab")
        if page.evaluate(f"(() => {{ const el = document.activeElement; return !!({predicate}); }})()"):
            return page.evaluate("document.activeElement.outerHTML.slice(0, 200)")
    raise AssertionError(f"Tab never reached {predicate}")


def test_overview_topology_pool_and_host_pages_follow_the_cluster_live(server):
    from playwright.sync_api import sync_playwright

    base, manage = server
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium",
                                    args=["--no-sandbox", "--disable-background-networking"])
        try:
            # bypass_csp: Playwright's wait_for_function evaluates its text in the page, which the
            # dashboard's CSP (core/security.py) forbids; the pages' own scripts are static files.
            context = browser.new_context(viewport={"width": 1400, "height": 1000}, bypass_csp=True)
            errors = []
            context.on("page", lambda page: page.on("pageerror", lambda exc: errors.append(str(exc))))
            login = context.new_page()
            login.goto(base + "/login/")
            login.fill('input[name="username"]', "vera")
            login.fill('input[name="password"]', PASSWORD)
            login.click('form button[type="submit"]')
            login.wait_for_load_state()

            overview = login
            overview.goto(base + "/")
            topo = context.new_page()
            topo.goto(base + "/topology/?fabric=live")
            topo.wait_for_function("document.getElementById('topology-graph').dataset.live === '1'", timeout=15000)
            pool = context.new_page()
            pool.goto(base + "/pool/")
            host = context.new_page()
            host.goto(base + "/pool/hosts/gpu0001/")
            for page in (overview, topo, pool, host):
                _live(page)
            assert overview.locator('[data-live="jobs.proposed"]').inner_text() == "0"
            points = int(overview.get_attribute("#utilization-chart", "data-points"))
            colour = "(() => { const gd = document.getElementById('topology-graph');"\
                     " const t = gd.data.find(t => t.name === 'hosts'); const d = JSON.parse(document.getElementById('topology-data').textContent);"\
                     " return t.marker.color[d.hosts.name.indexOf('gpu0001')]; })()"
            before = topo.evaluate(colour)
            host_points = host.evaluate("document.getElementById('chart-gpu-utilization').data[0].x.length")

            # A poll round: gpu0001 busy, the others a little busier.
            started = time.perf_counter()
            manage(POLL.format(util={"gpu0001": 97.0, "gpu0002": 30.0}))
            polled = time.perf_counter()
            topo.wait_for_function(f"{colour} !== {before!r}", timeout=10000)
            host.wait_for_function(f"document.getElementById('chart-gpu-utilization').data[0].x.length === {host_points + 1}",
                                   timeout=10000)
            overview.wait_for_function(f"Number(document.getElementById('utilization-chart').dataset.points) > {points}",
                                       timeout=10000)
            pool.wait_for_function("document.querySelector('#host-table tbody .host-util').textContent.trim() === '97 %'",
                                   timeout=10000)
            seen = time.perf_counter()
            assert host.locator('#gpus-title ~ div tbody tr .gpu-util').first.inner_text() == "97 %"
            assert host.locator("td[data-gpu-id] .gpu-busy").count() == 4
            assert host.locator(".stat", has_text="GPUs busy / present").locator("dd").inner_text() == "4 / 4"
            assert pool.locator("#host-table tbody .host-busy").first.inner_text() == "4"
            # The hover text follows the colour (restyle, not a new plot: the page kept its state).
            hover = topo.evaluate("(() => { const gd = document.getElementById('topology-graph');"
                                  " return gd.data.find(t => t.name === 'hosts').text.find(t => t.includes('gpu0001')); })()")
            assert "mean util. 97 %" in hover and "GPUs busy 4 / 4" in hover

            # A job and its cycle: the overview's queue and GPU numbers; then a link goes down.
            manage(SUBMIT_AND_CYCLE + LINK_DOWN)
            overview.wait_for_function("document.querySelector('[data-live=\"jobs.proposed\"]').textContent === '1'",
                                       timeout=10000)
            row = overview.locator("#gpus-by-pool tbody tr", has_text="main")
            overview.wait_for_function(
                "document.querySelector('#gpus-by-pool tbody tr').cells[2].textContent === '4'", timeout=10000)
            assert row.locator("td").nth(1).locator("a").get_attribute("href") == "/scheduler/jobs/?pool=main"
            assert row.locator("td").nth(3).inner_text() == "12"  # 16 GPUs, 4 allocated
            assert overview.locator("#last-cycle a").get_attribute("href").startswith("/scheduler/cycles/")
            topo.wait_for_function("document.getElementById('topology-graph').data.some(t => t.name === 'down (1)')",
                                   timeout=10000)
            names = topo.evaluate("document.getElementById('topology-graph').data.map(t => t.name)")
            assert "up (7)" in names and "links not up" in names  # the segment moved; a marker says why
            assert topo.locator("#topology-link-legend").inner_text().split("\n") == ["up: 7 links", "down: 1 link"]
            overview.wait_for_function("document.querySelector('#fabric-table a[href$=\"?state=down\"]').textContent === '1'",
                                       timeout=10000)
            for page in (overview, topo, pool, host):
                assert page.evaluate("window.__notReloaded === true")
                assert page.locator("#live-status").inner_text() == "live"

            overview.screenshot(path=str(SCREENSHOTS / "overview.png"), full_page=True)
            topo.screenshot(path=str(SCREENSHOTS / "topology-live.png"), full_page=True)
            pool.screenshot(path=str(SCREENSHOTS / "pool.png"), full_page=True)
            host.screenshot(path=str(SCREENSHOTS / "host.png"), full_page=True)

            # Keyboard: Tab reaches the drawing, then its table; Enter opens it; Tab reaches a host link.
            topo.reload()
            topo.wait_for_function("document.getElementById('topology-graph').dataset.live === '1'", timeout=15000)
            _tab_to(topo, "el.id === 'topology-graph'")
            assert topo.evaluate("getComputedStyle(document.activeElement).outlineStyle") != "none"  # a visible focus ring
            _tab_to(topo, "el.id === 'topology-table-summary'")
            topo.keyboard.press("Enter")
            topo.wait_for_selector("#topology-host-rows a")  # built when the table opens
            assert topo.evaluate("document.activeElement.id") == "topology-table-summary"
            reached = _tab_to(topo, "el.closest('#topology-host-rows') && el.tagName === 'A'")
            assert 'href="/pool/hosts/' in reached
            topo.keyboard.press("Enter")
            topo.wait_for_url(base + "/pool/hosts/**")
            _tab_to(overview, "el.id === 'utilization-chart'")
            assert errors == []
            print(f"\npoll round seen on all four pages {seen - polled:.2f} s after its subprocess returned "
                  f"({polled - started:.2f} s for the subprocess)")
        finally:
            browser.close()
