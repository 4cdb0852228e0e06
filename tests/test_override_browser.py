"""In real Chromium against daphne and a private Redis (a redis-server of this test on a free
port, never the shared one): an operator picks GPUs for an override on the GPU heatmap (by
mouse on the cells and by keyboard in the GPU list), a bad pick is refused with its reason
and Confirm stays disabled, a good one shows its cost next to the proposal's and is
confirmed, while a second operator's Scheduler page follows the decision live; a pick on a
proposal another operator rejected meanwhile is refused with what happened; a viewer sees
no pick controls and the endpoints refuse her. Then Redis is stopped under open pages: they
say plainly they are reconnecting and since when, and once Redis is back they catch up with
a job submitted while it was down, without a reload.

Every Django process (daphne, the setup) runs in a subprocess on one SQLite file under a
temporary directory."""
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from tests.servers import running_daphne

from tests.test_live_flow import _free_port, _live, _log_in

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOTS = ROOT / "docs" / "screenshots"
PASSWORD = "live-flow-password-1"  # _log_in's

SETUP = f"""
import json
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from pool.models import Gpu, Host, Pool
from scheduler import cycle, services
from scheduler.models import Placement, PlacementGpu, PoolPolicy, Tenant
from scheduler.selectors import host_leaves
call_command("build_fattree", "--fabric", "pick", "--spines", "2", "--leaves", "2", "--hosts-per-leaf", "2",
             "--gpus-per-host", "4", "--speed", "EDR", verbosity=0)
pool, _ = Pool.objects.get_or_create(name="main")
Host.objects.filter(fabric__name="pick").update(pool=pool, state=Host.State.UP)
for gpu in Gpu.objects.all():  # readings, so that the heatmap has colours
    Gpu.objects.filter(pk=gpu.pk).update(utilization=(gpu.pk * 37) % 100, temperature_c=40 + gpu.pk % 30)
PoolPolicy.objects.create(pool=pool, mode=PoolPolicy.Mode.MANUAL)
Tenant.objects.create(name="physics")
for name in ("alice", "bob"):
    User.objects.create_user(name, password={PASSWORD!r}).groups.add(Group.objects.get(name="operator"))
User.objects.create_user("vera", password={PASSWORD!r}).groups.add(Group.objects.get(name="viewer"))
jobs = [services.submit_job(None, tenant="physics", pool="main", gpus=4, command=["train"], name=n)
        for n in ("alpha", "beta")]
assert cycle.run_cycle().ok
held = set(PlacementGpu.objects.filter(active=True).values_list("gpu__host_id", flat=True))
leaves = host_leaves(list(Host.objects.values_list("id", flat=True)))
out = {{"placements": [], "free_hosts": []}}
for job in jobs:
    p = Placement.objects.get(job=job, state=Placement.State.PROPOSED)
    host = p.placement_gpus.first().gpu.host
    out["placements"].append({{"id": p.pk, "job": job.pk, "host": host.name, "leaf": str(leaves[host.pk]),
                              "gpus": sorted(p.placement_gpus.values_list("gpu_id", flat=True))}})
for host in Host.objects.exclude(id__in=held).order_by("name"):
    gpus = list(Gpu.objects.filter(host=host).order_by("index").values_list("id", flat=True))
    out["free_hosts"].append({{"name": host.name, "leaf": str(leaves[host.pk]), "gpus": gpus}})
print(json.dumps(out))
"""

SUBMIT = """
from scheduler import services
job = services.submit_job(None, tenant="physics", pool="main", gpus=64, command=["eval"], name="{name}")
print(job.pk)
"""

STATE = """
from scheduler.models import Placement
print(Placement.objects.get(pk={pk}).state)
"""


class PrivateRedis:
    """A redis-server of this test on a free port (nothing saved); stop() and start() again
    on the same port."""

    def __init__(self, directory: Path):
        self.port = _free_port()
        self.directory = directory
        self.proc = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self):
        self.proc = subprocess.Popen(
            [shutil.which("redis-server"), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.directory), "--logfile", str(self.directory / "redis.log")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not self.answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)

    def answers(self) -> bool:
        try:
            return redis.Redis(port=self.port, socket_connect_timeout=0.5).ping()
        except redis.RedisError:
            return False

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """daphne on a free port, on a fresh SQLite database and a private Redis; yields
    (base URL, manage(code), the PrivateRedis, what SETUP printed). One for the module (a
    migrate and a daphne start are most of a test's time); the Redis test runs last."""
    tmp_path = tmp_path_factory.mktemp("override-browser")
    if shutil.which("chromium") is None or shutil.which("redis-server") is None:
        pytest.skip("needs chromium and redis-server on this machine")
    pytest.importorskip("playwright.sync_api")
    redis_server = PrivateRedis(tmp_path)
    redis_server.start()
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings.test", "FABRICPOOL_VAR_DIR": str(tmp_path),
           "REDIS_URL": redis_server.url, "LOG_LEVEL": "WARNING"}
    env.pop("DATABASE_URL", None)

    def manage(code, timeout=120):
        done = subprocess.run([sys.executable, "manage.py", "shell", "-c", code], check=False, cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout.strip().splitlines()[-1]

    try:
        subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env,
                       check=True, timeout=300)
        scene = json.loads(manage(SETUP))
        with running_daphne(tmp_path, env) as base:
            yield base, manage, redis_server, scene
    finally:
        redis_server.stop()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path="/usr/bin/chromium",
                                     args=["--no-sandbox", "--disable-background-networking"])
        try:
            yield chromium
        finally:
            chromium.close()


def _page(browser, base, user, errors):
    page = browser.new_context(viewport={"width": 1500, "height": 950}).new_page()
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    _log_in(page, base, user)
    return page


def _click_cell(page, gpu_id):
    """A real mouse click on the heatmap cell of `gpu_id` (its column and row from #pick-data)."""
    x, y = page.evaluate("""(id) => {
        const pick = JSON.parse(document.getElementById('pick-data').textContent);
        let col = -1, row = -1;
        pick.cells.forEach((r, ri) => r.forEach((v, ci) => { if (v === id) { col = ci; row = ri; } }));
        const gd = document.getElementById('heatmap-graph'), box = gd.getBoundingClientRect();
        const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
        return [box.left + xa._offset + xa.l2p(col), box.top + ya._offset + ya.l2p(row)];
    }""", gpu_id)
    # As a person does: the pointer rests on the cell (plotly's click needs its hover), then clicks.
    page.mouse.move(x, y)
    page.wait_for_function("document.querySelector('#heatmap-graph .hoverlayer').childElementCount > 0", timeout=5000)
    page.mouse.click(x, y)


def _checked(page, n):
    """Wait until the dry run of the n-th change answered."""
    page.wait_for_function(f"+document.getElementById('pick-panel').dataset.checked >= {n}", timeout=10000)


def _toggle_by_keyboard(page, gpu_id):
    page.focus(f'#pick-list input[data-gpu="{gpu_id}"]')
    page.keyboard.press("Space")


def test_an_override_picked_on_the_heatmap_is_checked_refused_and_confirmed(stack, browser):
    base, manage, _redis, scene = stack
    alpha, beta = scene["placements"]
    free = scene["free_hosts"]
    errors = []
    alice = _page(browser, base, "alice", errors)
    bob = _page(browser, base, "bob", errors)
    vera = _page(browser, base, "vera", errors)
    bob.goto(base + "/scheduler/")
    _live(bob)
    bob.evaluate("window.__notReloaded = true")

    # The viewer sees the proposal outlined, no controls, and the endpoints refuse her.
    vera.goto(base + f"/heatmap/?pick={alpha['id']}")
    vera.wait_for_function("document.getElementById('heatmap-graph').dataset.proposal !== undefined", timeout=15000)
    assert vera.evaluate("document.getElementById('heatmap-graph').data[2].x.length") == 4
    assert vera.locator("#pick-confirm, #pick-list input").count() == 0
    assert "Only operators and admins may override placements" in vera.locator("#pick-panel").inner_text()
    statuses = vera.evaluate("""async (urls) => {
        const token = document.getElementById('pick-panel').dataset.csrf, out = [];
        for (const url of urls) {
            const headers = {'Content-Type': 'application/json', 'X-CSRFToken': token};
            const r = await fetch(url, {method: 'POST', headers: headers,
                                       body: JSON.stringify({gpus: [1, 2, 3, 4], version: 1})});
            out.push(r.status);
        }
        return out;
    }""", [f"/scheduler/placements/{alpha['id']}/override/check/",
           f"/scheduler/placements/{alpha['id']}/override/confirm/"])
    assert statuses == [403, 403]

    # From the Scheduler page to the heatmap in pick mode; the proposal is the starting pick.
    alice.goto(base + "/scheduler/")
    alice.get_by_role("link", name=f"Pick GPUs for placement {alpha['id']} on the heatmap").click()
    alice.wait_for_url(re.compile(rf"/heatmap/\?pick={alpha['id']}$"))
    _checked(alice, 1)
    graph = "document.getElementById('heatmap-graph')"
    assert alice.evaluate(f"{graph}.data[2].x.length") == 4  # the proposal, outlined
    assert alice.evaluate(f"{graph}.dataset.picked") == ",".join(map(str, alpha["gpus"]))
    assert alice.locator("#pick-confirm").is_enabled()

    # A click on a GPU of the other proposal: refused with the reason, Confirm disabled.
    _click_cell(alice, beta["gpus"][0])
    alice.wait_for_selector("#pick-problems:not([hidden])", timeout=10000)
    _checked(alice, 2)
    problems = alice.locator("#pick-problems").inner_text()
    assert f"is held by job {beta['job']} (proposed)" in problems
    assert "The job needs exactly 4 GPUs (gang); 5 were chosen." in problems
    assert alice.locator("#pick-confirm").is_disabled()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    alice.screenshot(path=str(SCREENSHOTS / "override-pick-refused.png"), full_page=True)

    # By keyboard in the GPU list: take that GPU out, swap two of the proposal's GPUs for two
    # of a free host under the other leaf switch.
    alice.click("#pick-list summary")
    other = next(h for h in free if h["leaf"] != alpha["leaf"])
    changes = [beta["gpus"][0], alpha["gpus"][2], alpha["gpus"][3], other["gpus"][0], other["gpus"][1]]
    for gpu in changes:
        _toggle_by_keyboard(alice, gpu)
    alice.wait_for_function("document.getElementById('pick-confirm').disabled === false", timeout=10000)
    picked = sorted(alpha["gpus"][:2] + other["gpus"][:2])
    assert alice.evaluate(f"{graph}.dataset.picked") == ",".join(map(str, picked))
    assert alice.evaluate(f"{graph}.data[3].x.length") == 4
    assert alice.locator("#pick-problems").is_hidden()
    rows = {r.locator("th").inner_text().split(" (")[0]: [c.inner_text() for c in r.locator("td").all()]
            for r in alice.locator("#pick-cost tbody tr").all()}
    assert rows["hosts"] == ["1", "2"] and rows["leaf switches"] == ["1", "2"]
    alice.screenshot(path=str(SCREENSHOTS / "override-pick.png"), full_page=True)

    alice.click("#pick-confirm")
    alice.wait_for_url(re.compile(rf"/scheduler/placements/{alpha['id']}/$"))
    assert "overridden with the 4 GPUs you picked" in alice.locator("main").inner_text()
    # Bob's Scheduler page follows the decision without a reload.
    row = f'#proposal-table tbody tr[data-placement="{alpha["id"]}"]'
    if manage(STATE.format(pk=alpha["id"])) == "proposed":  # the pool's policy wants a second look
        bob.wait_for_selector(row + ' .state:has-text("override")', timeout=10000)
    else:
        bob.wait_for_selector(row, state="detached", timeout=10000)
    assert bob.evaluate("window.__notReloaded === true")

    # A proposal that changes while it is being picked: Bob rejects it, Alice's Confirm is
    # refused with what happened.
    alice.goto(base + f"/heatmap/?pick={beta['id']}")
    _checked(alice, 1)
    assert alice.locator("#pick-confirm").is_enabled()
    bob_row = f'#proposal-table tbody tr[data-placement="{beta["id"]}"]'
    bob.locator(bob_row).get_by_label(f"Why placement {beta['id']} is rejected").fill("not now")
    bob.get_by_role("button", name=f"Reject placement {beta['id']}").click()
    bob.wait_for_load_state()
    alice.click("#pick-confirm")
    alice.wait_for_function("document.getElementById('pick-status').textContent.includes('Nothing was changed')",
                            timeout=10000)
    problems = alice.locator("#pick-problems").inner_text()
    assert f"Placement {beta['id']} changed under you: it is now rejected" in problems
    assert alice.locator("#pick-confirm").is_disabled()
    assert manage(STATE.format(pk=beta["id"])) == "rejected"
    assert errors == []


@pytest.mark.slow  # waits out the reconnect backoff twice
def test_pages_say_they_are_reconnecting_while_redis_is_down_and_catch_up(stack, browser):
    base, manage, redis_server, _scene = stack
    errors = []
    queue = _page(browser, base, "alice", errors)
    queue.goto(base + "/scheduler/")
    heat = queue.context.new_page()
    heat.on("pageerror", lambda exc: errors.append(str(exc)))
    heat.goto(base + "/heatmap/?fabric=pick")
    for page in (queue, heat):
        _live(page)
        page.evaluate("window.__notReloaded = true")
        assert page.locator("#live-banner").is_hidden()

    redis_server.stop()
    for page in (queue, heat):
        page.wait_for_selector("#live-banner:not([hidden])", timeout=30000)
        text = page.locator("#live-banner").inner_text()
        assert re.search(r"Live updates interrupted since \d\d:\d\d:\d\d: reconnecting", text), text
    queue.screenshot(path=str(SCREENSHOTS / "reconnecting.png"))

    # A change made while Redis is down: its live message is lost; a snapshot of a reconnect
    # brings it.
    job = manage(SUBMIT.format(name="while-redis-was-down"))
    redis_server.start()
    queue.wait_for_selector(f'#queue-table tbody tr[data-job="{job}"]', timeout=45000)
    for page in (queue, heat):
        page.wait_for_selector("#live-banner", state="hidden", timeout=45000)
        _live(page)
    assert "while-redis-was-down" in queue.locator(f'#queue-table tbody tr[data-job="{job}"]').inner_text()
    # And the live path works again: the next change arrives as a delta.
    job = manage(SUBMIT.format(name="after-redis-came-back"))
    queue.wait_for_selector(f'#queue-table tbody tr[data-job="{job}"]', timeout=15000)
    for page in (queue, heat):
        assert page.evaluate("window.__notReloaded === true")
        assert page.locator("#live-banner").is_hidden()
    assert errors == []
