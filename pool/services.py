"""Writes to the pool: hosts and GPUs, registration from discovery, draining."""
from __future__ import annotations

import uuid
from collections import defaultdict
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from fabric.fattree import DEFAULT_GPU_MEMORY_MIB, DEFAULT_GPU_MODEL, natural_key
from fabric.models import ChannelAdapter, Fabric

from . import bulk, states
from .models import Gpu, Host, HostEvent, Pool, fp64_class_for

# Synthetic GPU UUIDs are uuid5 names in this namespace: the same host and index always
# give the same UUID, and a UUID an agent reported (random, uuid4-style) never matches one.
GPU_UUID_NAMESPACE = uuid.UUID("6f1c3c1e-6a53-4f43-9f0e-8a2b1c7d5e90")


def synthetic_gpu_uuid(host_name: str, index: int) -> str:
    return f"GPU-{uuid.uuid5(GPU_UUID_NAMESPACE, f'{host_name}/{index}')}"


@dataclass
class HostRegistration:
    hosts: int = 0  # hosts found in the fabric
    hosts_created: int = 0
    hosts_updated: int = 0  # moved to this fabric, back in it, pool or agent URL set
    hosts_left_fabric: int = 0  # no adapter in the fabric any more: in_fabric=False
    adapter_links_added: int = 0
    adapter_links_removed: int = 0
    gpus_created: int = 0
    gpus_updated: int = 0

    @property
    def changed(self) -> bool:
        return any(getattr(self, f) for f in self.__dataclass_fields__ if f != "hosts")

    def summary(self) -> str:
        return (
            f"{self.hosts} hosts ({self.hosts_created} new, {self.hosts_updated} updated, "
            f"{self.hosts_left_fabric} left the fabric), {self.gpus_created} GPUs new, {self.gpus_updated} updated"
        )


def register_hosts_from_fabric(
    fabric: Fabric,
    gpus_per_host: int | None = None,
    gpu_model: str = DEFAULT_GPU_MODEL,
    memory_mib: int = DEFAULT_GPU_MEMORY_MIB,
    pool: Pool | None = None,
) -> HostRegistration:
    """Make one Host per host name among the fabric's present adapters and link its
    adapters. With `gpus_per_host`, give each host GPUs 0..n-1 (synthetic UUIDs; GPU i sits
    next to the host's i-th HCA modulo the number of HCAs, i.e. mlx5_{i % R} on a
    rail-optimized host). Idempotent. Hosts of this fabric that lost all their adapters get
    in_fabric=False and are kept. Host names are unique cluster-wide: a host registered in
    another fabric moves to this one. GPU rows an agent reported (not a synthetic UUID) are left
    alone, and so are GPUs with an index >= gpus_per_host."""
    if gpus_per_host is not None and (isinstance(gpus_per_host, bool) or not isinstance(gpus_per_host, int) or gpus_per_host < 0):
        raise ValueError(f"gpus_per_host must be a whole number >= 0, got {gpus_per_host!r}")
    template = getattr(settings, "AGENT_URL_TEMPLATE", "http://{host}:9400")
    result = HostRegistration()
    with transaction.atomic():
        adapters = defaultdict(list)  # host name -> [(device name, adapter id)]
        rows = ChannelAdapter.objects.filter(fabric=fabric, present=True, is_aggregation_node=False).exclude(host_name="")
        reported = reported_adapter_guids()
        confirmed = set()  # adapters an agent reports: their link is the report's, not the description's
        for pk, host_name, description, guid in rows.values_list("id", "host_name", "description", "guid"):
            words = description.split()
            adapters[host_name].append((words[1] if len(words) == 2 else "", pk))
            if guid in reported:
                confirmed.add(pk)
        for devices in adapters.values():
            devices.sort(key=lambda item: natural_key(item[0]))
        result.hosts = len(adapters)

        hosts = _sync_hosts(fabric, adapters, template, pool, result)
        _sync_adapter_links(fabric, hosts, adapters, confirmed, result)
        if gpus_per_host:
            _sync_gpus(fabric, hosts, adapters, gpus_per_host, gpu_model, memory_mib, result)
    return result


def _sync_hosts(fabric, adapters, template, pool, result) -> dict[str, int]:
    """Returns {host name: host id} of the hosts in the fabric. Reads the whole host table
    (one row per machine: thousands, not millions) rather than a huge IN list."""
    existing = {
        name: (pk, fabric_id, in_fabric, pool_id, agent_url)
        for pk, name, fabric_id, in_fabric, pool_id, agent_url in Host.objects.values_list(
            "id", "name", "fabric_id", "in_fabric", "pool_id", "agent_url"
        )
    }
    pool_id = pool.pk if pool is not None else None
    to_create, to_update = [], []
    for name in sorted(adapters):
        found = existing.get(name)
        if found is None:
            to_create.append(Host(name=name, fabric=fabric, site_id=fabric.site_id, pool_id=pool_id,
                                  agent_url=template.format(host=name)))
            continue
        pk, *current = found
        old_pool, old_url = current[2], current[3]
        # An explicit pool moves the host; otherwise keep its pool. Keep an agent URL an operator set.
        wanted = [fabric.pk, True, pool_id if pool_id is not None else old_pool, old_url or template.format(host=name)]
        if current != wanted:
            to_update.append(Host(pk=pk, fabric_id=wanted[0], in_fabric=True, pool_id=wanted[2], agent_url=wanted[3]))
    left = [(pk, name) for name, (pk, fabric_id, in_fabric, _, _) in existing.items()
            if fabric_id == fabric.pk and in_fabric and name not in adapters]
    returned = [(pk, "back in" if fabric_id == fabric.pk else "moved to") for name, (pk, fabric_id, in_fabric, _, _)
                in existing.items() if name in adapters and (not in_fabric or fabric_id != fabric.pk)]
    Host.objects.bulk_create(to_create, batch_size=500)
    if to_update:
        Host.objects.bulk_update(to_update, ["fabric", "in_fabric", "pool", "agent_url"], batch_size=500)
    if left:
        Host.objects.filter(pk__in=[pk for pk, _ in left]).update(in_fabric=False)
    result.hosts_created, result.hosts_updated, result.hosts_left_fabric = len(to_create), len(to_update), len(left)
    hosts = dict(Host.objects.filter(fabric=fabric, in_fabric=True).values_list("name", "id"))
    # Why each host appeared, left or came back: the operator sees it on the host.
    now = timezone.now()
    events = [(hosts[host.name], "registered", "info", f"registered from discovery of fabric {fabric.name}; agent at {host.agent_url}")
              for host in to_create]
    events += [(pk, "returned", "info", f"{how} fabric {fabric.name}") for pk, how in returned]
    events += [(pk, "vanished", "warning", f"no adapter of {name} in the latest discovery of fabric {fabric.name}; "
                "kept with its history") for pk, name in left]
    bulk.insert_rows(HostEvent, ["host", "kind", "severity", "message", "data", "actor", "created_at"],
                     [(pk, kind, severity, message[:500], {}, "", now) for pk, kind, severity, message in events])
    return hosts


def _sync_adapter_links(fabric, hosts, adapters, confirmed, result):
    """Host.adapters = exactly the host's present adapters in this fabric (hosts that left
    the fabric keep theirs, to show what they had), except adapters whose node GUID an agent
    reports: the poll links those (pool.ingest), whatever their description says."""
    through = Host.adapters.through
    wanted = {(hosts[name], pk) for name, devices in adapters.items() for _, pk in devices if pk not in confirmed}
    current = {
        (host_id, adapter_id): pk
        for pk, host_id, adapter_id in through.objects.filter(host__fabric=fabric, host__in_fabric=True).values_list(
            "id", "host_id", "channeladapter_id"
        )
    }
    current = {pair: pk for pair, pk in current.items() if pair[1] not in confirmed}
    add = sorted(wanted - current.keys())
    stale = [pk for pair, pk in current.items() if pair not in wanted]
    bulk.insert_rows(through, ["host", "channeladapter"], add)
    if stale:
        through.objects.filter(pk__in=stale).delete()
    result.adapter_links_added, result.adapter_links_removed = len(add), len(stale)


def node_guid_hex(text: str) -> str:
    """A reported node GUID ("0x0a7fbc1245efd23b", "0a7f:bc12:45ef:d23b") as fabric stores
    GUIDs (16 lowercase hex digits); "" for anything else."""
    digits = (text or "").lower().removeprefix("0x").replace(":", "")
    if not digits or len(digits) > 16 or any(c not in "0123456789abcdef" for c in digits):
        return ""
    return digits.rjust(16, "0")


def reported_adapter_guids() -> set[str]:
    """Node GUIDs the agents' latest reports list (kept on Host.ib_ports)."""
    guids = set()
    for ports in Host.objects.filter(last_report_at__isnull=False).values_list("ib_ports", flat=True):
        for port in ports or ():
            guid = node_guid_hex(port.get("node_guid", "")) if isinstance(port, dict) else ""
            if guid:
                guids.add(guid)
    return guids


def _sync_gpus(fabric, hosts, adapters, n, model, memory_mib, result):
    existing = {
        (host_id, index): (pk, uuid_, old_model, old_memory, hca)
        for pk, host_id, index, uuid_, old_model, old_memory, hca in Gpu.objects.filter(host__fabric=fabric, host__in_fabric=True)
        .values_list("id", "host_id", "index", "uuid", "model", "memory_mib", "nearest_hca")
    }
    to_create, to_update = [], []
    fp64 = fp64_class_for(model)
    for name, host_id in hosts.items():
        devices = [device for device, _ in adapters[name]]
        for index in range(n):
            hca = devices[index % len(devices)] if devices else ""
            fake_uuid = synthetic_gpu_uuid(name, index)
            found = existing.get((host_id, index))
            if found is None:
                to_create.append((host_id, index, fake_uuid, model, memory_mib, hca, fp64, "", False, [], "", True))
                continue
            pk, uuid_, old_model, old_memory, old_hca = found
            if uuid_ == fake_uuid and (old_model, old_memory, old_hca) != (model, memory_mib, hca):
                to_update.append(Gpu(pk=pk, model=model, memory_mib=memory_mib, nearest_hca=hca, fp64_class=fp64))
    bulk.insert_rows(Gpu, ["host", "index", "uuid", "model", "memory_mib", "nearest_hca", "fp64_class", "compute_capability",
                           "mig_mode", "mig_instances", "pci_bus_id", "present"], to_create)
    if to_update:
        Gpu.objects.bulk_update(to_update, ["model", "memory_mib", "nearest_hca", "fp64_class"], batch_size=1000)
    result.gpus_created, result.gpus_updated = len(to_create), len(to_update)


def drain_host(host: Host, *, actor: str, reason: str = "") -> bool:
    """Operator action: the host keeps its running work and its GPUs are offered to no one.
    Polling goes on (telemetry, errors) but leaves the state alone. Returns False when the
    host was already draining. Callers check the drain_host permission."""
    with transaction.atomic():
        host = Host.objects.select_for_update().get(pk=host.pk)
        if host.state == Host.State.DRAINING:
            return False
        before = host.state
        host.state, host.state_changed_at = Host.State.DRAINING, timezone.now()
        host.save(update_fields=["state", "state_changed_at"])
        message = f"drained by {actor or 'the system'} (was {before})" + (f": {reason}" if reason else "")
        HostEvent.objects.create(host=host, kind=HostEvent.Kind.DRAINED, message=message[:500], actor=actor,
                                 data={"from": before, "reason": reason[:500]})
    return True


def undrain_host(host: Host, *, actor: str) -> bool:
    """Undo drain_host (or a manual down): the host goes where polling puts it (up, stale,
    unreachable, or new if it never reported). Returns False when it was not drained or down."""
    with transaction.atomic():
        host = Host.objects.select_for_update().get(pk=host.pk)
        if host.state not in Host.OPERATOR_STATES:
            return False
        before = host.state
        host.state = states.polled_state(
            missed_rounds=host.missed_rounds, ever_reported=host.last_report_at is not None,
            stale_after=int(settings.STALE_AFTER), unreachable_after=int(settings.UNREACHABLE_AFTER))
        host.state_changed_at = timezone.now()
        host.save(update_fields=["state", "state_changed_at"])
        HostEvent.objects.create(host=host, kind=HostEvent.Kind.UNDRAINED, actor=actor,
                                 message=f"undrained by {actor or 'the system'}: {before} → {host.state}"[:500],
                                 data={"from": before, "to": host.state})
    return True
