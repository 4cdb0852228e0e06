"""The topology and GPU heatmap pages: what they draw is what the database holds (tiers,
hosts under their leaves, links by health, tenants from active placements, a highlighted
placement), in a bounded number of queries for any fabric size; hostile names stay text in
the JSON and the HTML; bad parameters get a 400 with the reason; and a real Chromium draws
a 4,096-host fabric (time to interactive printed, screenshots kept in docs/screenshots/)."""
import json
import re
import shutil
import time
from pathlib import Path

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command

from core import topology
from fabric.models import Fabric, Link, Switch
from pool.models import Gpu, Host, Pool
from scheduler.models import Job, Placement, PlacementGpu, Tenant

pytestmark = pytest.mark.django_db

PASSWORD = "unused-password-1"
SCREENSHOTS = Path(__file__).resolve().parent.parent / "docs" / "screenshots"


def user(username, role):
    account = User.objects.create_user(username, password=PASSWORD)
    account.groups.add(Group.objects.get(name=role))
    return account


@pytest.fixture
def viewer(client):
    client.force_login(user("vera", "viewer"))
    return client


def build(fabric="t", spines=2, leaves=2, hosts_per_leaf=3, gpus=4, *extra):
    call_command("build_fattree", "--fabric", fabric, "--spines", str(spines), "--leaves", str(leaves),
                 "--hosts-per-leaf", str(hosts_per_leaf), "--gpus-per-host", str(gpus), "--speed", "EDR", *extra,
                 verbosity=0)


def embedded(response, element_id):
    text = response.content.decode()
    match = re.search(rf'<script id="{element_id}" type="application/json">(.*?)</script>', text, flags=re.S)
    assert match, f"no #{element_id} in the page"
    return json.loads(match.group(1))


def place(tenant_name, gpus, state=Placement.State.RUNNING):
    tenant, _ = Tenant.objects.get_or_create(name=tenant_name)
    pool, _ = Pool.objects.get_or_create(name="p")
    job = Job.objects.create(tenant=tenant, pool=pool, gpus=len(gpus), command=["train"])
    placement = Placement.objects.create(job=job, state=state)
    PlacementGpu.objects.bulk_create([PlacementGpu(placement=placement, gpu=g) for g in gpus])
    return placement


# --- access ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["/topology/", "/topology/data/", "/heatmap/", "/heatmap/data/"])
def test_anonymous_users_are_sent_to_the_login_page(client, url):
    build()
    response = client.get(url)
    assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_viewers_see_both_pages_and_the_nav_links_them(viewer):
    build()
    for url, title in (("/topology/", "Topology of"), ("/heatmap/", "GPU heatmap of")):
        response = viewer.get(url)
        text = response.content.decode()
        assert response.status_code == 200 and title in text
        assert '<a href="/topology/"' in text and '<a href="/heatmap/"' in text
        assert "vendor/plotly.min.js" in text


def test_pages_without_any_fabric_say_so(viewer):
    for url in ("/topology/", "/heatmap/"):
        response = viewer.get(url)
        assert response.status_code == 200 and "No fabric yet" in response.content.decode()
    assert viewer.get("/topology/data/").status_code == 404


# --- the topology data ----------------------------------------------------------------------------


def test_topology_counts_match_the_fabric(viewer):
    build(spines=2, leaves=3, hosts_per_leaf=4)
    data = viewer.get("/topology/data/?fabric=t").json()
    tiers = {row["tier"]: row["count"] for row in data["rows"]}
    assert tiers == {"spine": 2, "leaf": 3, "hosts": 12}
    assert len(data["hosts"]["name"]) == 12 and not data["aggregated"]
    # Hosts sit under their own leaf: the leaf each host is cabled to in the database.
    cabled = {}
    for link in Link.objects.filter(kind="adapter_switch").select_related("port_a__adapter", "port_b__switch", "port_a__switch", "port_b__adapter"):
        adapter = link.port_a.adapter or link.port_b.adapter
        switch = link.port_a.switch or link.port_b.switch
        cabled[adapter.host_name] = switch.description
    drawn = {name: data["switches"][leaf]["name"] for name, leaf in zip(data["hosts"]["name"], data["hosts"]["leaf"])}
    assert drawn == cabled
    leaves = [s for s in data["switches"] if s["tier"] == "leaf"]
    assert [s["hosts"] for s in leaves] == [4, 4, 4]
    assert all(s["y"] == 1 for s in leaves) and all(s["y"] == 2 for s in data["switches"] if s["tier"] == "spine")
    # Leaves stand over the middle of their hosts; hosts of a leaf are next to each other.
    for k, leaf in enumerate(data["switches"][:3]):
        xs = [x for x, l in zip(data["hosts"]["x"], data["hosts"]["leaf"]) if l == k]
        assert xs == list(range(min(xs), min(xs) + 4)) and leaf["x"] == sum(xs) / 4
    # Click targets: the host and switch pages, which answer.
    assert data["hosts"]["url"][0] == f"/pool/hosts/{data['hosts']['name'][0]}/"
    guid = data["switches"][0]["guid"]
    assert data["switches"][0]["url"] == f"/fabric/t/switches/{guid}/"
    assert viewer.get(data["hosts"]["url"][0]).status_code == 200
    assert viewer.get(data["switches"][0]["url"]).status_code == 200


def test_a_three_tier_fabric_has_a_core_row_above_the_spines(viewer):
    build("t3", 4, 4, 2, 2, "--pods", "2")
    data = viewer.get("/topology/data/").json()
    tiers = {row["tier"]: (row["y"], row["count"]) for row in data["rows"]}
    cores = Switch.objects.filter(fabric__name="t3", tier="core").count()
    assert cores and tiers == {"core": (3, cores), "spine": (2, 4), "leaf": (1, 4), "hosts": (0, 8)}
    assert sum(g["count"] for g in data["links"]["groups"]) == Link.objects.filter(fabric__name="t3").count()


def test_links_are_grouped_by_state_with_the_reason_of_those_not_up(viewer):
    build(spines=2, leaves=2, hosts_per_leaf=3)
    links = list(Link.objects.filter(kind="switch_switch").order_by("key"))
    Link.objects.filter(pk=links[0].pk).update(state="down", state_reason="port went down")
    Link.objects.filter(pk=links[1].pk).update(state="degraded", state_reason="symbol errors <script>")
    data = viewer.get("/topology/data/").json()
    counts = {g["key"]: g["count"] for g in data["links"]["groups"]}
    # 2 leaves x 2 spines + 6 host cables, two of them not up.
    assert counts == {"up": 4 + 6 - 2, "degraded": 1, "down": 1}
    group = next(g for g in data["links"]["groups"] if g["key"] == "down")
    assert len(group["x"]) == 3 and group["x"][2] is None and group["y"][:2] in ([1, 2], [2, 1])
    assert group["host"] == [None]  # a switch cable
    up = next(g for g in data["links"]["groups"] if g["key"] == "up")
    assert sorted(h for h in up["host"] if h is not None) == list(range(6))  # each host's own cable
    for k, h in enumerate(up["host"]):
        if h is not None:
            assert up["x"][3 * k] == data["hosts"]["x"][h] and up["y"][3 * k] == 0
    reasons = {p["state"]: p["reason"] for p in data["links"]["problems"]}
    assert reasons == {"down": "port went down", "degraded": "symbol errors <script>"}


def test_links_by_utilization_use_the_hosts_ib_throughput(viewer):
    build(spines=2, leaves=2, hosts_per_leaf=2)
    # EDR 4x = 100 Gb/s: 80 Gb/s on one host is the top bucket, 10 on another the lowest.
    Host.objects.filter(name="gpu0001").update(ib_tx_bytes_per_s=5e9, ib_rx_bytes_per_s=5e9)
    Host.objects.filter(name="gpu0002").update(ib_tx_bytes_per_s=0.625e9, ib_rx_bytes_per_s=0.625e9)
    data = viewer.get("/topology/data/?links=utilization").json()
    counts = {g["key"]: g["count"] for g in data["links"]["groups"]}
    # gpu0001 and gpu0002 share leaf 1: its two uplinks carry (80 + 10) / 2 = 45 Gb/s each.
    assert counts == {"75-100 %": 1, "0-25 %": 1, "25-50 %": 2, "unknown": 2 + 2}
    assert data["hosts"]["ib_gbps"][:2] == [80.0, 10.0]


def test_hosts_coloured_by_gpu_utilization(viewer):
    build(spines=2, leaves=2, hosts_per_leaf=2, gpus=4)
    Gpu.objects.filter(host__name="gpu0001").update(utilization=90)
    Gpu.objects.filter(host__name="gpu0001", index=0).update(utilization=10)
    data = viewer.get("/topology/data/").json()
    i = data["hosts"]["name"].index("gpu0001")
    assert data["hosts"]["util"][i] == 70.0 and data["hosts"]["busy"][i] == 4 and data["hosts"]["gpus"][i] == 4
    assert data["switches"][data["hosts"]["leaf"][i]]["util"] == 70.0  # the other host has no reading


def test_tenant_colouring_comes_from_active_placements(viewer):
    build(spines=2, leaves=2, hosts_per_leaf=2, gpus=4)
    g1 = list(Gpu.objects.filter(host__name="gpu0001"))
    g3 = list(Gpu.objects.filter(host__name="gpu0003"))
    place("physics", g1[:3])
    place("biology", g1[3:])  # the host goes to the tenant holding most of its GPUs
    place("chemistry", g3, state=Placement.State.FINISHED)  # over: holds nothing
    PlacementGpu.objects.filter(gpu__in=g3).update(active=False)
    data = viewer.get("/topology/data/?color=tenant").json()
    tenants = dict(zip(data["hosts"]["name"], data["hosts"]["tenant"]))
    assert tenants == {"gpu0001": "physics", "gpu0002": None, "gpu0003": None, "gpu0004": None}
    assert data["tenants"] == [{"name": "physics", "hosts": 1}]
    page = viewer.get("/topology/?color=tenant").content.decode()
    assert "physics: 1 host" in page


def test_a_placement_is_highlighted(viewer):
    build(spines=2, leaves=2, hosts_per_leaf=2, gpus=2)
    gpus = list(Gpu.objects.filter(host__name__in=["gpu0002", "gpu0003"]))
    placement = place("physics", gpus, state=Placement.State.PROPOSED)
    response = viewer.get(f"/topology/?highlight={placement.pk}")
    data = embedded(response, "topology-data")
    lit = [name for name, on in zip(data["hosts"]["name"], data["hosts"]["highlight"]) if on]
    assert lit == ["gpu0002", "gpu0003"] and data["highlight"]["hosts"] == lit
    assert sum(s["highlight"] for s in data["switches"]) == 2  # both leaves
    assert f"placement {placement.pk}</a> of job {placement.job_id}" in response.content.decode()


def test_aggregation_above_the_threshold(viewer):
    build(spines=2, leaves=2, hosts_per_leaf=3)
    fabric = Fabric.objects.get(name="t")
    data = topology.topology_data(fabric, aggregate_above=5)
    assert data["aggregated"] and data["aggregate_above"] == 5
    assert [s["hosts"] for s in data["switches"] if s["tier"] == "leaf"] == [3, 3]
    assert not topology.topology_data(fabric, aggregate_above=6)["aggregated"]
    assert not viewer.get("/topology/data/").json()["aggregated"]


def test_hostile_names_are_escaped_in_the_html_and_kept_as_text_in_the_json(viewer):
    build(spines=2, leaves=2, hosts_per_leaf=2)
    hostile = '<img src=x onerror=alert(1)>'
    Host.objects.filter(name="gpu0001").update(name=f"gpu{hostile}")
    Switch.objects.filter(tier="leaf").update(description=f"leaf </script>{hostile}")
    place(f"t{hostile}", list(Gpu.objects.filter(host__name=f"gpu{hostile}")))
    for url, element in (("/topology/?color=tenant", "topology-data"), ("/heatmap/", "heatmap-data")):
        response = viewer.get(url)
        text = response.content.decode()
        assert hostile not in text and "</script><img" not in text
        data = embedded(response, element)
        names = data["hosts"]["name"] if element == "topology-data" else data["hosts"]
        assert f"gpu{hostile}" in names
    assert "t&lt;img src=x onerror=alert(1)&gt;: 1 host" in viewer.get("/topology/?color=tenant").content.decode()
    data = viewer.get("/topology/data/").json()
    assert f"leaf </script>{hostile}" in [s["name"] for s in data["switches"]]
    assert data["hosts"]["url"][data["hosts"]["name"].index(f"gpu{hostile}")] == "/pool/hosts/gpu%3Cimg%20src%3Dx%20onerror%3Dalert%281%29%3E/"


@pytest.mark.parametrize("url, message", [
    ("/topology/?fabric=nope", "Unknown fabric &#x27;nope&#x27;: choose one of t."),
    ("/topology/?color=rainbow", "Unknown colour &#x27;rainbow&#x27;: choose one of utilization, tenant."),
    ("/topology/?links=glow", "Unknown link colouring &#x27;glow&#x27;"),
    ("/topology/?highlight=abc", "highlight=&#x27;abc&#x27; is not a placement number."),
    ("/topology/?highlight=999", "There is no placement 999."),
    ("/heatmap/?metric=power", "Unknown metric &#x27;power&#x27;: choose one of utilization, memory, temperature."),
    ("/heatmap/?fabric=%3Cb%3E", "Unknown fabric &#x27;&lt;b&gt;&#x27;"),
])
def test_bad_parameters_get_a_400_with_the_reason(viewer, url, message):
    build()
    response = viewer.get(url)
    assert response.status_code == 400
    assert message in response.content.decode()
    data_url = url.replace("/?", "/data/?")
    response = viewer.get(data_url)
    assert response.status_code == 400 and "error" in response.json()


def test_a_placement_in_another_fabric_is_a_bad_highlight(viewer):
    build("a")
    build("b", 2, 2, 2, 4)
    placement = place("physics", list(Gpu.objects.filter(host__fabric__name="b")[:2]))
    assert viewer.get(f"/topology/?highlight={placement.pk}").status_code == 200  # its own fabric
    response = viewer.get(f"/topology/?fabric=a&highlight={placement.pk}")
    assert response.status_code == 400 and f"Placement {placement.pk} holds no GPU in fabric a." in response.content.decode()


# --- the heatmap ----------------------------------------------------------------------------------


def test_heatmap_is_hosts_by_gpus_grouped_by_leaf(viewer):
    build(spines=2, leaves=3, hosts_per_leaf=2, gpus=4)
    Gpu.objects.filter(host__name="gpu0003", index=2).update(utilization=55.5, memory_used_mib=40960, memory_mib=81920, temperature_c=61)
    Gpu.objects.filter(host__name="gpu0006", index=3).update(present=False)
    data = viewer.get("/heatmap/data/?fabric=t").json()
    assert data["gpus"] == [0, 1, 2, 3] and len(data["z"]) == 4 and all(len(row) == 6 for row in data["z"])
    assert [(l["start"], l["count"]) for l in data["leaves"]] == [(0, 2), (2, 2), (4, 2)]
    col = data["hosts"].index("gpu0003")
    assert data["z"][2][col] == 55.5
    assert data["z"][3][data["hosts"].index("gpu0006")] is None  # not present
    assert data["cells"] == 1  # the only reading
    memory = viewer.get("/heatmap/data/?metric=memory").json()
    assert memory["z"][2][col] == 50.0 and memory["unit"] == "%"
    assert viewer.get("/heatmap/data/?metric=temperature").json()["z"][2][col] == 61.0
    # Each leaf's hosts are the hosts cabled to it.
    leaf_hosts = {s["name"]: s["hosts"] for s in viewer.get("/topology/data/").json()["switches"] if s["tier"] == "leaf"}
    assert [l["name"] for l in data["leaves"]] == list(leaf_hosts)


# --- size -----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_4096_host_fabric_in_bounded_queries(viewer, django_assert_max_num_queries):
    started = time.perf_counter()
    build("big", 16, 128, 32, 8)
    print(f"\nbuild_fattree 128 leaves x 32 hosts: {time.perf_counter() - started:.1f} s")
    placement = place("physics", list(Gpu.objects.filter(host__name__in=["gpu0001", "gpu0040"])))
    fabric = Fabric.objects.get(name="big")
    for color, links in (("utilization", "health"), ("tenant", "utilization")):
        started = time.perf_counter()
        with django_assert_max_num_queries(10):
            data = topology.topology_data(fabric, color=color, links=links, placement=placement)
        print(f"topology data ({color}, links by {links}): {(time.perf_counter() - started) * 1000:.0f} ms, "
              f"{len(json.dumps(data)) / 1e6:.2f} MB of JSON")
    assert data["aggregated"] and len(data["hosts"]["name"]) == 4096
    assert sum(1 for s in data["switches"] if s["tier"] == "leaf") == 128
    assert sum(g["count"] for g in data["links"]["groups"]) == Link.objects.filter(fabric=fabric).count()
    started = time.perf_counter()
    with django_assert_max_num_queries(8):
        heat = topology.heatmap_data(fabric, "utilization")
    print(f"heatmap data: {(time.perf_counter() - started) * 1000:.0f} ms, {len(json.dumps(heat)) / 1e6:.2f} MB of JSON")
    assert len(heat["hosts"]) == 4096 and len(heat["leaves"]) == 128
    with django_assert_max_num_queries(20):
        assert viewer.get("/topology/?fabric=big").status_code == 200
    with django_assert_max_num_queries(20):
        assert viewer.get("/heatmap/?fabric=big").status_code == 200


# --- in a real browser ----------------------------------------------------------------------------


def _log_in(tab, base):
    tab.goto(base + "/login/")
    tab.fill('input[name="username"]', "vera")
    tab.fill('input[name="password"]', PASSWORD)
    tab.click('button[type="submit"]')
    tab.wait_for_url(base + "/")


def _click(tab, x, y):
    # plotly clicks what the pointer hovers, and hovering is throttled: let it catch up.
    tab.mouse.move(x, y, steps=4)
    tab.wait_for_timeout(250)
    tab.mouse.click(x, y)


@pytest.mark.browser
@pytest.mark.slow
def test_a_4096_host_topology_and_heatmap_draw_in_chromium(live_server):
    """plotly.js (WebGL traces) draws the 4,096-host fat tree folded per leaf; a click on a
    leaf's marker unfolds its hosts, a click on a switch opens its page; the heatmap draws
    every GPU. Times from navigation to interactive are printed, screenshots kept."""
    playwright = pytest.importorskip("playwright.sync_api")
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("no chromium on this machine")
    build("big", 16, 128, 32, 8)
    # Some load, a tenant and a degraded cable, so that the screenshots show colours.
    for n, host in enumerate(Host.objects.filter(fabric__name="big").order_by("name")[:1500]):
        Gpu.objects.filter(host=host).update(utilization=(n * 37) % 100, temperature_c=35 + (n * 13) % 50,
                                             memory_used_mib=(n * 997) % 81920)
    Link.objects.filter(kind="switch_switch").order_by("key").filter(pk__in=Link.objects.filter(kind="switch_switch").order_by("key")[:3].values("pk")).update(state="degraded", state_reason="symbol errors")
    placement = place("physics", list(Gpu.objects.filter(host__name__in=["gpu0033", "gpu0034", "gpu0035"])))
    user("vera", "viewer")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-background-networking"])
        try:
            tab = browser.new_page(viewport={"width": 1600, "height": 1000})
            errors = []
            tab.on("pageerror", lambda exc: errors.append(str(exc)))
            _log_in(tab, live_server.url)
            started = time.perf_counter()
            tab.goto(f"{live_server.url}/topology/?fabric=big&highlight={placement.pk}")
            tab.wait_for_function("document.getElementById('topology-graph').dataset.readyMs", timeout=30000)
            wall = time.perf_counter() - started
            ready_ms = int(tab.get_attribute("#topology-graph", "data-ready-ms"))
            print(f"\ntopology of 4,096 hosts interactive {ready_ms} ms after navigation (test clock: {wall:.2f} s)")
            traces = tab.evaluate("document.getElementById('topology-graph').data.map(t => [t.type, t.name, t.x.length])")
            assert {t[0] for t in traces} == {"scattergl"}
            by_name = {t[1]: t[2] for t in traces}
            # The placement's leaf (gpu0033-gpu0064) starts unfolded, the 127 others folded.
            assert by_name["hosts per leaf"] == 127 and by_name["switches"] == 144 and by_name["hosts"] == 32
            assert by_name[f"placement {placement.pk}"] == 3 + 1  # its hosts and their leaf
            # Folded leaves hide their host cables: up are the 2,048 - 3 uplinks and 32 host cables.
            assert by_name["up (6141)"] == (2045 + 32) * 3
            tab.screenshot(path=str(SCREENSHOTS / "topology.png"))

            # Unfold the first leaf (gpu0001..gpu0032) with a real click on its marker.
            point = tab.evaluate("""() => {
                const gd = document.getElementById('topology-graph');
                const t = gd.data.find(t => t.name === 'hosts per leaf');
                const L = gd._fullLayout, box = gd.getBoundingClientRect();
                return [box.left + L._size.l + L.xaxis.l2p(t.x[0]), box.top + L._size.t + L.yaxis.l2p(0)];
            }""")
            _click(tab, point[0], point[1])
            tab.wait_for_function("document.getElementById('topology-graph').data.find(t => t.name === 'hosts').x.length === 64")
            assert tab.evaluate("document.getElementById('topology-graph').data.find(t => t.name === 'up (6141)').x.length") == (2045 + 64) * 3

            # A spine: its page opens.
            point = tab.evaluate("""() => {
                const gd = document.getElementById('topology-graph');
                const t = gd.data.find(t => t.name === 'switches');
                const i = t.y.indexOf(2);
                const L = gd._fullLayout, box = gd.getBoundingClientRect();
                return [box.left + L._size.l + L.xaxis.l2p(t.x[i]), box.top + L._size.t + L.yaxis.l2p(2), t.customdata[i]];
            }""")
            _click(tab, point[0], point[1])
            tab.wait_for_url(live_server.url + point[2])

            started = time.perf_counter()
            tab.goto(f"{live_server.url}/heatmap/?fabric=big")
            tab.wait_for_function("document.getElementById('heatmap-graph').dataset.readyMs", timeout=30000)
            ready_ms = int(tab.get_attribute("#heatmap-graph", "data-ready-ms"))
            print(f"heatmap of 32,768 GPUs interactive {ready_ms} ms after navigation (test clock: {time.perf_counter() - started:.2f} s)")
            shape = tab.evaluate("(() => { const t = document.getElementById('heatmap-graph').data[0]; return [t.type, t.z.length, t.z[0].length]; })()")
            assert shape == ["heatmap", 8, 4096]
            tab.screenshot(path=str(SCREENSHOTS / "heatmap.png"))
        finally:
            browser.close()
    assert not errors


# --- the overview's live numbers and their links --------------------------------------------------


def test_overview_shows_gpus_per_pool_and_site_and_each_number_leads_to_its_list(viewer):
    from fabric.models import Site

    build(spines=2, leaves=2, hosts_per_leaf=2, gpus=4)
    site = Site.objects.create(name="north")
    Host.objects.filter(name__in=["gpu0001", "gpu0002"]).update(site=site)
    Host.objects.filter(name="gpu0001").update(pool=Pool.objects.create(name="main"))
    gpus = list(Gpu.objects.filter(host__name="gpu0001").order_by("index"))
    Gpu.objects.filter(pk=gpus[0].pk).update(utilization=95)  # busy: allocated, not idle
    place("physics", gpus[:3])  # 3 allocated, 2 of them idle
    response = viewer.get("/")
    live = embedded(response, "overview-data")
    pools = {p["name"]: p for p in live["gpu_pools"]}
    assert pools["main"] == {"name": "main", "filter": "main", "total": 4, "allocated": 3, "idle_allocated": 2, "free": 1}
    assert pools[""]["total"] == 12 and pools[""]["allocated"] == 0 and pools[""]["filter"] == "(none)"
    sites = {s["name"]: s for s in live["gpu_sites"]}
    assert (sites["north"]["total"], sites["north"]["allocated"], sites[""]["total"]) == (8, 3, 8)
    assert live["utilization"]["mean"] == 95.0 and live["fabric_links"] == {"t": {"degraded": 0, "down": 0, "missing": 0}}
    text = response.content.decode()
    assert '<a href="/pool/?site=north#hosts">8</a>' in text and '<a href="/scheduler/jobs/?pool=main">3</a>' in text
    # The lists behind the numbers: the site filter keeps the hosts at that site.
    listed = re.findall(r'<td data-host-id="\d+"><a href="[^"]+">([^<]+)</a>', viewer.get("/pool/?site=north").content.decode())
    assert listed == ["gpu0001", "gpu0002"]
    listed = re.findall(r'<td data-host-id="\d+"><a href="[^"]+">([^<]+)</a>', viewer.get("/pool/?site=(none)").content.decode())
    assert listed == ["gpu0003", "gpu0004"]
    response = viewer.get("/pool/?site=%3Cb%3E")
    assert response.status_code == 400 and "Unknown site &#x27;&lt;b&gt;&#x27;: sites are north." in response.content.decode()


def test_topology_data_carries_the_ids_of_the_live_updates_and_the_page_a_keyboard_alternative(viewer):
    build(spines=2, leaves=2, hosts_per_leaf=2)
    Link.objects.filter(pk=Link.objects.filter(kind="switch_switch").order_by("key").first().pk).update(state="down")
    response = viewer.get("/topology/")
    data = embedded(response, "topology-data")
    assert data["hosts"]["id"] == [Host.objects.get(name=n).pk for n in data["hosts"]["name"]]
    drawn = sorted(k for g in data["links"]["groups"] for k in g["link"])
    assert drawn == sorted(Link.objects.filter(kind__in=["switch_switch", "adapter_switch"]).values_list("pk", flat=True))
    assert all(len(g["link"]) == g["count"] for g in data["links"]["groups"])
    assert data["links"]["problems"][0]["link"] == Link.objects.get(state="down").pk
    text = response.content.decode()
    assert 'id="topology-graph" class="topology-graph" tabindex="0"' in text
    assert '<a href="#topology-table-summary">Skip to the drawing as a table</a>' in text
