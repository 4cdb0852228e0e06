"""Discovery and link health with the real ibnetdiscover, iblinkinfo and perfquery
against an ibsim fabric: errors injected at the simulator's console and cables pulled.

    spine01        spine02
     [1] [2]       [1] [2]
      |    \\       /    |
      |     \\_____/__   |
      |      ____/   \\  |
     [5] [6]          [5] [6]
     leaf01            leaf02
     [1] [2]           [1] [2]
    gpu001 gpu002    gpu003 gpu004
"""
import shlex
import uuid

import pytest

from fabric import tasks
from fabric.ibsim import SimulatedFabric, missing_tools
from fabric.models import FabricEvent, Link, Port

pytestmark = [
    pytest.mark.ibsim,
    pytest.mark.django_db,
    pytest.mark.skipif(bool(missing_tools()), reason=f"ibsim tools missing: {', '.join(missing_tools())} (Debian: ibsim-utils infiniband-diags opensm)"),
]

# e=2: EDR, on both ends (the active speed is the highest one both ends enable)
NET = """
Switch 8 "leaf01"
[1] "gpu001 mlx5_0"[1] e=2
[2] "gpu002 mlx5_0"[1] e=2
[5] "spine01"[1] e=2
[6] "spine02"[1] e=2

Switch 8 "leaf02"
[1] "gpu003 mlx5_0"[1] e=2
[2] "gpu004 mlx5_0"[1] e=2
[5] "spine01"[2] e=2
[6] "spine02"[2] e=2

Switch 8 "spine01"
[1] "leaf01"[5] e=2
[2] "leaf02"[5] e=2

Switch 8 "spine02"
[1] "leaf01"[6] e=2
[2] "leaf02"[6] e=2

Hca 1 "gpu001 mlx5_0"
[1] "leaf01"[1] e=2

Hca 1 "gpu002 mlx5_0"
[1] "leaf01"[2] e=2

Hca 1 "gpu003 mlx5_0"
[1] "leaf02"[1] e=2

Hca 1 "gpu004 mlx5_0"
[1] "leaf02"[2] e=2
"""

HEALTH_EVENTS = ("link_degraded", "link_down", "link_healthy")


@pytest.fixture
def sim(settings):
    with SimulatedFabric(NET) as fabric:
        settings.IB_DISCOVER_COMMAND = shlex.join(fabric.command("ibnetdiscover"))
        settings.IB_LINKINFO_COMMAND = shlex.join(fabric.command("iblinkinfo"))
        settings.IB_PERFQUERY_COMMAND = shlex.join(fabric.command("perfquery"))
        settings.IB_FABRIC_NAME = f"sim-{uuid.uuid4().hex[:8]}"
        settings.IB_ERROR_RATE_PER_HOUR = 10.0
        settings.IB_COUNTER_MIN_INTERVAL = 0  # checks follow each other within a second here
        yield fabric


def link_at(description, number):
    for link in Link.objects.select_related("port_a__switch", "port_a__adapter", "port_b__switch", "port_b__adapter"):
        for port in (link.port_a, link.port_b):
            if port and port.owner.description == description and port.number == number:
                return link
    raise AssertionError(f"no link at {description}[{number}]")


def health_events():
    return list(FabricEvent.objects.filter(kind__in=HEALTH_EVENTS).order_by("id"))


def test_symbol_errors_degrade_exactly_that_link_then_it_recovers(sim):
    found = tasks.discover_fabric()
    assert found["ok"] and (found["switches"], found["adapters"], found["links"]) == (4, 4, 8)
    assert set(Link.objects.values_list("speed", "width")) == {("EDR", "4x")}

    first = tasks.check_link_health()
    assert first["ok"], first["errors"]
    assert (first["switches_read"], first["counters_stored"], first["links"]) == (4, 12, {"up": 8})
    assert health_events() == []

    sim.console('PerformanceSet "leaf01"[5] PortCounters.SymbolErrorCounter=50')
    second = tasks.check_link_health()
    assert second["links"] == {"degraded": 1, "up": 7}
    uplink = link_at("leaf01", 5)
    assert uplink.state == "degraded"
    assert uplink.state_reason.startswith("SymbolErrorCounter on leaf01[5] rose by 50 in ")
    (event,) = health_events()
    assert (event.kind, event.link_id, event.severity) == ("link_degraded", uplink.pk, "warning")
    assert event.message.startswith("link leaf01[5] ↔ spine01[1] degraded: SymbolErrorCounter on leaf01[5] rose by 50")

    third = tasks.check_link_health()  # the counter no longer grows
    assert third["links"] == {"up": 8}
    assert [e.kind for e in health_events()] == ["link_degraded", "link_healthy"]
    assert health_events()[1].message.startswith("link leaf01[5] ↔ spine01[1] healthy again (was degraded: SymbolErrorCounter")


def test_pulled_cable_is_down_then_missing_then_back(sim):
    assert tasks.discover_fabric()["ok"]
    assert tasks.check_link_health()["links"] == {"up": 8}

    # ibsim's Unlink puts both ends to Down/Polling; gpu003 has no other cable, so it drops
    # out of iblinkinfo entirely and the leaf's port tells the story.
    sim.console('Unlink "leaf02"[1]')
    result = tasks.check_link_health()
    assert result["links"] == {"down": 1, "up": 7}
    host_link = link_at("leaf02", 1)
    assert (host_link.state, host_link.state_reason) == ("down", "leaf02[1] is Down/Polling")
    (event,) = health_events()
    assert event.kind == "link_down" and event.message == "link leaf02[1] ↔ gpu003 mlx5_0[1] down: leaf02[1] is Down/Polling"
    assert Port.objects.get(switch__description="leaf02", number=1).state == "down"

    # discovery no longer sees the cable: it becomes missing, which health leaves alone
    assert tasks.discover_fabric()["changes"] == {"adapter_missing": 1, "link_missing": 1}
    assert link_at("leaf02", 1).state == "missing"
    assert tasks.check_link_health()["links"] == {"up": 7}
    assert link_at("leaf02", 1).state == "missing" and len(health_events()) == 1

    # plugged back: Initialize until the SM sweeps, then Active; discovery brings it back
    sim.console('ReLink "leaf02"[1]')
    sim.sweep()
    assert tasks.discover_fabric()["changes"] == {"adapter_returned": 1, "link_returned": 1}
    assert tasks.check_link_health()["links"] == {"up": 8}
