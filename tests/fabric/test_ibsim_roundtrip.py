"""A built fat tree, served by ibsim and discovered by the real ibnetdiscover, imports as the
same fabric; a cable pulled at the simulator's console shows up as exactly that missing
link, and comes back after ReLink and an SM sweep.

ibsim 0.10 has no NDR, so these fabrics run at EDR or HDR. GUIDs differ (ibsim makes its
own), so summaries are compared without them."""
import copy

import pytest
from django.core.management import call_command

from fabric.ibsim import SimulatedFabric, missing_tools
from fabric.importer import import_file
from fabric.models import Fabric, FabricEvent, Link
from fabric.summary import fabric_summary

pytestmark = [
    pytest.mark.ibsim,
    pytest.mark.skipif(bool(missing_tools()), reason=f"ibsim tools missing: {', '.join(missing_tools())}"),
    pytest.mark.django_db,
]

# (build_fattree options, the cable to pull: (switch, port), the far end it must name)
SHAPES = {
    "two-tier": (
        dict(spines=2, leaves=4, hosts_per_leaf=4, speed="EDR"),
        ("leaf002", 6), ("spine02", 2),  # leaf002's second uplink
    ),
    "three-tier": (
        dict(spines=4, leaves=8, hosts_per_leaf=2, pods=2, speed="HDR"),
        ("p2-spine04", 6), ("core02", 4),  # a spine-core cable: pod 2 loses half its way out
    ),
    "rail-optimized": (
        dict(spines=2, leaves=4, hosts_per_leaf=4, hcas_per_host=2, speed="HDR"),
        ("leaf003", 5), ("spine01", 3),  # rail-0 leaf of the second host group
    ),
}


def summary(name):
    data = fabric_summary(Fabric.objects.get(name=name))
    data.pop("fabric")
    for leaf in data["leaves"]:
        leaf.pop("guid")
    return data


def new_events(name, after_id):
    return list(FabricEvent.objects.filter(fabric__name=name, id__gt=after_id).values_list("kind", "message"))


def last_event_id():
    return FabricEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0


def link_ends(link):
    return {(port.owner.description, port.number) for port in (link.port_a, link.port_b)}


@pytest.mark.parametrize("shape", SHAPES)
def test_simulated_discovery_matches_the_built_fabric(shape, tmp_path):
    options, (switch, port), far = SHAPES[shape]
    net = tmp_path / "net"
    call_command("build_fattree", fabric="built", ibsim_net=str(net), verbosity=0, **options)
    built = summary("built")

    with SimulatedFabric(net.read_text()) as sim:
        discovered = tmp_path / "discovered.txt"
        discovered.write_text(sim.run("ibnetdiscover"))
        call_command("import_ibnetdiscover", str(discovered), fabric="sim", verbosity=0)
        assert summary("sim") == built

        # Pull one cable: exactly that link goes missing, nothing else changes.
        before = last_event_id()
        sim.console(f'Unlink "{switch}"[{port}]')
        result = import_file(sim.run("ibnetdiscover").encode(), "sim")
        assert dict(result.changes) == {"link_missing": 1}
        events = new_events("sim", before)
        assert [kind for kind, _ in events] == ["link_missing"]
        assert f"{switch}[{port}]" in events[0][1] and f"{far[0]}[{far[1]}]" in events[0][1]
        missing = Link.objects.get(fabric__name="sim", state=Link.State.MISSING)
        assert link_ends(missing) == {(switch, port), far}
        expected = copy.deepcopy(built)
        expected["links"]["switch_switch"] -= 1
        expected["links"]["up"] -= 1
        expected["links"]["missing"] += 1
        for leaf in expected["leaves"]:
            if leaf["name"] == switch:  # a leaf uplink: that leaf has less bandwidth up
                leaf["uplink_gbps"] -= missing.gbps
                leaf["oversubscription"] = round(leaf["downlink_gbps"] / leaf["uplink_gbps"], 2)
        assert summary("sim") == expected

        # Plug it back in; once the SM has swept, discovery finds it again.
        before = last_event_id()
        sim.console(f'ReLink "{switch}"[{port}]')
        sim.sweep()
        result = import_file(sim.run("ibnetdiscover").encode(), "sim")
        assert dict(result.changes) == {"link_returned": 1}
        assert [kind for kind, _ in new_events("sim", before)] == ["link_returned"]
        assert Link.objects.get(pk=missing.pk).state == Link.State.UP
        assert summary("sim") == built
