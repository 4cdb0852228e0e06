"""The pool pages: the pools and the host list show what the database holds (after real
reports from the simulator's host model went through the ingest), filter and paginate
within a fixed number of queries, and a host page shows its GPUs, adapters, events and
chart data for each range. Names from agents are escaped everywhere, in the JSON for the
charts too. Operators drain and undrain; viewers cannot, even by hand-made POSTs."""
import html
import json
import re
import time
from datetime import UTC, timedelta

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.db import connection
from django.db.models import Avg, Count, Q
from django.template.defaultfilters import floatformat
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from agent.protocol import ALLOCATION_SCHEMA, parse_allocation_request, parse_report
from agent.simulate import load_fabric_hosts
from agent.workload import SimHost
from fabric.models import Link, Site
from pool import ingest, selectors
from pool.models import Gpu, GpuRollup, GpuSample, Host, HostEvent, HostRollup, HostSample, PollRound, Pool, Resolution
from pool.poller import Result
from pool.services import drain_host

pytestmark = pytest.mark.django_db

PASSWORD = "unused-password-1"


def user(username, role):
    account = User.objects.create_user(username, password=PASSWORD)
    account.groups.add(Group.objects.get(name=role))
    return account


@pytest.fixture
def viewer(client):
    client.force_login(user("vera", "viewer"))
    return client


@pytest.fixture
def operator(client):
    client.force_login(user("otto", "operator"))
    return client


def build(fabric="t", leaves=2, hosts_per_leaf=2, gpus=4):
    call_command("build_fattree", "--fabric", fabric, "--spines", "2", "--leaves", str(leaves), "--hosts-per-leaf",
                 str(hosts_per_leaf), "--gpus-per-host", str(gpus), "--speed", "EDR", verbosity=0)


class Cluster:
    """The simulator's host model for every host of a fabric, its reports ingested as a
    poll round would (no HTTP: the ingest is what the pages read)."""

    # The model's noise follows its clock: run it on a fixed one so that every run of the
    # tests sees the same numbers, whatever the time of day.
    SIM_EPOCH = 1_700_000_000.0

    def __init__(self, fabric: str, now: float):
        self.start = now
        self.hosts = {spec.name: SimHost(spec, seed=7, now=self.sim_time(now)) for spec in load_fabric_hosts(fabric)}
        self.ids = dict(Host.objects.filter(name__in=self.hosts).values_list("name", "id"))

    def sim_time(self, now: float) -> float:
        return self.SIM_EPOCH + (now - self.start)

    def run(self, host: str, job: str, gpus: int, now: float):
        sim = self.hosts[host]
        request = parse_allocation_request({"schema": ALLOCATION_SCHEMA, "id": job, "command": ["train"],
                                            "gpus": [g.spec.uuid for g in sim.gpus[:gpus]], "duration_s": 7200})
        sim.start(request, self.sim_time(now), 7200)

    def poll(self, now: float):
        results = [Result(self.ids[name], name, report=parse_report(sim.report(self.sim_time(now))), received_at=now)
                   for name, sim in self.hosts.items()]
        return ingest.apply_results(results)


@pytest.fixture
def cluster():
    """gpu0001..gpu0004 with 4 H100 each, two rounds of reports 10 s apart (the second gives
    IB rates), gpu0001 running a 2-GPU job; gpu0001-2 in pool "train" at site dc1."""
    build()
    now = time.time()
    sim = Cluster("t", now - 60)
    sim.run("gpu0001", "job-1", 2, now - 60)
    sim.poll(now - 20)
    sim.poll(now - 10)
    pool = Pool.objects.create(name="train", description="training runs")
    site = Site.objects.create(name="dc1")
    Host.objects.filter(name__in=["gpu0001", "gpu0002"]).update(pool=pool, site=site)
    PollRound.objects.create(started_at=timezone.now() - timedelta(seconds=12), finished_at=timezone.now() - timedelta(seconds=10),
                             hosts=4, chunks=1, chunks_done=1, hosts_ok=4, hosts_error=0, gpu_samples=16, duration_s=1.25)
    return sim


def page(response) -> str:
    return response.content.decode()


def host_table_rows(text: str) -> dict[str, list[str]]:
    """{host name: [cell texts]} of the hosts table."""
    section = text.split('id="hosts"', 1)[1]
    body = section.split("<tbody>", 1)[1].split("</tbody>", 1)[0] if "<tbody>" in section else ""
    rows = {}
    for row in re.findall(r"<tr>(.*?)</tr>", body, flags=re.S):
        cells = [html.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, flags=re.S)]
        rows[cells[0].split()[0]] = cells
    return rows


def expected_gpu_numbers(name):
    threshold = selectors.busy_threshold()
    numbers = Gpu.objects.filter(host__name=name, present=True).aggregate(
        total=Count("id"), busy=Count("id", filter=Q(utilization__gte=threshold)), avg=Avg("utilization"))
    return numbers["busy"], numbers["total"] - numbers["busy"], numbers["avg"]


# --- the pool page ---------------------------------------------------------------------------


def test_pool_page_numbers_match_the_database(viewer, cluster):
    text = page(viewer.get("/pool/"))
    assert "4 hosts, 16 GPUs" in text

    # Pools: the model's own computed properties are the truth.
    train = Pool.objects.get(name="train")
    pools = text.split('id="pools-title"', 1)[1].split("</section>", 1)[0]
    row = re.search(r'<a href="\?pool=train#hosts">train</a>.*?</tr>', pools, flags=re.S).group(0)
    cells = [html.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, flags=re.S)]
    busy = Gpu.objects.filter(host__pool=train, utilization__gte=5).count()
    assert train.gpu_models == ["NVIDIA H100 80GB HBM3"] and train.sites == ["dc1"] and train.gpu_count == 8
    assert cells == ["2", "8", str(busy), str(8 - busy), "8 × NVIDIA H100 80GB HBM3", "dc1"]
    assert busy == 2  # the job's GPUs; idle ones read 0-3 %
    assert 'aria-label="2 hosts in no pool"' in pools

    # The latest poll round.
    assert re.search(r"took 1\.25 s,\s+4 hosts reported, <span[^>]*>0 errors</span>\s+of 4", text)

    # Every host row against the database.
    rows = host_table_rows(text)
    assert list(rows) == ["gpu0001", "gpu0002", "gpu0003", "gpu0004"]
    for host in Host.objects.select_related("pool", "fabric"):
        cells = rows[host.name]
        busy, free, avg = expected_gpu_numbers(host.name)
        assert cells[1] == host.state == "up"
        assert cells[2] == (host.pool.name if host.pool else "—")
        assert cells[3] == "t"
        assert cells[4:7] == [str(busy), str(free), f"{floatformat(avg, 0)} %"]
        assert f'<time datetime="{host.last_report_at.astimezone(UTC).isoformat(timespec="seconds")}">' in text
    assert rows["gpu0001"][4] == "2"
    assert f'href="{reverse("pool:host", args=["gpu0003"])}"' in text


def test_busy_means_utilization_at_the_threshold_and_the_page_says_so(viewer, cluster):
    gpus = list(Gpu.objects.filter(host__name="gpu0003").order_by("index"))
    for gpu, value in zip(gpus, [4.9, 5.0, 100.0, None]):
        gpu.utilization = value
    Gpu.objects.bulk_update(gpus, ["utilization"])
    text = page(viewer.get("/pool/"))
    assert host_table_rows(text)["gpu0003"][4:7] == ["2", "2", "37 %"]  # avg of 4.9, 5, 100
    assert "latest utilization at least 5 %" in text and 'title="GPUs with utilization ≥ 5 %"' in text


def test_free_gpus_of_a_host_that_is_not_up_are_marked_held(viewer, cluster):
    drain_host(Host.objects.get(name="gpu0004"), actor="otto")
    cells = host_table_rows(page(viewer.get("/pool/")))["gpu0004"]
    assert cells[1] == "draining" and cells[5] == "4 (held)"


def test_filters_by_state_and_pool(viewer, cluster):
    drain_host(Host.objects.get(name="gpu0002"), actor="otto")
    assert list(host_table_rows(page(viewer.get("/pool/?state=draining")))) == ["gpu0002"]
    assert list(host_table_rows(page(viewer.get("/pool/?pool=train")))) == ["gpu0001", "gpu0002"]
    assert list(host_table_rows(page(viewer.get("/pool/", {"pool": selectors.NO_POOL})))) == ["gpu0003", "gpu0004"]
    assert list(host_table_rows(page(viewer.get("/pool/?pool=train&state=up")))) == ["gpu0001"]
    assert list(host_table_rows(page(viewer.get("/pool/?name=0003")))) == ["gpu0003"]
    text = page(viewer.get("/pool/?pool=train&state=stale"))
    assert host_table_rows(text) == {} and "No hosts in state stale in pool train." in text
    # The state tabs count within the pool filter and keep it.
    text = page(viewer.get("/pool/?pool=train"))
    assert re.search(r'<a href="\?pool=train&amp;state=draining#hosts"\s+aria-label="1 hosts draining"', text)
    assert 'aria-label="1 hosts up"' in text and 'aria-label="0 hosts stale"' in text


@pytest.mark.parametrize("query, message", [
    ("state=broken", "Unknown host state 'broken': choose one of up, stale, unreachable, draining, down, new."),
    ("pool=nope", "Unknown pool 'nope': pools are train."),
])
def test_bad_filter_values_get_a_400_with_a_message(viewer, cluster, query, message):
    response = viewer.get(f"/pool/?{query}")
    assert response.status_code == 400
    text = page(response)
    assert html.unescape(re.search(r'<p class="alert" role="alert">(.*?)</p>', text).group(1)) == message
    assert host_table_rows(text) == {}


def test_a_bad_filter_value_is_shown_escaped(viewer, cluster):
    text = page(viewer.get("/pool/", {"state": "<script>x</script>"}))
    assert "<script>x</script>" not in text and "&lt;script&gt;x&lt;/script&gt;" in text


def test_overview_state_numbers_link_to_the_filtered_host_list(viewer, cluster):
    drain_host(Host.objects.get(name="gpu0002"), actor="otto")
    text = page(viewer.get("/"))
    href = html.unescape(re.search(r'<a href="([^"]+)" aria-label="1 hosts draining"', text).group(1))
    assert href == "/pool/?state=draining#hosts"
    assert list(host_table_rows(page(viewer.get(href.split("#")[0])))) == ["gpu0002"]


@pytest.fixture
def big_cluster():
    """528 hosts with 2 GPUs each, all reported once; two of them in a pool."""
    build("big", leaves=16, hosts_per_leaf=33, gpus=2)
    Cluster("big", time.time()).poll(time.time())
    Host.objects.filter(name__in=["gpu0100", "gpu0200"]).update(pool=Pool.objects.create(name="small"))
    PollRound.objects.create(hosts=528, chunks=2)  # still running
    return Host.objects.count()


def queries(client, url):
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200
    return len(captured), page(response)


def test_host_list_is_paginated_with_a_fixed_number_of_queries(viewer, big_cluster, django_assert_max_num_queries):
    assert big_cluster == 528
    with django_assert_max_num_queries(14):
        first = viewer.get("/pool/")
    rows = host_table_rows(page(first))
    assert len(rows) == 100 and list(rows)[0] == "gpu0001"
    assert "page 1 of 6 (528 in all)" in page(first)
    assert "running</span> (0 of 2 chunks done)" in page(first)
    n_last, last = queries(viewer, "/pool/?page=6")
    assert len(host_table_rows(last)) == 28 and list(host_table_rows(last))[-1] == "gpu0528"
    n_small, small = queries(viewer, "/pool/?pool=small")
    assert list(host_table_rows(small)) == ["gpu0100", "gpu0200"]
    n_first, _ = queries(viewer, "/pool/")
    assert n_first == n_last == n_small  # 2 rows or 100 rows, 528 hosts: the same queries


def test_host_list_stays_fast_for_thousands_of_hosts(viewer, django_assert_max_num_queries):
    """4,096 hosts x 8 GPUs inserted in bulk: one page renders in a fixed number of queries, quickly."""
    fabric_hosts = [Host(name=f"n{i:05d}", state=Host.State.UP) for i in range(4096)]
    Host.objects.bulk_create(fabric_hosts, batch_size=1000)
    ids = list(Host.objects.values_list("id", flat=True))
    Gpu.objects.bulk_create([Gpu(host_id=pk, index=i, model="H100", utilization=(pk * i) % 100) for pk in ids for i in range(8)],
                            batch_size=2000)
    started = time.monotonic()
    with django_assert_max_num_queries(14):
        response = viewer.get("/pool/?page=20")
    elapsed = time.monotonic() - started
    assert response.status_code == 200 and len(host_table_rows(page(response))) == 100
    assert "4096 hosts, 32768 GPUs" in page(response)
    assert elapsed < 2.0, f"{elapsed:.2f} s for one page of 4,096 hosts"


# --- one host --------------------------------------------------------------------------------


def gpu_rows(text: str) -> list[list[str]]:
    section = text.split('id="gpus-title"', 1)[1].split("</section>", 1)[0]
    body = section.split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    return [[html.unescape(re.sub(r"<[^>]+>", " ", c)).split() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, flags=re.S)]
            for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body, flags=re.S)]


def test_host_page_shows_its_gpus_with_current_numbers(viewer, cluster):
    text = page(viewer.get("/pool/hosts/gpu0001/"))
    host = Host.objects.get(name="gpu0001")
    assert '<span class="state state-up">up</span>' in text
    assert host.agent_url in text and "FabricPool agent" in text and host.agent_version in text
    gpus = list(Gpu.objects.filter(host=host).order_by("index"))
    rows = gpu_rows(text)
    assert len(rows) == len(gpus) == 4
    for gpu, cells in zip(gpus, rows):
        assert cells[0][0] == str(gpu.index) and ("busy" in cells[0]) == (gpu.utilization >= 5)
        assert " ".join(cells[1]) == f"NVIDIA H100 80GB HBM3 · CC 9.0 · FP64 high {gpu.uuid}"
        assert cells[2] == [f"{gpu.memory_used_mib:,}", "/", "81,559", "MiB"]
        assert cells[3] == [floatformat(gpu.utilization, 0), "%"] and cells[4] == [floatformat(gpu.temperature_c, 0), "°C"]
        assert cells[5] == [floatformat(gpu.power_w, 0), "/", "700", "W"]
        assert cells[6] == ["0", "/", "0"]
        assert cells[7] == ["mlx5_0", "NUMA", str(gpu.numa_node)]
        assert cells[8] == ["off"]
    facts = text.split('id="host-facts"', 1)[1].split("</dl>", 1)[0]
    assert "<dt>GPUs busy / present</dt><dd>2 / 4</dd>" in facts
    assert f"<dt>CPU ({host.cpu_count} cores)</dt><dd>{floatformat(host.cpu_percent, 0)} %</dd>" in facts
    assert f"<dd>{100 * host.memory_used_mib / host.memory_total_mib:.0f} %</dd>" in facts
    assert host.ib_tx_bytes_per_s > 0 and f"<dd>{host.ib_tx_bytes_per_s * 8 / 1e9:.2f} / {host.ib_rx_bytes_per_s * 8 / 1e9:.2f}</dd>" in facts


def test_host_page_shows_its_adapter_cabled_to_its_leaf_switch(viewer, cluster):
    text = page(viewer.get("/pool/hosts/gpu0001/"))
    adapter = Host.objects.get(name="gpu0001").adapters.get()
    link = Link.objects.select_related("port_a__switch", "port_b__switch", "port_a__adapter").get(
        Q(port_a__adapter=adapter) | Q(port_b__adapter=adapter))
    leaf_port = link.port_a if link.port_a.switch_id else link.port_b
    url = reverse("fabric:switch", args=["t", leaf_port.switch.guid])
    assert re.search(rf'<a href="{re.escape(url)}">{re.escape(html.escape(leaf_port.switch.description))}</a> port {leaf_port.number}', text)
    assert viewer.get(url).status_code == 200
    # The ports the agent reports, with the rates the second report gave.
    ports = text.split("Reported ports", 1)[1]
    assert "<code>mlx5_0/1</code>" in ports and "ACTIVE" in ports and "Gb/s" in ports


def test_host_page_lists_recent_events(viewer, cluster):
    drain_host(Host.objects.get(name="gpu0001"), actor="otto", reason="<b>bad</b> fan")
    text = page(viewer.get("/pool/hosts/gpu0001/"))
    events = text.split('id="events-title"', 1)[1]
    assert "new → up: first report" in events
    assert "drained by otto (was up): &lt;b&gt;bad&lt;/b&gt; fan" in events and "<b>bad</b>" not in events


def test_unknown_host_is_a_404(viewer, cluster):
    assert viewer.get("/pool/hosts/nosuchhost/").status_code == 404


def test_any_host_name_has_a_page(viewer, cluster):
    Host.objects.filter(name="gpu0004").update(name="rack 7/gpu 4")
    url = reverse("pool:host", args=["rack 7/gpu 4"])
    assert url == "/pool/hosts/rack%207/gpu%204/"
    assert f'href="{url}"' in page(viewer.get("/pool/"))
    assert "<h1>rack 7/gpu 4</h1>" in page(viewer.get(url))


def chart_json(text: str) -> dict:
    match = re.search(r'<script id="pool-chart-data" type="application/json">(.*?)</script>', text, flags=re.S)
    assert match, "no chart data on the page"
    return json.loads(match.group(1))


def test_names_are_escaped_in_the_pages_and_the_chart_data(viewer, cluster):
    evil_host = 'h<img src=x onerror=alert(1)>"'
    evil_model = "<script>alert('m')</script>"
    host = Host.objects.get(name="gpu0003")
    host.name = evil_host
    host.save(update_fields=["name"])
    Gpu.objects.filter(host=host).update(model=evil_model)

    listing = page(viewer.get("/pool/"))
    assert "<img src=x" not in listing and "h&lt;img src=x onerror=alert(1)&gt;&quot;" in listing

    response = viewer.get(reverse("pool:host", args=[evil_host]))
    assert response.status_code == 200
    text = page(response)
    assert "<img src=x" not in text and "<script>alert('m')" not in text
    assert "&lt;script&gt;alert(&#x27;m&#x27;)&lt;/script&gt;" in text
    raw = re.search(r'<script id="pool-chart-data" type="application/json">(.*?)</script>', text, flags=re.S).group(1)
    assert "<" not in raw and ">" not in raw  # json_script escapes them: the script element cannot be closed early
    data = chart_json(text)
    assert data["host"]["name"] == evil_host and {g["model"] for g in data["gpus"]} == {evil_model}


def test_host_page_loads_plotly_from_the_project_and_the_chart_script(viewer, cluster):
    text = page(viewer.get("/pool/hosts/gpu0001/"))
    assert '<script src="/static/vendor/plotly.min.js" defer></script>' in text
    assert '<script src="/static/js/pool-charts.js" defer></script>' in text
    for chart in ("gpu-utilization", "gpu-memory", "gpu-temperature", "gpu-power", "host-cpu", "host-ib"):
        assert f'data-chart="{chart}"' in text
    assert "cdn" not in text.lower()


def ms(t):
    return int(t.timestamp() * 1000)


@pytest.fixture
def history(cluster):
    """gpu0002's history: hour and minute rollups and raw samples at known times."""
    host = Host.objects.get(name="gpu0002")
    GpuSample.objects.all().delete()
    HostSample.objects.all().delete()
    gpu = Gpu.objects.get(host=host, index=0)
    now = timezone.now().replace(microsecond=0)
    hour = now.replace(minute=0, second=0)
    minute = now.replace(second=0)
    points = {
        "hour": [hour - timedelta(hours=h) for h in (100, 30, 2)],  # 2 h ago: the newest complete hour
        "minute": [minute - timedelta(minutes=m) for m in (600, 90, 30, 10)],
        "raw": [now - timedelta(minutes=m) for m in (300, 50, 5, 1)],
    }
    for t in points["hour"]:
        GpuRollup.objects.create(gpu=gpu, resolution=Resolution.HOUR, t=t, samples=360, utilization_avg=11.0,
                                 utilization_max=20.0, memory_used_mib_avg=1024.0, temperature_c_avg=40.0, power_w_avg=100.0)
        HostRollup.objects.create(host=host, resolution=Resolution.HOUR, t=t, samples=360, cpu_percent_avg=21.0)
    for t in points["minute"]:
        GpuRollup.objects.create(gpu=gpu, resolution=Resolution.MINUTE, t=t, samples=6, utilization_avg=22.0,
                                 memory_used_mib_avg=2048.0, temperature_c_avg=50.0, power_w_avg=200.0)
        HostRollup.objects.create(host=host, resolution=Resolution.MINUTE, t=t, samples=6, cpu_percent_avg=32.0)
    for t in points["raw"]:
        GpuSample.objects.create(gpu=gpu, t=t, utilization=33.0, memory_used_mib=3072.0, temperature_c=60.0, power_w=300.0)
        HostSample.objects.create(host=host, t=t, cpu_percent=43.0, ib_tx_bytes_per_s=1e9, ib_rx_bytes_per_s=2e9)
    return points


def series(viewer, range_key):
    response = viewer.get(f"/pool/hosts/gpu0002/?range={range_key}")
    assert response.status_code == 200
    data = chart_json(page(response))
    assert data["range"] == range_key and [g["label"] for g in data["gpus"]] == ["gpu0", "gpu1", "gpu2", "gpu3"]
    return data, data["gpus"][0]


def test_chart_data_of_the_last_hour_are_the_raw_samples(viewer, history):
    data, gpu0 = series(viewer, "1h")
    raw = [t for t in history["raw"] if t >= timezone.now() - timedelta(hours=1)]
    assert gpu0["t"] == [ms(t) for t in raw] and gpu0["utilization"] == [33.0] * 3 and gpu0["power_w"] == [300.0] * 3
    assert data["host"]["cpu_percent"] == [43.0] * 3 and data["host"]["ib_rx_bytes_per_s"] == [2e9] * 3
    assert data["gpus"][1]["t"] == []
    assert data["end"] - data["start"] == 3600 * 1000


def test_chart_data_of_24_hours_are_minute_rollups_then_the_newest_samples(viewer, history):
    data, gpu0 = series(viewer, "24h")
    minutes = history["minute"]
    after = minutes[-1] + timedelta(minutes=1)
    raw = [t for t in history["raw"] if t >= after]  # only what the rollups do not cover yet
    assert gpu0["t"] == [ms(t) for t in minutes] + [ms(t) for t in raw]
    assert gpu0["utilization"] == [22.0] * len(minutes) + [33.0] * len(raw)
    assert gpu0["memory_used_mib"][0] == 2048.0
    assert data["host"]["cpu_percent"] == [32.0] * len(minutes) + [43.0] * len(raw)
    assert data["resolution"] == "1-minute averages"


def test_chart_data_of_7_days_are_hour_rollups_then_finer_ones(viewer, history):
    data, gpu0 = series(viewer, "7d")
    hours = history["hour"]  # all within 7 days
    covered = hours[-1] + timedelta(hours=1)  # minute rollups continue after the newest hour, 3 h back at most
    minutes = [t for t in history["minute"] if t >= max(covered, timezone.now() - timedelta(hours=3))]
    raw = [t for t in history["raw"] if t >= minutes[-1] + timedelta(minutes=1)]
    assert gpu0["t"] == [ms(t) for t in hours + minutes + raw]
    assert gpu0["utilization"] == [11.0] * len(hours) + [22.0] * len(minutes) + [33.0] * len(raw)
    assert data["host"]["cpu_percent"] == [21.0] * len(hours) + [32.0] * len(minutes) + [43.0] * len(raw)


def test_charts_of_a_host_without_samples_are_empty_not_broken(viewer, cluster):
    GpuSample.objects.all().delete()
    HostSample.objects.all().delete()
    data, gpu0 = series(viewer, "1h")
    assert gpu0["t"] == [] and data["host"]["t"] == []


def test_an_unknown_chart_range_is_a_400_with_a_message(viewer, cluster):
    response = viewer.get("/pool/hosts/gpu0001/?range=1y")
    assert response.status_code == 400
    assert "Unknown chart range &#x27;1y&#x27;: choose one of 1h, 24h, 7d." in page(response)
    assert 'id="pool-chart-data"' not in page(response)


def test_chart_queries_do_not_grow_with_the_samples(viewer, history, django_assert_max_num_queries):
    with django_assert_max_num_queries(20):
        assert viewer.get("/pool/hosts/gpu0002/?range=7d").status_code == 200


# --- drain and undrain -----------------------------------------------------------------------


def test_an_operator_drains_and_undrains_a_host_with_events(operator, cluster):
    text = page(operator.get("/pool/hosts/gpu0001/"))
    assert 'name="action" value="drain"' in text and "csrfmiddlewaretoken" in text
    response = operator.post("/pool/hosts/gpu0001/", {"action": "drain", "reason": "fan   noise"})
    assert response.status_code == 302 and response["Location"] == "/pool/hosts/gpu0001/"
    host = Host.objects.get(name="gpu0001")
    assert host.state == "draining" and not host.offers_gpus
    event = HostEvent.objects.filter(host=host, kind="drained").get()
    assert event.actor == "otto" and event.message == "drained by otto (was up): fan noise"

    text = page(operator.get("/pool/hosts/gpu0001/"))
    assert "gpu0001 is draining: its running work goes on" in text
    assert 'name="action" value="undrain"' in text and 'value="drain"' not in text
    assert host_table_rows(page(operator.get("/pool/?state=draining"))).keys() == {"gpu0001"}

    assert operator.post("/pool/hosts/gpu0001/", {"action": "undrain"}).status_code == 302
    host.refresh_from_db()
    assert host.state == "up"
    assert HostEvent.objects.filter(host=host, kind="undrained", actor="otto").count() == 1
    assert "no longer drained; polling puts it at up" in page(operator.get("/pool/hosts/gpu0001/"))


def test_draining_twice_changes_nothing_the_second_time(operator, cluster):
    operator.post("/pool/hosts/gpu0001/", {"action": "drain"})
    operator.post("/pool/hosts/gpu0001/", {"action": "drain"})
    assert HostEvent.objects.filter(host__name="gpu0001", kind="drained").count() == 1
    assert "gpu0001 was already draining." in page(operator.get("/pool/hosts/gpu0001/"))


def test_an_unknown_action_is_a_400_and_changes_nothing(operator, cluster):
    response = operator.post("/pool/hosts/gpu0001/", {"action": "reboot"})
    assert response.status_code == 400 and "Unknown action &#x27;reboot&#x27;" in page(response)
    assert Host.objects.get(name="gpu0001").state == "up"


def test_a_viewer_sees_no_buttons_and_gets_a_403_for_a_hand_made_post(viewer, cluster):
    text = page(viewer.get("/pool/hosts/gpu0001/"))
    assert 'name="action"' not in text and "Drain gpu0001" not in text
    events = HostEvent.objects.count()
    for action in ("drain", "undrain"):
        response = viewer.post("/pool/hosts/gpu0001/", {"action": action})
        assert response.status_code == 403
        assert "Only operators and admins may drain or undrain hosts" in page(response)
    assert Host.objects.get(name="gpu0001").state == "up" and HostEvent.objects.count() == events


def test_drain_needs_the_csrf_token(cluster):
    client = Client(enforce_csrf_checks=True)
    client.force_login(user("otto", "operator"))
    assert client.post("/pool/hosts/gpu0001/", {"action": "drain"}).status_code == 403
    assert Host.objects.get(name="gpu0001").state == "up"
    client.get("/pool/hosts/gpu0001/")
    token = client.cookies["csrftoken"].value
    response = client.post("/pool/hosts/gpu0001/", {"action": "drain", "csrfmiddlewaretoken": token})
    assert response.status_code == 302 and Host.objects.get(name="gpu0001").state == "draining"


# --- in a real browser -----------------------------------------------------------------------


@pytest.mark.browser
def test_charts_draw_in_chromium_with_names_escaped(live_server, cluster):
    """plotly.js from the project's static files draws all six charts; a GPU model with
    markup in it reaches plotly escaped and shows as typed."""
    import shutil

    playwright = pytest.importorskip("playwright.sync_api")
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("no chromium on this machine")
    Gpu.objects.filter(host__name="gpu0001", index=0).update(model="<b>bold</b> & <i>x</i>")
    user("otto", "operator")
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-background-networking"])
        try:
            tab = browser.new_page()
            errors = []
            tab.on("pageerror", lambda exc: errors.append(str(exc)))
            tab.goto(live_server.url + "/login/")
            tab.fill('input[name="username"]', "otto")
            tab.fill('input[name="password"]', PASSWORD)
            tab.click('button[type="submit"]')
            tab.wait_for_url(live_server.url + "/")
            tab.goto(live_server.url + "/pool/hosts/gpu0001/")
            tab.wait_for_function("document.querySelectorAll('.chart.js-plotly-plot').length === 6", timeout=20000)
            texts = tab.evaluate("document.getElementById('chart-gpu-utilization').data.map(t => t.text)")
            names = tab.evaluate("document.getElementById('chart-gpu-utilization').data.map(t => t.name)")
            legend = tab.text_content("#chart-gpu-utilization .legend")
            # Hover the first point of gpu0: plotly turns the entities back into the characters.
            tab.evaluate("Plotly.Fx.hover('chart-gpu-utilization', [{curveNumber: 0, pointNumber: 0}])")
            hover = tab.text_content("#chart-gpu-utilization .hoverlayer")
            bold = tab.evaluate("document.querySelectorAll('#chart-gpu-utilization .hoverlayer [style*=bold], "
                                "#chart-gpu-utilization .hoverlayer b').length")
        finally:
            browser.close()
    assert not errors
    assert texts[0] == "gpu0001 · &lt;b&gt;bold&lt;/b&gt; &amp; &lt;i&gt;x&lt;/i&gt;"
    assert names[:2] == ["gpu0", "gpu1"] and "gpu3" in legend
    assert "gpu0001 · <b>bold</b> & <i>x</i>" in hover and bold == 0  # shown as typed, not as markup
