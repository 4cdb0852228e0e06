"""Names with markup in them (a host, a switch description, a GPU model, a job, a tenant, a
pool, a link's reason) stay text everywhere: every URL of the project (found by the walk
of tests/test_auth.py) is fetched and no page holds the markup unescaped; JSON is served
as JSON with nosniff. Then a real Chromium, through daphne and Redis, opens the dashboard
pages with those names and proves that no script ran (no dialog), that nothing broke the
Content-Security-Policy (the live sockets connect, plotly draws), that every string given
to plotly.js arrived escaped, and that the hover box shows the names as typed."""
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
import uuid
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from .servers import running_daphne

from .test_auth import all_paths

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = "<script>alert(1)</script>"
IMG = '"><img src=x onerror=alert(2)>'
RAW = ["<script>alert(", "<img src=x onerror"]  # what must never reach a page as markup
ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"
HOST = "gpu0001" + IMG

# Django code run in-process (walk) or in the daphne test's subprocess (browser).
HOSTILE = f"""
from fabric.models import Fabric, Link, Switch
from pool.models import Gpu, Host, Pool
from scheduler.models import AllocationCycle, Job, Placement, PlacementGpu, Tenant
SCRIPT, IMG = {SCRIPT!r}, {IMG!r}
host = Host.objects.get(name="gpu0001")
pool = Pool.objects.create(name="p" + SCRIPT, description=IMG)
Host.objects.filter(fabric__name="t").update(pool=pool, state=Host.State.UP)
Host.objects.filter(pk=host.pk).update(name={HOST!r})
Gpu.objects.filter(host=host, index=0).update(model="H100 " + SCRIPT)
for leaf in Switch.objects.filter(fabric__name="t", tier="leaf"):
    Switch.objects.filter(pk=leaf.pk).update(description=leaf.description + SCRIPT)
link = Link.objects.filter(fabric__name="t", kind="switch_switch").order_by("key").first()
Link.objects.filter(pk=link.pk).update(state="degraded", state_reason="errors " + SCRIPT)
tenant = Tenant.objects.create(name="t" + SCRIPT, description=IMG)
running = Job.objects.create(tenant=tenant, pool=pool, gpus=2, command=["train"], name="run" + IMG, state="running")
placement = Placement.objects.create(job=running, state=Placement.State.RUNNING)
PlacementGpu.objects.bulk_create([PlacementGpu(placement=placement, gpu=g) for g in Gpu.objects.filter(host=host)[:2]])
waiting = Job.objects.create(tenant=tenant, pool=pool, gpus=1, command=["train"], name="wait" + SCRIPT)
cycle = AllocationCycle.objects.create()
proposal = Placement.objects.create(job=waiting, cycle=cycle, state=Placement.State.PROPOSED)
PlacementGpu.objects.create(placement=proposal, gpu=Gpu.objects.exclude(host=host).first())
"""


def build():
    call_command("build_fattree", "--fabric", "t", "--spines", "2", "--leaves", "2", "--hosts-per-leaf", "2",
                 "--gpus-per-host", "4", "--speed", "EDR", verbosity=0)
    scope = {}
    exec(HOSTILE, scope)  # noqa: S102 - our own constant, shared with the browser test
    return scope


@pytest.mark.django_db
def test_no_page_or_endpoint_shows_hostile_names_as_markup(client):
    from fabric.models import Switch

    objects = build()
    client.force_login(User.objects.create_user("root", password="unused-password-1", is_staff=True, is_superuser=True))
    leaf = Switch.objects.filter(fabric__name="t", tier="leaf").first()
    fill = {"name": "t", "guid": leaf.guid, "host": urllib.parse.quote(HOST, safe=""), "app_label": "pool",
            "object_id": str(objects["host"].pk), "url": "nowhere/", "job_id": str(objects["waiting"].pk),
            "placement_id": str(objects["proposal"].pk), "cycle_id": str(objects["cycle"].pk)}
    paths = all_paths(fill)
    # Query strings that put the names on the topology and heatmap pages.
    paths += ["/topology/?fabric=t&color=tenant", f"/topology/?fabric=t&highlight={objects['placement'].pk}",
              f"/heatmap/?fabric=t&placement={objects['placement'].pk}", "/topology/data/?fabric=t&color=tenant",
              "/heatmap/data/?fabric=t", f"/pool/?pool={urllib.parse.quote(objects['pool'].name)}",
              f"/admin/pool/host/{objects['host'].pk}/change/", f"/admin/scheduler/job/{objects['waiting'].pk}/change/"]
    wrong, escaped, json_seen = [], [], 0
    for path in paths:
        response = client.get(path)
        text = response.content.decode(errors="replace")
        kind = response.get("Content-Type", "")
        if kind.startswith("text/html"):
            wrong += [f"{path}: {raw!r} unescaped" for raw in RAW if raw in text]
            if ESCAPED in text:
                escaped.append(path)
        elif response.status_code < 300:
            # JSON (and Prometheus text) is data, never rendered as a page by the browser;
            # the admin's translation catalogue is a script of its own.
            if not kind.startswith(("application/json", "application/vnd.oai.openapi", "text/plain")) and path != "/admin/jsi18n/":
                wrong.append(f"{path}: served as {kind!r}")
            if response.get("X-Content-Type-Options") != "nosniff":
                wrong.append(f"{path}: no nosniff")
            json_seen += kind.startswith("application/json")
    assert not wrong, "\n".join(wrong)
    # The names were there to be escaped: the dashboard and the admin show them.
    for expected in ["/", "/pool/", f"/pool/hosts/{fill['host']}/", "/scheduler/", f"/scheduler/jobs/{fill['job_id']}/",
                     f"/scheduler/placements/{fill['placement_id']}/", "/fabric/t/", f"/fabric/t/switches/{leaf.guid}/",
                     f"/admin/scheduler/job/{objects['waiting'].pk}/change/"]:
        assert expected in escaped, f"{expected} does not show the name escaped"
    assert json_seen >= 2  # topology and heatmap data at least


# --- in Chromium, through daphne ---------------------------------------------------------------

PASSWORD = "escaping-password-1"
SETUP = f"""
import time
from django.contrib.auth.models import User
from tests.test_pool_pages import Cluster, build
build("t")
now = time.time()
sim = Cluster("t", now - 60)
sim.poll(now - 20)
sim.poll(now - 10)
{HOSTILE}
User.objects.create_user("root", password={PASSWORD!r}, is_staff=True, is_superuser=True)
print(placement.pk, proposal.pk, waiting.pk)
"""

# Records every CSP violation the page reports, before any script of the page runs.
WATCH_CSP = """
window.__csp = [];
document.addEventListener('securitypolicyviolation', function (e) {
  window.__csp.push(e.violatedDirective + ' blocked ' + e.blockedURI + ' at ' + e.sourceFile + ':' + e.lineNumber);
});
"""

# Every string each plotly graph was given (data and layout): hostile names must arrive
# escaped, since plotly reads text, names and hovertemplates as markup.
PLOTLY_STRINGS = """() => {
  const out = [];
  function walk(v) {
    if (typeof v === 'string') out.push(v);
    else if (Array.isArray(v)) v.forEach(walk);
    else if (v && typeof v === 'object') Object.keys(v).forEach(k => { if (!k.startsWith('_')) walk(v[k]); });
  }
  for (const gd of document.querySelectorAll('.js-plotly-plot')) { walk(gd.data); walk(gd.layout); }
  return out;
}"""

# Points the mouse at the topology's marker for the hostile host; returns the page position.
HOST_MARKER = """(name) => {
  const gd = document.getElementById('topology-graph');
  const t = gd.data.find(t => t.name === 'hosts');
  const i = t.text.findIndex(s => s.includes(name));
  const L = gd._fullLayout, box = gd.getBoundingClientRect();
  return [box.left + L._size.l + L.xaxis.l2p(t.x[i]), box.top + L._size.t + L.yaxis.l2p(t.y[i])];
}"""


@pytest.fixture
def daphne_server(tmp_path):
    if shutil.which("chromium") is None:
        pytest.skip("no chromium on this machine")
    pytest.importorskip("playwright.sync_api")
    tag = uuid.uuid4().hex[:10]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings.test", "FABRICPOOL_VAR_DIR": str(tmp_path),
           "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"), "LIVE_KEY_PREFIX": f"test-esc-{tag}:",
           "LOG_LEVEL": "WARNING"}
    env.pop("DATABASE_URL", None)  # SQLite in tmp_path whatever the suite runs on
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True,
                   timeout=300)
    setup = subprocess.run([sys.executable, "manage.py", "shell", "-c", SETUP], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=300)
    assert setup.returncode == 0, setup.stderr[-3000:]
    ids = [int(v) for v in setup.stdout.split()[-3:]]
    try:
        with running_daphne(tmp_path, env) as base:
            yield base, ids
    finally:
        import redis

        client = redis.Redis.from_url(env["REDIS_URL"])
        keys = list(client.scan_iter(f"test-esc-{tag}:*"))
        if keys:
            client.delete(*keys)


@pytest.mark.browser
@pytest.mark.slow  # about a minute: its own database, daphne and Chromium
def test_chromium_runs_no_hostile_script_and_breaks_no_csp_rule(daphne_server):
    from playwright.sync_api import sync_playwright

    base, (placement, proposal, job) = daphne_server
    host = urllib.parse.quote(HOST, safe="")
    pages = {
        "overview": ("/", None),
        "topology": (f"/topology/?fabric=t&color=tenant&highlight={placement}", "#topology-graph[data-ready-ms]"),
        "heatmap": (f"/heatmap/?fabric=t&placement={placement}", "#heatmap-graph[data-ready-ms]"),
        "queue": ("/scheduler/", None),
        "pool": ("/pool/", None),
        "host": (f"/pool/hosts/{host}/", ".chart.js-plotly-plot"),
        "job": (f"/scheduler/jobs/{job}/", None),
        "placement": (f"/scheduler/placements/{proposal}/", None),
        "fabric": ("/fabric/t/", None),
        "api-docs": ("/api/docs/", "#api-docs ul.tabs"),  # drawn from the schema by fetch()
        "api-tokens": ("/api/tokens/", None),
        "admin": ("/admin/pool/host/", None),
    }
    dialogs, errors, violations, strings, headers, hover = [], [], {}, {}, {}, None
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"),
                                    args=["--no-sandbox", "--disable-background-networking"])
        try:
            tab = browser.new_page(viewport={"width": 1400, "height": 900})
            tab.add_init_script(WATCH_CSP)

            def on_dialog(dialog):
                dialogs.append(f"{tab.url}: {dialog.type} {dialog.message}")
                dialog.dismiss()

            tab.on("dialog", on_dialog)
            tab.on("pageerror", lambda exc: errors.append(f"{tab.url}: {exc}"))
            tab.on("console", lambda m: "Content Security Policy" in m.text and errors.append(f"{tab.url}: {m.text}"))
            tab.goto(base + "/login/")
            tab.fill('input[name="username"]', "root")
            tab.fill('input[name="password"]', PASSWORD)
            tab.click('form button[type="submit"]')
            tab.wait_for_url(base + "/")
            for name, (path, ready) in pages.items():
                response = tab.goto(base + path)
                # The policy is really there (through daphne), so "no violation" means something.
                headers[name] = response.headers.get("content-security-policy", "")
                tab.wait_for_load_state("load")
                if ready:
                    tab.wait_for_selector(ready, state="attached", timeout=20000)
                if name != "admin":  # the dashboard's own pages open their live socket under the CSP
                    # Selectors, not wait_for_function: that evaluates a string, which the CSP forbids.
                    tab.wait_for_selector("#live-status[data-state='live']", state="attached", timeout=15000)
                strings[name] = tab.evaluate(PLOTLY_STRINGS)
                if name == "topology":  # a real hover over the hostile host's marker
                    x, y = tab.evaluate(HOST_MARKER, "gpu0001")
                    tab.mouse.move(x, y, steps=4)
                    tab.wait_for_selector("#topology-graph .hoverlayer .hovertext", state="attached", timeout=10000)
                    hover = tab.text_content("#topology-graph .hoverlayer")
                violations[name] = tab.evaluate("window.__csp")
        finally:
            browser.close()
    assert all("script-src 'self'" in h and "object-src 'none'" in h for h in headers.values()), headers
    assert not dialogs, "\n".join(dialogs)
    assert not errors, "\n".join(errors)
    assert not any(violations.values()), violations
    # plotly got every name escaped (it reads them as markup), and they were there to get.
    for name, seen in strings.items():
        raw = [text for text in seen if any(marker in text for marker in RAW)]
        assert not raw, f"{name}: plotly was given markup: {raw[:3]}"
    for name in ("topology", "heatmap", "host"):
        assert any("&lt;script&gt;" in text or "&lt;img" in text for text in strings[name]), name
    # The hover box shows the names as typed (plotly turns the entities back into text).
    assert HOST in hover and "t" + SCRIPT in hover, hover
