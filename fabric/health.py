"""Link health from port counters (perfquery) and port states (iblinkinfo).

`apply_health` stores each port's latest counters with the error rates since the reading
before, then sets every link that discovery knows (not `missing`: discovery owns that):

* `down` when iblinkinfo reports a port of the link in any state but Active;
* `degraded` when an error counter of either end grows faster than
  settings.IB_ERROR_RATE_PER_HOUR (or is stuck at its maximum, so that it cannot tell);
* `up` again once there is evidence: the port is Active again, or the rates were
  measured and are below the limit. No evidence (a switch that did not answer, a first
  reading) changes nothing.

Each change is a FabricEvent whose message names both ends, the counter and its rate.
Everything runs in one transaction with the fabric row locked, like an import.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from . import linkinfo, perfquery
from .models import Fabric, FabricEvent, Link, Port, PortCounters

# Counters that count faults on the link or the port (rdma-core's ibqueryerrors list, less
# VL15Dropped and PortXmitWait, which count SMP drops and congestion, not a bad link).
ERROR_COUNTERS = (
    "SymbolErrorCounter",
    "LinkErrorRecoveryCounter",
    "LinkDownedCounter",
    "PortRcvErrors",
    "PortRcvRemotePhysicalErrors",
    "PortRcvSwitchRelayErrors",
    "PortXmitDiscards",
    "PortXmitConstraintErrors",
    "PortRcvConstraintErrors",
    "LocalLinkIntegrityErrors",
    "ExcessiveBufferOverrunErrors",
)

PORT_STATE_BY_IB_STATE = {"Active": Port.State.ACTIVE, "Down": Port.State.DOWN}


@dataclass
class Reading:
    """Counters read from one port of the node with GUID `node_guid` at `read_at`."""

    node_guid: int
    counters: perfquery.PortCounters
    read_at: datetime


@dataclass
class _Over:
    port_id: int
    port_label: str
    counter: str
    rate: float | None  # None: saturated, cannot be measured
    delta: int = 0
    seconds: float = 0.0

    def describe(self, limit: float) -> str:
        if self.rate is None:
            return (f"{self.counter} on {self.port_label} is stuck at its maximum, so its rate cannot be "
                    f"measured: reset the port's counters (perfquery -R)")
        return (f"{self.counter} on {self.port_label} rose by {self.delta} in {_duration(self.seconds)} "
                f"= {self.rate:.1f}/h (limit {limit:g}/h)")

    def as_data(self) -> dict:
        return {"port": self.port_label, "counter": self.counter, "rate_per_hour": self.rate, "delta": self.delta, "seconds": round(self.seconds, 1)}


@dataclass
class _PortEvidence:
    measured: bool = False  # rates computed over a long enough interval
    over: list[_Over] = field(default_factory=list)


@dataclass
class _PortRow:
    pk: int
    number: int
    state: str
    label: str


@dataclass
class HealthResult:
    fabric: Fabric
    counters_stored: int = 0
    readings_unmatched: list[str] = field(default_factory=list)
    ports_unmatched: list[str] = field(default_factory=list)
    changes: dict[str, int] = field(default_factory=lambda: {"up": 0, "degraded": 0, "down": 0})
    states: dict[str, int] = field(default_factory=dict)

    def summary(self) -> dict:
        return {
            "fabric": self.fabric.name,
            "counters_stored": self.counters_stored,
            "became": dict(self.changes),
            "links": dict(self.states),
            "unmatched_readings": len(self.readings_unmatched),
            "unmatched_ports": len(self.ports_unmatched),
        }


def _duration(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _label(port: Port) -> str:
    owner = port.switch if port.switch_id else port.adapter
    return f"{(owner.description if owner else '?').strip()}[{port.number}]"


def _link_name(link: Link, first_port_id: int | None = None) -> str:
    """`a ↔ b`, with the end that explains the change first."""
    far = _label(link.port_b) if link.port_b_id else f"{link.remote_description.strip() or '0x' + link.remote_guid}[{link.remote_port}]"
    if link.port_b_id and first_port_id == link.port_b_id:
        return f"{far} ↔ {_label(link.port_a)}"
    return f"{_label(link.port_a)} ↔ {far}"


def _rates(previous: PortCounters | None, reading: Reading, port: _PortRow, min_interval: float, limit: float) -> tuple[dict, _PortEvidence, bool]:
    """(rates per hour, evidence, keep_previous). A counter lower than before was reset:
    what it shows now counted since the reset, which is a lower bound of the growth."""
    values = reading.counters.counters
    evidence = _PortEvidence()
    if previous is None:
        return {}, evidence, False
    seconds = (reading.read_at - previous.read_at).total_seconds()
    if seconds < max(min_interval, 1e-3):
        # Too soon after the last reading (a second run, a retry): keep the older reading as
        # the baseline, so that a quiet second gives no "healthy again" and one error no spike.
        return previous.error_rate_per_hour, evidence, True
    rates = {}
    for name in ERROR_COUNTERS:
        if name not in values or name not in previous.values:
            continue
        old, new = previous.values[name], values[name]
        delta = new if new < old else new - old
        if reading.counters.saturated(name) and new == old:
            evidence.over.append(_Over(port.pk, port.label, name, None))
            continue
        rate = delta * 3600.0 / seconds
        rates[name] = round(rate, 3)
        if rate > limit:
            evidence.over.append(_Over(port.pk, port.label, name, rate, delta, seconds))
    evidence.measured = bool(rates)
    return rates, evidence, False


def apply_health(
    fabric: Fabric,
    *,
    readings: Iterable[Reading] = (),
    port_links: list[linkinfo.PortLink] | None = None,
    limit: float | None = None,
    min_interval: float | None = None,
    now: datetime | None = None,
) -> HealthResult:
    """Store `readings` and set link states. `port_links` is None when iblinkinfo could not
    be read: then no link turns down or comes back from down."""
    limit = settings.IB_ERROR_RATE_PER_HOUR if limit is None else limit
    min_interval = getattr(settings, "IB_COUNTER_MIN_INTERVAL", 30.0) if min_interval is None else min_interval
    now = now or timezone.now()
    with transaction.atomic():
        fabric = Fabric.objects.select_for_update().get(pk=fabric.pk)
        result = HealthResult(fabric=fabric)
        # Plain tuples, not model instances: a large fabric has tens of thousands of ports.
        by_node, by_port_guid = {}, {}
        rows = Port.objects.filter(fabric=fabric).values_list(
            "id", "number", "guid", "state", "switch__guid", "adapter__guid", "switch__description", "adapter__description")
        for pk, number, guid, state, sw_guid, ad_guid, sw_desc, ad_desc in rows:
            port = _PortRow(pk, number, state, f"{(sw_desc or ad_desc or '?').strip()}[{number}]")
            by_node[(int(sw_guid or ad_guid, 16), number)] = port
            if guid:
                by_port_guid[(int(guid, 16), number)] = port

        evidence = _store_counters(fabric, readings, by_node, min_interval, limit, result)
        seen = _store_port_states(port_links, by_port_guid, by_node, result)
        _set_link_states(fabric, evidence, seen, limit, now, result)
    return result


def _store_counters(fabric, readings, by_node, min_interval, limit, result) -> dict[int, _PortEvidence]:
    merged: dict[int, Reading] = {}
    ports: dict[int, _PortRow] = {}
    for reading in readings:
        port = by_node.get((reading.node_guid, reading.counters.port))
        if port is None:
            result.readings_unmatched.append(f"0x{reading.node_guid:016x}[{reading.counters.port}]")
            continue
        ports[port.pk] = port
        if port.pk in merged:  # several kinds (-x, -E) of the same port: one set of values
            merged[port.pk].counters.counters.update(reading.counters.counters)
        else:
            merged[port.pk] = Reading(reading.node_guid, perfquery.PortCounters(
                lid=reading.counters.lid, port=reading.counters.port, kind=reading.counters.kind,
                counters=dict(reading.counters.counters)), reading.read_at)
    previous = {row.port_id: row for row in PortCounters.objects.filter(port_id__in=list(merged))}
    evidence: dict[int, _PortEvidence] = {}
    rows = []
    for port_id, reading in merged.items():
        rates, evidence[port_id], keep = _rates(previous.get(port_id), reading, ports[port_id], min_interval, limit)
        if not keep:
            rows.append(PortCounters(port_id=port_id, read_at=reading.read_at, values=dict(reading.counters.counters), error_rate_per_hour=rates))
    # One upsert per batch: bulk_update's CASE expressions take seconds for a large fabric.
    PortCounters.objects.bulk_create(rows, batch_size=500, update_conflicts=True, unique_fields=["port"],
                                     update_fields=["read_at", "values", "error_rate_per_hour"])
    result.counters_stored = len(rows)
    return evidence


def _store_port_states(port_links, by_port_guid, by_node, result) -> dict[int, linkinfo.PortLink]:
    """{port id: what iblinkinfo says about it}; Port.state follows it."""
    seen: dict[int, linkinfo.PortLink] = {}
    changed = []
    for record in port_links or ():
        key = (record.guid, record.port)
        port = by_port_guid.get(key) or by_node.get(key)
        if port is None:
            if record.remote_guid is not None:  # a cable discovery does not know (yet)
                result.ports_unmatched.append(f"{record.description}[{record.port}] (0x{record.guid:016x})")
            continue
        seen[port.pk] = record
        state = PORT_STATE_BY_IB_STATE.get(record.state, Port.State.UNKNOWN)
        if port.state != state:
            port.state = state
            changed.append(Port(pk=port.pk, state=state))
    Port.objects.bulk_update(changed, ["state"], batch_size=1000)
    return seen


def _set_link_states(fabric, evidence, seen, limit, now, result):
    links = Link.objects.filter(fabric=fabric).exclude(state=Link.State.MISSING).select_related(
        "port_a__switch", "port_a__adapter", "port_b__switch", "port_b__adapter"
    )
    events, to_update = [], []
    states: dict[str, int] = {}
    for link in links:
        ends = [link.port_a] + ([link.port_b] if link.port_b_id else [])
        reported = [(port, seen[port.pk]) for port in ends if port.pk in seen]
        not_active = [(port, record) for port, record in reported if not record.active]
        over = [item for port in ends if port.pk in evidence for item in evidence[port.pk].over]
        measured = any(port.pk in evidence and evidence[port.pk].measured for port in ends)
        new_state, reason, data, culprit = link.state, link.state_reason, {}, None
        if not_active:
            new_state, culprit = Link.State.DOWN, not_active[0][0].pk
            reason = "; ".join(f"{_label(port)} is {record.state}/{record.phys_state}" for port, record in not_active)
            if any(record.state != "Down" for _, record in not_active):
                reason += " (not Active: no traffic until the subnet manager activates it)"
        elif over:
            worst = max(over, key=lambda item: float("inf") if item.rate is None else item.rate)
            new_state, culprit = Link.State.DEGRADED, worst.port_id
            reason = worst.describe(limit)
            if len(over) > 1:
                reason += f" (and {len(over) - 1} more)"
            data = {"counters": [item.as_data() for item in over]}
        elif link.state == Link.State.DOWN:
            if reported:  # every reported end is Active again
                new_state, reason = Link.State.UP, ""
        elif link.state == Link.State.DEGRADED:
            if measured:
                new_state, reason = Link.State.UP, ""
        if new_state == Link.State.UP and link.port_b_id:
            # "healthy again" names the ends in the order the down/degraded event did
            at_a, at_b = link.state_reason.find(_label(link.port_a)), link.state_reason.find(_label(link.port_b))
            if at_b != -1 and (at_a == -1 or at_b < at_a):
                culprit = link.port_b_id
        states[new_state] = states.get(new_state, 0) + 1
        reason = reason[:300]  # the column's size: compare what would be stored
        if (new_state, reason) == (link.state, link.state_reason):
            continue
        old_state, old_reason = link.state, link.state_reason
        link.state, link.state_reason = new_state, reason
        to_update.append(link)
        if new_state == old_state:
            continue  # same state, fresher reason: no event
        result.changes[new_state] += 1
        events.append(_event(fabric, link, culprit, old_state, old_reason, new_state, reason, data, now))
    Link.objects.bulk_update(to_update, ["state", "state_reason"], batch_size=1000)
    FabricEvent.objects.bulk_create(events, batch_size=1000)
    result.states = states


def _event(fabric, link, culprit, old_state, old_reason, new_state, reason, data, now) -> FabricEvent:
    name = _link_name(link, culprit)
    data = {"from": old_state, "to": new_state, **data}
    if new_state == Link.State.DOWN:
        kind, severity, message = FabricEvent.Kind.LINK_DOWN, FabricEvent.Severity.ERROR, f"link {name} down: {reason}"
    elif new_state == Link.State.DEGRADED:
        kind, severity, message = FabricEvent.Kind.LINK_DEGRADED, FabricEvent.Severity.WARNING, f"link {name} degraded: {reason}"
    else:
        kind, severity = FabricEvent.Kind.LINK_HEALTHY, FabricEvent.Severity.INFO
        message = f"link {name} healthy again (was {old_state}: {old_reason})" if old_reason else f"link {name} healthy again (was {old_state})"
    return FabricEvent(fabric=fabric, created_at=now, kind=kind, severity=severity, message=message[:500], link=link, data=data)
