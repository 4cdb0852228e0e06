"""The discovery and link-health tasks, called directly (no worker), with the commands
pointed at small shell stand-ins; the real tools run in test_health_ibsim.py."""
import importlib
import shlex
import time
import uuid

import pytest
import redis
from django.apps import apps as django_apps
from django.conf import settings as django_settings
from django_celery_beat.models import PeriodicTask

from fabric import tasks
from fabric.models import ChannelAdapter, Fabric, FabricEvent, Link, Port, PortCounters, Switch
from tests.fabric.test_health import TOPOLOGY

pytestmark = pytest.mark.django_db


@pytest.fixture
def name():
    # one fabric (and so one Redis lock) per test, whatever else runs on this Redis
    return f"t-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def discover_from(settings, tmp_path):
    def point_at(data: bytes):
        path = tmp_path / "topology.txt"
        path.write_bytes(data)
        settings.IB_DISCOVER_COMMAND = shlex.join(["cat", str(path)])
    return point_at


def snapshot(fabric_name):
    fabric = Fabric.objects.filter(name=fabric_name).first()
    if fabric is None:
        return None
    return (
        fabric.last_import_at,
        sorted(Switch.objects.filter(fabric=fabric).values_list("guid", "present", "lid")),
        sorted(ChannelAdapter.objects.filter(fabric=fabric).values_list("guid", "present")),
        sorted(Port.objects.filter(fabric=fabric).values_list("id", "state", "lid")),
        sorted(Link.objects.filter(fabric=fabric).values_list("key", "state", "state_reason")),
        sorted(FabricEvent.objects.filter(fabric=fabric).exclude(kind="discovery_failed").values_list("id", flat=True)),
    )


# --- discovery --------------------------------------------------------------------------


def test_discovery_imports_the_command_output_and_a_rerun_changes_nothing(discover_from, name):
    discover_from(TOPOLOGY)
    first = tasks.discover_fabric(name)
    assert first["ok"] and first["first_import"]
    assert (first["switches"], first["adapters"], first["links"]) == (2, 2, 3)
    fabric = Fabric.objects.get(name=name)
    assert fabric.last_import_source.startswith("discover_fabric: cat ")
    before = snapshot(name)[1:]

    second = tasks.discover_fabric.run(name)  # as a worker would call it
    assert second["ok"] and not second["first_import"] and second["changes"] == {}
    assert second["summary"].endswith("no changes")
    assert snapshot(name)[1:] == before


def test_discovery_uses_the_configured_fabric_name(discover_from, settings, name):
    discover_from(TOPOLOGY)
    settings.IB_FABRIC_NAME = name
    assert tasks.discover_fabric()["fabric"] == name
    assert Switch.objects.filter(fabric__name=name).count() == 2


@pytest.mark.parametrize(
    "command, timeout, reason",
    [
        (["sh", "-c", "echo 'ibwarn: umad_open_port failed' >&2; exit 3"], 30, "exited with status 3: ibwarn: umad_open_port failed"),
        (["sleep", "10"], 0.5, "sleep 10 timed out after 0.5 s"),
        (["/nonexistent/ibnetdiscover", "-p"], 30, "/nonexistent/ibnetdiscover: command not found"),
        (["echo", "<html>502 Bad Gateway</html>"], 30, "is not a topology: line 1:"),
        (["true"], 30, "no Switch or Ca records found"),
    ],
    ids=["exit-status", "timeout", "missing-binary", "garbage", "empty"],
)
def test_failed_discovery_records_one_event_and_changes_nothing(discover_from, settings, name, command, timeout, reason):
    discover_from(TOPOLOGY)
    tasks.discover_fabric(name)
    before = snapshot(name)

    settings.IB_DISCOVER_COMMAND = shlex.join(command)
    settings.IB_DISCOVER_TIMEOUT = timeout
    started = time.monotonic()
    result = tasks.discover_fabric(name)
    assert time.monotonic() - started < 5
    assert not result["ok"] and reason in result["error"]
    (event,) = FabricEvent.objects.filter(fabric__name=name, kind="discovery_failed")
    assert event.severity == "error" and reason in event.message
    assert event.message.startswith("discovery failed, topology unchanged: ")
    assert snapshot(name) == before


def test_failure_before_any_import_is_visible_on_an_empty_fabric(settings, name):
    settings.IB_DISCOVER_COMMAND = "false"
    result = tasks.discover_fabric(name)
    assert not result["ok"]
    fabric = Fabric.objects.get(name=name)
    assert fabric.last_import_at is None and not Switch.objects.filter(fabric=fabric).exists()
    assert FabricEvent.objects.get(fabric=fabric).kind == "discovery_failed"


def test_timeout_kills_the_whole_command(settings, name, tmp_path):
    marker = tmp_path / "still-running"
    settings.IB_DISCOVER_COMMAND = shlex.join(["sh", "-c", f"(sleep 1.5; touch {marker}) & sleep 10"])
    settings.IB_DISCOVER_TIMEOUT = 0.3
    assert "timed out" in tasks.discover_fabric(name)["error"]
    time.sleep(2)
    assert not marker.exists()  # the child of the wrapper was killed too


def test_a_second_run_while_one_holds_the_lock_is_skipped(discover_from, settings, name):
    discover_from(TOPOLOGY)
    client = redis.Redis.from_url(django_settings.REDIS_URL)
    lock = client.lock(f"fabricpool:lock:discover:{name}", timeout=30)
    assert lock.acquire(blocking=False)
    try:
        result = tasks.discover_fabric(name)
    finally:
        lock.release()
    assert not result["ok"] and "is running" in result["skipped"]
    assert not Fabric.objects.filter(name=name).exists()
    assert tasks.discover_fabric(name)["ok"]  # the lock was released: the next run works


def test_redis_unreachable_means_not_running(discover_from, settings, name):
    discover_from(TOPOLOGY)
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    result = tasks.discover_fabric(name)
    assert not result["ok"] and "Redis" in result["error"]
    assert not Fabric.objects.filter(name=name).exists()


# --- link health --------------------------------------------------------------------------


@pytest.fixture
def diag_tools(settings, tmp_path):
    """iblinkinfo and perfquery stand-ins that print files we write: perfquery-<lid>.txt."""
    settings.IB_LINKINFO_COMMAND = shlex.join(["sh", "-c", f"cat {tmp_path}/iblinkinfo.txt", "iblinkinfo"])
    settings.IB_PERFQUERY_COMMAND = shlex.join(["sh", "-c", f'test "$1" = -l && test "$3" = 255 && cat {tmp_path}/perfquery-$2.txt', "perfquery"])
    settings.IB_COUNTER_MIN_INTERVAL = 0
    settings.IB_ERROR_RATE_PER_HOUR = 10.0
    return tmp_path


def linkinfo_text(leaf_port1="Active"):
    lines = [
        ("0x0000000000200000", "leaf01", 1, 1, "0x0000000000100001", 2, 1, "gpu001 mlx5_0"),
        ("0x0000000000200000", "leaf01", 1, 2, "0x0000000000100003", 5, 1, "gpu002 mlx5_0"),
        ("0x0000000000200000", "leaf01", 1, 5, "0x0000000000200002", 4, 1, "spine01"),
        ("0x0000000000200002", "spine01", 4, 1, "0x0000000000200000", 1, 5, "leaf01"),
    ]
    out = []
    for guid, desc, lid, port, rguid, rlid, rport, rdesc in lines:
        if (desc, port) == ("leaf01", 1) and leaf_port1 == "Down":
            out.append(f'{guid} "{desc:>30}" {lid:6d} {port:4d}[  ] ==(                Down/ Polling)==>             [  ] "" ( )')
        else:
            out.append(f'{guid} "{desc:>30}" {lid:6d} {port:4d}[  ] ==( 4X      25.78125 Gbps Active/  LinkUp)==>  {rguid} {rlid:6d} {rport:4d}[  ] "{rdesc}" ( )')
    return "\n".join(out) + "\n"


def perfquery_text(lid, ports, errors=None):
    blocks = []
    for port in ports:
        blocks.append(f"# Port counters: Lid {lid} port {port} (CapMask: 0x1300)\nPortSelect:......................{port}\n"
                      f"SymbolErrorCounter:..............{(errors or {}).get(port, 0)}\nPortRcvErrors:...................0\n"
                      f"PortXmitData:....................720\n")
    return "".join(blocks)


def write_round(path, leaf_errors=None, leaf_port1="Active"):
    (path / "iblinkinfo.txt").write_text(linkinfo_text(leaf_port1))
    (path / "perfquery-1.txt").write_text(perfquery_text(1, range(1, 9), leaf_errors))
    (path / "perfquery-4.txt").write_text(perfquery_text(4, range(1, 9)))


def test_link_health_reads_every_switch_and_degrades_the_erroring_link(discover_from, diag_tools, name):
    discover_from(TOPOLOGY)
    tasks.discover_fabric(name)
    write_round(diag_tools)
    first = tasks.check_link_health(name)
    assert first["ok"] and first["errors"] == []
    assert (first["switches_read"], first["ports_reported"], first["counters_stored"]) == (2, 4, 4)
    assert first["links"] == {"up": 3}
    assert PortCounters.objects.filter(port__fabric__name=name).count() == 4  # ports 3,4,6,7,8 have no cable

    write_round(diag_tools, leaf_errors={5: 50})
    second = tasks.check_link_health(name)
    assert second["became"]["degraded"] == 1 and second["links"] == {"degraded": 1, "up": 2}
    (event,) = FabricEvent.objects.filter(fabric__name=name, kind="link_degraded")
    assert "leaf01[5] ↔ spine01[1]" in event.message and "SymbolErrorCounter on leaf01[5] rose by 50" in event.message

    write_round(diag_tools, leaf_errors={5: 50}, leaf_port1="Down")
    third = tasks.check_link_health(name)
    # the uplink's counter stopped growing (rate 0): healthy again; the host link is down
    assert third["links"] == {"down": 1, "up": 2} and third["became"] == {"up": 1, "degraded": 0, "down": 1}
    assert FabricEvent.objects.get(fabric__name=name, kind="link_down").message == (
        "link leaf01[1] ↔ gpu001 mlx5_0[1] down: leaf01[1] is Down/Polling")


def test_link_health_survives_a_failing_tool_and_names_it(discover_from, diag_tools, settings, name):
    discover_from(TOPOLOGY)
    tasks.discover_fabric(name)
    write_round(diag_tools)
    (diag_tools / "perfquery-4.txt").unlink()  # spine01 does not answer
    settings.IB_LINKINFO_COMMAND = "sh -c 'echo ibwarn: no SM >&2; exit 1'"
    result = tasks.check_link_health(name)
    assert not result["ok"]
    assert result["ports_reported"] is None and result["switches_read"] == 1
    assert any(e.startswith("port states unknown: ") and "ibwarn: no SM" in e for e in result["errors"])
    assert any(e.startswith("counters of spine01 (lid 4) not read: ") for e in result["errors"])
    assert result["counters_stored"] == 3  # leaf01's cabled ports
    assert result["links"] == {"up": 3}


def test_garbage_from_perfquery_is_an_error_not_a_reading(discover_from, diag_tools, name):
    discover_from(TOPOLOGY)
    tasks.discover_fabric(name)
    write_round(diag_tools)
    (diag_tools / "perfquery-4.txt").write_text("# Port counters: Lid 9 port 1\nPortSelect:....1\nSymbolErrorCounter:...7\n")
    (diag_tools / "perfquery-1.txt").write_text("Segmentation fault\n")
    result = tasks.check_link_health(name)
    errors = " | ".join(result["errors"])
    assert "counters of spine01 (lid 4) not read: asked for lid 4, got counters of lid 9" in errors
    assert "counters of leaf01 (lid 1) not read: perfquery output line 1:" in errors
    assert result["counters_stored"] == 0 and not PortCounters.objects.exists()


def test_link_health_before_discovery_says_so(name):
    result = tasks.check_link_health(name)
    assert not result["ok"] and "run discovery first" in result["error"]
    assert not Fabric.objects.filter(name=name).exists()


def test_link_health_skips_switches_iblinkinfo_did_not_reach(discover_from, diag_tools, name):
    discover_from(TOPOLOGY)
    tasks.discover_fabric(name)
    write_round(diag_tools)
    text = "".join(line + "\n" for line in linkinfo_text().splitlines() if not line.startswith("0x0000000000200002"))
    (diag_tools / "iblinkinfo.txt").write_text(text)
    result = tasks.check_link_health(name)
    assert (result["switches_read"], result["switches_unreachable"], result["unreachable"]) == (1, 1, ["spine01"])


# --- beat schedule ----------------------------------------------------------------------


def test_periodic_jobs_exist_disabled_and_the_migration_reverses():
    jobs = {job.name: job for job in PeriodicTask.objects.filter(name__startswith="fabric: ")}
    assert set(jobs) == {"fabric: discover", "fabric: link health"}
    discover, health = jobs["fabric: discover"], jobs["fabric: link health"]
    assert (discover.task, discover.interval.every, discover.interval.period, discover.enabled) == ("fabric.tasks.discover_fabric", 5, "minutes", False)
    assert (health.task, health.interval.every, health.interval.period, health.enabled) == ("fabric.tasks.check_link_health", 60, "seconds", False)
    assert {tasks.discover_fabric.name, tasks.check_link_health.name} == {discover.task, health.task}

    migration = importlib.import_module("fabric.migrations.0002_discovery_schedule")
    [operation] = migration.Migration.operations
    operation.reverse_code(django_apps, None)
    assert not PeriodicTask.objects.filter(name__startswith="fabric: ").exists()
    operation.code(django_apps, None)
    operation.code(django_apps, None)  # idempotent
    assert PeriodicTask.objects.filter(name__startswith="fabric: ", enabled=False).count() == 2


def test_an_invalid_fabric_name_is_refused_before_running_anything(settings, tmp_path):
    marker = tmp_path / "ran"
    settings.IB_DISCOVER_COMMAND = shlex.join(["touch", str(marker)])
    result = tasks.discover_fabric("my fabric; rm -rf /")
    assert not result["ok"] and "must be 1-64 letters" in result["error"]
    assert not marker.exists() and not Fabric.objects.exists()


def test_discovery_that_loses_most_switches_is_refused(discover_from, name):
    from tests.conftest import read_sample

    lab = read_sample("ibnetdiscover_nvidia_topograph_dgx_h100_ndr_40sw_582ca_railopt.txt")
    discover_from(lab)
    assert tasks.discover_fabric(name)["ok"]
    before = snapshot(name)
    # The discovery host's own cable is down: ibnetdiscover sees one lone CA and exits 0.
    discover_from(read_sample("ibnetdiscover_nvidia_topograph_example-bad_single_ca_gb200.txt"))
    result = tasks.discover_fabric(name)
    assert not result["ok"] and "found 0 of 40 known switches" in result["error"]
    assert snapshot(name) == before
    event = FabricEvent.objects.get(fabric__name=name, kind="discovery_failed")
    assert "discovery host's own link down" in event.message


def test_incomplete_link_health_check_is_an_event(discover_from, diag_tools, settings, name):
    discover_from(TOPOLOGY)
    tasks.discover_fabric(name)
    settings.IB_LINKINFO_COMMAND = "false"
    result = tasks.check_link_health(name)
    assert not result["ok"]
    event = FabricEvent.objects.get(fabric__name=name, kind="health_check_failed")
    assert "port states unknown" in event.message
