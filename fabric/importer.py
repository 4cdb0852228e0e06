"""Import a parsed topology into the database as a diff against what is there.

One transaction per import, with the fabric row locked so that two imports of the same
fabric run one after the other. New switches, adapters and links are added; vanished ones
are marked missing, never deleted; changed speed, width, LID or description is updated.
Every change is a FabricEvent. An unchanged file changes nothing but `last_seen`.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from django.db import transaction
from django.utils import timezone

from . import ibnetdiscover as ibd
from .models import ChannelAdapter, Fabric, FabricEvent, Link, Port, Switch, guid_hex, validate_fabric_name
from .signals import topology_imported
from .tiers import infer_tiers

SWITCH_FIELDS = ("description", "system_image_guid", "vendor_id", "device_id", "num_ports", "lid", "lmc", "enhanced_port0", "tier")
ADAPTER_FIELDS = ("description", "system_image_guid", "vendor_id", "device_id", "num_ports", "kind", "host_name", "is_aggregation_node")
SUMMARY_ORDER = [
    ("switch_added", "switches added"),
    ("switch_missing", "switches missing"),
    ("switch_returned", "switches returned"),
    ("switch_changed", "switches changed"),
    ("adapter_added", "adapters added"),
    ("adapter_missing", "adapters missing"),
    ("adapter_returned", "adapters returned"),
    ("adapter_changed", "adapters changed"),
    ("link_added", "links added"),
    ("link_missing", "links missing"),
    ("link_returned", "links returned"),
    ("link_changed", "links changed"),
]


@dataclass
class ImportResult:
    fabric: Fabric
    first_import: bool
    changes: Counter = field(default_factory=Counter)
    warnings: list[str] = field(default_factory=list)
    switches: int = 0
    adapters: int = 0
    links: int = 0
    messages: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return any(self.changes.values())

    def summary(self) -> str:
        head = f"fabric {self.fabric.name}: {self.switches} switches, {self.adapters} adapters, {self.links} links"
        if self.first_import:
            return head + " (first import)"
        parts = [f"{self.changes[k]} {label}" for k, label in SUMMARY_ORDER if self.changes[k]]
        return head + (": " + ", ".join(parts) if parts else ": no changes")


def link_key(a: tuple[int, int], b: tuple[int, int]) -> str:
    (ga, pa), (gb, pb) = sorted((a, b))
    return f"{ga:016x}:{pa}-{gb:016x}:{pb}"


def _node_values(node: ibd.Node, tier: str | None) -> dict:
    values = {
        "description": node.description.strip()[:200],
        "system_image_guid": guid_hex(node.system_image_guid) if node.system_image_guid is not None else "",
        "vendor_id": node.vendor_id,
        "device_id": node.device_id,
        "num_ports": min(node.num_ports, 32767),
    }
    if node.kind == ibd.SWITCH:
        values.update(lid=node.lid, lmc=node.lmc, enhanced_port0=node.enhanced_port0, tier=tier)
    else:
        values.update(
            kind=ChannelAdapter.Kind.ROUTER if node.kind == ibd.ROUTER else ChannelAdapter.Kind.CA,
            host_name=(ibd.host_name_from_description(node.description) or "")[:200],
            is_aggregation_node=node.is_aggregation_node,
        )
    return values


def import_file(source, fabric_name: str, source_name: str = "") -> ImportResult:
    """Parse then import. Raises ibnetdiscover.TopologyError before touching the database."""
    validate_fabric_name(fabric_name)  # before reading a possibly large file
    topo = ibd.parse(source)
    return import_topology(topo, fabric_name, source_name)


def import_topology(topo: ibd.Topology, fabric_name: str, source_name: str = "") -> ImportResult:
    validate_fabric_name(fabric_name)
    now = timezone.now()
    with transaction.atomic():
        fabric, _ = Fabric.objects.get_or_create(name=fabric_name)
        fabric = Fabric.objects.select_for_update().get(pk=fabric.pk)
        first = not Link.objects.filter(fabric=fabric).exists() and not Switch.objects.filter(fabric=fabric).exists() and not ChannelAdapter.objects.filter(fabric=fabric).exists()
        result = ImportResult(fabric=fabric, first_import=first, warnings=list(topo.warnings))
        events: list[FabricEvent] = []
        tiers = infer_tiers(topo)

        switches = _sync_nodes(fabric, topo, Switch, SWITCH_FIELDS, "switch", tiers, now, result, events)
        adapters = _sync_nodes(fabric, topo, ChannelAdapter, ADAPTER_FIELDS, "adapter", tiers, now, result, events)
        ports = _sync_ports(fabric, topo, switches, adapters, now, result, events)
        _sync_links(fabric, topo, ports, now, result, events)

        for warning in topo.warnings:
            events.append(FabricEvent(fabric=fabric, created_at=now, kind=FabricEvent.Kind.IMPORT_WARNING,
                                      severity=FabricEvent.Severity.WARNING, message=warning[:500]))
        if first:
            # One event for the first import, not one per cable.
            events = [e for e in events if e.kind == FabricEvent.Kind.IMPORT_WARNING]
            events.append(FabricEvent(fabric=fabric, created_at=now, kind=FabricEvent.Kind.LINK_ADDED,
                                      message=f"first import: {result.switches} switches, {result.adapters} adapters, {result.links} links",
                                      data={"source": source_name}))
        FabricEvent.objects.bulk_create(events, batch_size=1000)
        if not first:
            result.messages = [e.message for e in events if e.kind != FabricEvent.Kind.IMPORT_WARNING]

        fabric.last_import_at = now
        fabric.last_import_source = source_name[:300]
        fabric.save(update_fields=["last_import_at", "last_import_source"])
        transaction.on_commit(lambda: topology_imported.send(sender=Fabric, fabric=fabric, result=result), robust=True)
    return result


def _sync_nodes(fabric, topo, model, fields, noun, tiers, now, result, events):
    """Returns {guid int: row id} of the nodes in the file."""
    kinds = {ibd.SWITCH} if model is Switch else {ibd.CA, ibd.ROUTER}
    wanted = {guid: node for guid, node in topo.nodes.items() if node.kind in kinds}
    existing = {int(row.guid, 16): row for row in model.objects.filter(fabric=fabric)}
    fk = noun  # FabricEvent has `switch` and `adapter` foreign keys
    to_create, to_update, returned = [], [], []
    for guid, node in wanted.items():
        values = _node_values(node, tiers.get(guid))
        row = existing.get(guid)
        if row is None:
            to_create.append(model(fabric=fabric, guid=guid_hex(guid), first_seen=now, last_seen=now, **values))
            continue
        diff = {f: [getattr(row, f), v] for f, v in values.items() if getattr(row, f) != v}
        if diff:
            for f, (_, v) in diff.items():
                setattr(row, f, v)
            to_update.append(row)
            result.changes[f"{noun}_changed"] += 1
            changes = ", ".join(f"{f} {old!r} → {new!r}" for f, (old, new) in diff.items())
            events.append(FabricEvent(fabric=fabric, created_at=now, kind=f"{noun}_changed", message=f"{noun} {row.description}: {changes}"[:500],
                                      data={f: [str(o), str(n)] for f, (o, n) in diff.items()}, **{fk: row}))
        if not row.present:
            returned.append(row.pk)
            result.changes[f"{noun}_returned"] += 1
            events.append(FabricEvent(fabric=fabric, created_at=now, kind=f"{noun}_returned", message=f"{noun} {row.description} is back", **{fk: row}))
    model.objects.bulk_create(to_create, batch_size=1000)
    for row in to_create:
        result.changes[f"{noun}_added"] += 1
        events.append(FabricEvent(fabric=fabric, created_at=now, kind=f"{noun}_added", message=f"new {noun} {row.description} (0x{row.guid})", **{fk: row}))
    if to_update:
        model.objects.bulk_update(to_update, list(fields), batch_size=1000)
    gone = [row for guid, row in existing.items() if guid not in wanted and row.present]
    for row in gone:
        result.changes[f"{noun}_missing"] += 1
        events.append(FabricEvent(fabric=fabric, created_at=now, kind=f"{noun}_missing", severity=FabricEvent.Severity.WARNING,
                                  message=f"{noun} {row.description} (0x{row.guid}) no longer discovered", **{fk: row}))
    if gone:
        model.objects.filter(pk__in=[row.pk for row in gone]).update(present=False)
    if returned:
        model.objects.filter(pk__in=returned).update(present=True)
    model.objects.filter(fabric=fabric, present=True).update(last_seen=now)
    ids = {guid: existing[guid].pk for guid in wanted if guid in existing}
    ids.update({int(row.guid, 16): row.pk for row in to_create})
    if model is Switch:
        result.switches = len(wanted)
    else:
        result.adapters = len(wanted)
    return ids


def _sync_ports(fabric, topo, switch_ids, adapter_ids, now, result, events):
    """Returns {(node guid, port number): port id} for every port the file mentions.
    A switch's LID lives on the switch row (its event comes from _sync_nodes); an adapter
    port's LID or GUID change is an `adapter_changed` event."""
    rows = Port.objects.filter(fabric=fabric).values_list("id", "switch__guid", "adapter__guid", "number", "guid", "lid")
    existing = {}
    for pid, sw_guid, ad_guid, number, pguid, lid in rows:
        existing[(int(sw_guid or ad_guid, 16), number)] = (pid, pguid, lid)
    to_create, to_update = [], []
    ids = {}
    for guid, node in topo.nodes.items():
        for number, port in node.ports.items():
            if number == 0:
                continue
            pguid = guid_hex(port.guid) if port.guid is not None else ""
            found = existing.get((guid, number))
            if found is None:
                owner = {"switch_id": switch_ids[guid]} if node.kind == ibd.SWITCH else {"adapter_id": adapter_ids[guid]}
                to_create.append(((guid, number), Port(fabric=fabric, number=number, guid=pguid, lid=port.lid, **owner)))
                continue
            pid, old_guid, old_lid = found
            ids[(guid, number)] = pid
            if (old_guid, old_lid) != (pguid, port.lid):
                to_update.append(Port(pk=pid, guid=pguid, lid=port.lid))
                if node.kind != ibd.SWITCH:
                    result.changes["adapter_changed"] += 1
                    what = []
                    if old_lid != port.lid:
                        what.append(f"LID {old_lid} → {port.lid}")
                    if old_guid != pguid:
                        what.append(f"port GUID 0x{old_guid} → 0x{pguid}")
                    events.append(FabricEvent(fabric=fabric, created_at=now, kind=FabricEvent.Kind.ADAPTER_CHANGED,
                                              adapter_id=adapter_ids[guid],
                                              message=f"adapter {node.description.strip()} port {number}: {', '.join(what)}",
                                              data={"port": number, "lid": [old_lid, port.lid], "guid": [old_guid, pguid]}))
    Port.objects.bulk_create([p for _, p in to_create], batch_size=1000)
    ids.update({key: p.pk for key, p in to_create})
    if to_update:
        Port.objects.bulk_update(to_update, ["guid", "lid"], batch_size=1000)
    return ids


def _link_kind(topo, a, b):
    na, nb = topo.nodes.get(a[0]), topo.nodes.get(b[0])
    if na is None or nb is None:
        return Link.Kind.DANGLING
    switches = (na.kind == ibd.SWITCH) + (nb.kind == ibd.SWITCH)
    if switches == 2:
        return Link.Kind.LOOPBACK if a[0] == b[0] else Link.Kind.SWITCH_SWITCH
    return Link.Kind.ADAPTER_SWITCH if switches == 1 else Link.Kind.ADAPTER_ADAPTER


def _describe_end(topo, end):
    node = topo.nodes.get(end[0])
    return f"{node.description.strip() if node else ibd.format_guid(end[0])}[{end[1]}]"


def _sync_links(fabric, topo, ports, now, result, events):
    existing = {
        key: (lid, width, speed, state)
        for lid, key, width, speed, state in Link.objects.filter(fabric=fabric).values_list("id", "key", "width", "speed", "state")
    }
    seen = set()
    to_create, to_update = [], []
    for link in topo.links:
        a, b = link.a, link.b
        if a[0] not in topo.nodes:  # keep the known end as port_a
            a, b = b, a
        key = link_key(a, b)
        seen.add(key)
        width, speed = link.width or "", link.speed or ""
        found = existing.get(key)
        name = f"{_describe_end(topo, a)} ↔ {_describe_end(topo, b)}"
        if found is None:
            row = Link(fabric=fabric, key=key, kind=_link_kind(topo, a, b), port_a_id=ports[a], port_b_id=ports.get(b),
                       width=width, speed=speed, gbps=link.gbps, first_seen=now, last_seen=now)
            if row.port_b_id is None:
                row.remote_guid, row.remote_port = guid_hex(b[0]), b[1]
                row.remote_description = link.b_description.strip()[:200]
            to_create.append((row, name))
            continue
        pk, old_width, old_speed, state = found
        changed = (old_width, old_speed) != (width, speed)
        # Only discovery marks links missing, so only discovery brings them back; a `down`
        # link belongs to the health check (a port stuck in Initialize is still discovered).
        back = state == Link.State.MISSING
        if not (changed or back):
            continue
        update = Link(pk=pk, width=width, speed=speed, gbps=link.gbps,
                      state=Link.State.UP if back else state, state_reason="" if back else "")
        to_update.append(update)
        if changed:
            result.changes["link_changed"] += 1
            events.append(FabricEvent(fabric=fabric, created_at=now, kind=FabricEvent.Kind.LINK_CHANGED, link_id=pk,
                                      severity=FabricEvent.Severity.WARNING,
                                      message=f"link {name}: {old_width}{old_speed} → {width}{speed}",
                                      data={"width": [old_width, width], "speed": [old_speed, speed]}))
        if back:
            result.changes["link_returned"] += 1
            events.append(FabricEvent(fabric=fabric, created_at=now, kind=FabricEvent.Kind.LINK_RETURNED, link_id=pk,
                                      message=f"link {name} is back ({width}{speed})"))
    Link.objects.bulk_create([row for row, _ in to_create], batch_size=1000)
    for row, name in to_create:
        result.changes["link_added"] += 1
        events.append(FabricEvent(fabric=fabric, created_at=now, kind=FabricEvent.Kind.LINK_ADDED, link=row,
                                  message=f"new link {name} ({row.width}{row.speed})"))
    if to_update:
        Link.objects.bulk_update(to_update, ["width", "speed", "gbps", "state", "state_reason"], batch_size=1000)
    gone = [pk for key, (pk, _, _, state) in existing.items() if key not in seen and state != Link.State.MISSING]
    if gone:
        names = _link_names(gone)
        Link.objects.filter(pk__in=gone).update(state=Link.State.MISSING, state_reason="not in the latest discovery")
        for pk in gone:
            result.changes["link_missing"] += 1
            events.append(FabricEvent(fabric=fabric, created_at=now, kind=FabricEvent.Kind.LINK_MISSING, link_id=pk,
                                      severity=FabricEvent.Severity.WARNING, message=f"link {names[pk]} missing from discovery"))
    Link.objects.filter(fabric=fabric).exclude(state=Link.State.MISSING).update(last_seen=now)
    result.links = len(topo.links)


def _port_label(number, switch_desc, adapter_desc):
    return f"{(switch_desc or adapter_desc or '?').strip()}[{number}]"


def _link_names(pks):
    rows = Link.objects.filter(pk__in=pks).values_list(
        "id", "port_a__number", "port_a__switch__description", "port_a__adapter__description",
        "port_b__number", "port_b__switch__description", "port_b__adapter__description", "remote_guid", "remote_port", "width", "speed",
    )
    names = {}
    for pk, an, asd, aad, bn, bsd, bad, rguid, rport, width, speed in rows:
        far = _port_label(bn, bsd, bad) if bn is not None else f"0x{rguid}[{rport}]"
        names[pk] = f"{_port_label(an, asd, aad)} ↔ {far} (was {width}{speed})"
    return names
