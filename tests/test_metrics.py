"""GET /metrics: Prometheus text that a real parser reads, with values that match the
database (4 hosts x 4 GPUs in pool "main", a tenant holding 6 of them, a queue, a proposal,
cycles and poll rounds inside and outside the histogram window); who may scrape it (token,
allow-list, both, neither, admin session); bounded labels; and the Grafana dashboard,
whose every PromQL expression must name only metrics that /metrics exposes."""
import json
import os
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import Group, User
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.test import Client, override_settings
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from core.metrics import GPU_STATES, QUEUE_REASONS
from fabric.models import Link
from pool.models import Gpu, Host, PollRound, Pool
from scheduler.models import AllocationCycle, Job, Placement, PlacementGpu, Tenant

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "docs" / "grafana" / "fabricpool.json"
TOKEN = "test-metrics-token-0123456789"
OPEN = {"METRICS_TOKEN": "", "METRICS_ALLOWED_IPS": []}


def make_user(username, role):
    user = User.objects.create_user(username, password="unused-password-1")
    user.groups.add(Group.objects.get(name=role))
    return user


def scrape(client=None, **extra) -> str:
    response = (client or Client()).get("/metrics", **extra)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    return response.content.decode()


def samples(text: str) -> dict:
    """{(sample name, frozenset of labels): value} from Prometheus text."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name, frozenset(s.labels.items())] = s.value
    return out


def value(parsed, name, **labels):
    return parsed[name, frozenset(labels.items())]


@pytest.fixture
def scene(db):
    """Pool main: h1 up, its 4 GPUs held by a running placement of tenant physics (2 busy,
    2 idle); h2 up, GPUs 0-1 held by a proposal, GPU 2 busy with foreign work, GPU 3 free;
    h3 draining, GPU 3 no longer reported; h4 unreachable."""
    call_command("build_fattree", "--fabric", "m", "--spines", "2", "--leaves", "2", "--hosts-per-leaf", "2",
                 "--gpus-per-host", "4", "--speed", "EDR", verbosity=0)
    main = Pool.objects.create(name="main")
    Pool.objects.create(name="spare")
    hosts = list(Host.objects.filter(fabric__name="m").order_by("name"))
    assert len(hosts) == 4
    for host, state in zip(hosts, [Host.State.UP, Host.State.UP, Host.State.DRAINING, Host.State.UNREACHABLE]):
        host.pool, host.state = main, state
        host.save()
    gpus = {h.name: list(Gpu.objects.filter(host=h).order_by("index")) for h in hosts}
    h1, h2, h3, _ = (gpus[h.name] for h in hosts)
    for gpu, util in zip(h1, [80.0, 80.0, 1.0, 1.0]):
        gpu.utilization = util
        gpu.save()
    for gpu in h3:
        gpu.utilization = 10.0
        gpu.present = gpu.index != 3
        gpu.save()
    h2[2].foreign_busy_until = timezone.now() + timedelta(minutes=5)
    h2[2].save()

    physics = Tenant.objects.create(name="physics")
    Tenant.objects.create(name="idle-tenant")
    running = Job.objects.create(tenant=physics, pool=main, gpus=4, command=["train"], state=Job.State.RUNNING)
    proposed = Job.objects.create(tenant=physics, pool=main, gpus=2, command=["eval"], state=Job.State.PROPOSED)
    p1 = Placement.objects.create(job=running, state=Placement.State.RUNNING)
    p2 = Placement.objects.create(job=proposed, state=Placement.State.PROPOSED,
                                  created_at=timezone.now() - timedelta(seconds=120))
    PlacementGpu.objects.bulk_create([PlacementGpu(placement=p1, gpu=g) for g in h1]
                                     + [PlacementGpu(placement=p2, gpu=g) for g in h2[:2]])
    for reason in ["resources", "resources", "", "some_future_reason"]:
        Job.objects.create(tenant=physics, pool=main, gpus=8, command=["x"], pending_reason=reason)
    Job.objects.create(tenant=physics, pool=main, gpus=8, command=["x"], state=Job.State.SUCCEEDED)

    now = timezone.now()
    for started, parts in [(now, (0.1, 0.1, 0.1)), (now, (0.5, 0.5, 0.5)), (now - timedelta(hours=2), (50, 50, 0))]:
        AllocationCycle.objects.create(started_at=started, finished_at=started, snapshot_s=parts[0], plan_s=parts[1],
                                       persist_s=parts[2])
    AllocationCycle.objects.create(started_at=now)  # still running: no duration yet
    for started, duration in [(now, 2.0), (now, 0.05), (now - timedelta(hours=2), 99.0)]:
        PollRound.objects.create(started_at=started, finished_at=started, duration_s=duration)
    link = Link.objects.filter(fabric__name="m").first()
    link.state = Link.State.DEGRADED
    link.save()
    return {"main": main, "hosts": hosts}


@pytest.fixture
def admin_client(db):
    client = Client()
    client.force_login(make_user("root", "admin"))
    return client


# --- values ---------------------------------------------------------------------------------


def test_values_match_the_database(scene, admin_client, django_assert_max_num_queries):
    with django_assert_max_num_queries(17):  # fixed, whatever the cluster: 14 + session, user, role
        text = scrape(admin_client)
    m = samples(text)

    gpus = {state: value(m, "fabricpool_gpus", pool="main", state=state) for state in GPU_STATES}
    assert gpus == {"allocated": 4, "idle_allocated": 2, "foreign": 1, "free": 1, "draining": 3, "missing": 1,
                    "unhealthy": 4, "unmanaged": 0}
    assert all(value(m, "fabricpool_gpus", pool="spare", state=s) == 0 for s in GPU_STATES)

    # present GPUs with a reading on up/draining hosts: 80, 80, 1, 1, 10, 10, 10 %
    assert value(m, "fabricpool_pool_gpu_utilization_ratio", pool="main") == pytest.approx(192 / 7 / 100)
    assert value(m, "fabricpool_pool_gpu_allocation_ratio", pool="main") == pytest.approx(6 / 15)
    assert value(m, "fabricpool_tenant_allocated_gpus", tenant="physics") == 6
    assert value(m, "fabricpool_tenant_gpu_utilization_ratio", tenant="physics") == pytest.approx(0.405)
    assert value(m, "fabricpool_tenant_allocated_gpus", tenant="idle-tenant") == 0

    assert value(m, "fabricpool_queue_jobs", pool="main", reason="resources") == 2
    assert value(m, "fabricpool_queue_jobs", pool="main", reason="new") == 1
    assert value(m, "fabricpool_queue_jobs", pool="main", reason="other") == 1
    assert value(m, "fabricpool_queue_jobs", pool="main", reason="quota") == 0
    assert value(m, "fabricpool_proposals_waiting", pool="main") == 1
    assert value(m, "fabricpool_proposal_oldest_age_seconds", pool="main") >= 120

    assert value(m, "fabricpool_agents_up", pool="main") == 2
    assert value(m, "fabricpool_hosts", pool="main", state="unreachable") == 1
    assert value(m, "fabricpool_hosts", pool="main", state="draining") == 1
    links = Link.objects.filter(fabric__name="m").count()
    assert value(m, "fabricpool_links", fabric="m", state="degraded") == 1
    assert value(m, "fabricpool_links", fabric="m", state="up") == links - 1

    # Histograms hold only the window's rows: the 2-hour-old cycle and round are left out.
    cycle = "fabricpool_allocation_cycle_duration_seconds"
    assert value(m, cycle + "_count") == 2
    assert value(m, cycle + "_sum") == pytest.approx(1.8)
    assert value(m, cycle + "_bucket", le="0.5") == 1
    assert value(m, cycle + "_bucket", le="2.0") == 2
    assert value(m, cycle + "_bucket", le="+Inf") == 2
    poll = "fabricpool_poll_round_duration_seconds"
    assert value(m, poll + "_count") == 2
    assert value(m, poll + "_sum") == pytest.approx(2.05)
    assert value(m, poll + "_bucket", le="0.1") == 1
    assert value(m, "fabricpool_last_run_timestamp_seconds", kind="poll_round") > 0


def test_every_metric_follows_the_naming_conventions(scene, admin_client):
    for family in text_string_to_metric_families(scrape(admin_client)):
        assert family.name.startswith("fabricpool_")
        assert not family.name.endswith("_total") or family.type == "counter", family.name
        assert family.documentation, family.name
        if family.name.endswith("_ratio"):
            assert all(0.0 <= s.value <= 1.0 for s in family.samples), family.name


def test_label_sets_are_bounded(scene, admin_client):
    """Labels are pool, tenant, fabric and fixed vocabularies, never hosts: 40 more hosts
    with 8 GPUs each in the same pool change values, not the number of series."""
    text = scrape(admin_client)
    host_names = {h.name for h in scene["hosts"]}
    vocab = {"state": set(GPU_STATES) | set(Host.State.values) | set(Link.State.values), "reason": set(QUEUE_REASONS),
             "kind": {"allocation_cycle", "poll_round"}}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            assert set(s.labels) <= {"pool", "tenant", "fabric", "state", "reason", "kind", "le"}, s
            assert not host_names & set(s.labels.values()), s
            for label, allowed in vocab.items():
                if label in s.labels:
                    assert s.labels[label] in allowed, s
    before = len(samples(text))
    extra = Host.objects.bulk_create([Host(name=f"extra{i:03d}", pool=scene["main"], state=Host.State.UP) for i in range(40)])
    Gpu.objects.bulk_create([Gpu(host=h, index=i, model="NVIDIA H100 80GB HBM3") for h in extra for i in range(8)])
    after = samples(scrape(admin_client))
    assert value(after, "fabricpool_gpus", pool="main", state="free") == 1 + 40 * 8
    assert value(after, "fabricpool_agents_up", pool="main") == 2 + 40
    assert len(after) == before
    # Hosts in no pool are one more pool value, "(none)", not one series each.
    Host.objects.filter(name__startswith="extra").update(pool=None)
    unpooled = samples(scrape(admin_client))
    assert value(unpooled, "fabricpool_gpus", pool="(none)", state="free") == 40 * 8
    assert value(unpooled, "fabricpool_gpus", pool="main", state="free") == 1


# --- who may scrape ---------------------------------------------------------------------


@override_settings(**OPEN)
def test_anonymous_scrape_without_any_guard_configured_is_refused(db):
    response = Client().get("/metrics")
    assert response.status_code == 403  # not a redirect to the login page
    assert "METRICS_TOKEN" in response.content.decode() and "METRICS_ALLOWED_IPS" in response.content.decode()


@override_settings(**OPEN)
def test_admin_session_may_read_but_viewer_and_operator_may_not(scene, admin_client):
    assert "fabricpool_gpus" in scrape(admin_client)
    for role in ("viewer", "operator"):
        client = Client()
        client.force_login(make_user(f"u-{role}", role))
        assert client.get("/metrics").status_code == 403


@override_settings(METRICS_TOKEN=TOKEN, METRICS_ALLOWED_IPS=[])
def test_bearer_token(scene):
    assert "fabricpool_gpus" in scrape(HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    for header in [None, "Bearer wrong-token-0123456789xx", f"Basic {TOKEN}", f"Bearer {TOKEN}x", "Bearer"]:
        extra = {"HTTP_AUTHORIZATION": header} if header else {}
        response = Client().get("/metrics", **extra)
        assert response.status_code == 401, header
        assert response["WWW-Authenticate"].startswith("Bearer")
        assert b"fabricpool_" not in response.content


@override_settings(METRICS_TOKEN="", METRICS_ALLOWED_IPS=["10.0.0.0/8", "192.0.2.7", "2001:db8::/32"])
def test_address_allow_list_reads_remote_addr_not_forwarded_headers(scene):
    assert scrape(REMOTE_ADDR="10.1.2.3")
    assert scrape(REMOTE_ADDR="192.0.2.7")
    assert scrape(REMOTE_ADDR="2001:db8::5")
    assert scrape(REMOTE_ADDR="::ffff:10.9.9.9")
    for address in ["192.0.2.8", "127.0.0.1", "2001:db9::1"]:
        assert Client().get("/metrics", REMOTE_ADDR=address).status_code == 403, address
    spoofed = Client().get("/metrics", REMOTE_ADDR="203.0.113.1", HTTP_X_FORWARDED_FOR="10.0.0.1")
    assert spoofed.status_code == 403


@override_settings(METRICS_TOKEN=TOKEN, METRICS_ALLOWED_IPS=["10.0.0.0/8"])
def test_token_and_allow_list_together_both_must_pass(scene):
    assert scrape(REMOTE_ADDR="10.0.0.2", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert Client().get("/metrics", REMOTE_ADDR="10.0.0.2").status_code == 401
    assert Client().get("/metrics", REMOTE_ADDR="172.16.0.1", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 403


@override_settings(METRICS_TOKEN="", METRICS_ALLOWED_IPS=["10.0.0.0/33"])
def test_a_bad_allow_list_entry_is_named(db):
    with pytest.raises(ImproperlyConfigured, match="10.0.0.0/33"):
        Client().get("/metrics", REMOTE_ADDR="10.0.0.1")


@override_settings(METRICS_TOKEN=TOKEN, METRICS_ALLOWED_IPS=[])
def test_only_get_and_head(db):
    client = Client(enforce_csrf_checks=False)
    assert client.post("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 405
    assert client.head("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 200


def test_a_short_token_stops_the_start():
    env = {**os.environ, "METRICS_TOKEN": "short", "DJANGO_SETTINGS_MODULE": "config.settings.test"}
    result = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode != 0
    assert "METRICS_TOKEN must be at least 16 characters" in result.stderr


# --- the Grafana dashboard ----------------------------------------------------------------

PROMQL_WORDS = {
    "sum", "avg", "min", "max", "count", "by", "without", "histogram_quantile", "rate", "irate", "increase", "clamp_min",
    "clamp_max", "topk", "bottomk", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "offset",
    "bool", "time", "vector", "scalar", "label_replace", "abs", "avg_over_time", "max_over_time", "min_over_time",
    "delta", "deriv", "sort", "sort_desc", "absent", "changes", "resets", "le",
}


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects: identifiers outside strings, label
    matchers ({...}), grouping clauses (by (...)), durations ([5m]) and Grafana variables."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\$\{?\w+\}?", "0", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", expr):
        word = match.group(0)
        following = expr[match.end():].lstrip()[:1]
        if word in PROMQL_WORDS or following == "(" or re.fullmatch(r"\d+\w*", word):
            continue
        names.add(word)
    return names


def panel_targets(dashboard):
    for panel in dashboard["panels"]:
        yield from ((panel, target) for target in panel.get("targets", []))
        for inner in panel.get("panels", []):
            yield from ((inner, target) for target in inner.get("targets", []))


def test_metric_names_are_found_in_promql():
    assert metric_names('histogram_quantile(0.95, sum by (le) (fabricpool_x_bucket{pool=~"$pool"}))') == {"fabricpool_x_bucket"}
    assert metric_names("sum(a) / clamp_min(sum(b), 1)") == {"a", "b"}


def test_grafana_dashboard_uses_only_exposed_metrics(scene, admin_client):
    exposed = set()
    for family in text_string_to_metric_families(scrape(admin_client)):
        exposed |= {s.name for s in family.samples}
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    targets = list(panel_targets(dashboard))
    assert len(targets) >= 8
    used = set()
    for panel, target in targets:
        names = metric_names(target["expr"])
        assert names, f"panel {panel['title']!r}: no metric in {target['expr']!r}"
        assert names <= exposed, f"panel {panel['title']!r} uses {names - exposed} which /metrics does not expose"
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        used |= names
    for required in ["fabricpool_gpus", "fabricpool_pool_gpu_utilization_ratio", "fabricpool_tenant_gpu_utilization_ratio",
                     "fabricpool_queue_jobs", "fabricpool_allocation_cycle_duration_seconds_bucket",
                     "fabricpool_poll_round_duration_seconds_bucket", "fabricpool_agents_up", "fabricpool_links",
                     "fabricpool_proposals_waiting"]:
        assert required in used, f"no panel shows {required}"
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
            match = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", query)
            assert match and match[1] in exposed, query
