"""Apply a chunk of poll results (pool.poller.Result) to the database in one transaction and
a fixed number of statements, whatever the chunk size:

* good report: the Host row (state up, last report, agent version, CPU, memory, IB
  throughput from counter deltas, missed_rounds 0, last error cleared), its Gpu rows
  (current values; a GPU seen for the first time is created, or a placeholder row made by
  build_fattree at the same index takes the reported UUID), one GpuSample per GPU and one
  HostSample; adapters whose node GUID the agent reports are linked to the host;
* error: missed_rounds + 1 and the reason kept in last_error; after STALE_AFTER missed
  rounds the host is stale, after UNREACHABLE_AFTER unreachable (pool.states);
* a HostEvent for every state change, new error reason, ECC increase, GPU that joins,
  goes missing or changes, and adapter link repaired.

After the commit of every chunk, pool.signals.allocations_reported carries each good
report's allocations (an empty list when every host failed) to whoever listens: the
scheduler's reconciliation and the live views.

A GPU's identity is its UUID; the index may change (and the unique (host, index) pair is
kept valid while it does).
"""
from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from fabric.models import ChannelAdapter

from . import bulk, states
from .models import Gpu, GpuSample, Host, HostEvent, HostSample, fp64_class_for
from .poller import Result
from .services import node_guid_hex, synthetic_gpu_uuid
from .signals import allocations_reported

HOST_OK_FIELDS = [
    "state", "state_changed_at", "last_report_at", "agent_version", "missed_rounds", "last_error", "last_error_at",
    "cpu_percent", "cpu_count", "load1", "memory_total_mib", "memory_used_mib",
    "ib_tx_bytes_per_s", "ib_rx_bytes_per_s", "ib_ports", "ib_counters",
]
HOST_ERROR_FIELDS = ["state", "state_changed_at", "missed_rounds", "last_error", "last_error_at"]
GPU_CURRENT_FIELDS = ["utilization", "memory_used_mib", "temperature_c", "power_w", "power_limit_w",
                      "ecc_corrected", "ecc_uncorrected", "updated_at"]
GPU_INVENTORY_FIELDS = ["uuid", "model", "memory_mib", "nearest_hca", "compute_capability", "fp64_class", "mig_mode",
                        "mig_instances", "numa_node", "pci_bus_id", "present"]
GPU_SAMPLE_FIELDS = ["gpu", "t", "utilization", "memory_used_mib", "temperature_c", "power_w"]
HOST_SAMPLE_FIELDS = ["host", "t", "cpu_percent", "memory_used_mib", "ib_tx_bytes_per_s", "ib_rx_bytes_per_s"]


@dataclass
class IngestStats:
    hosts_ok: int = 0
    hosts_error: int = 0
    gpu_samples: int = 0
    host_samples: int = 0
    gpus_created: int = 0
    events: int = 0
    state_changes: dict = field(default_factory=dict)  # "up->stale": n


@dataclass
class _Host:
    id: int
    name: str
    state: str
    state_changed_at: datetime | None
    missed_rounds: int
    last_error: str
    last_report_at: datetime | None
    ib_counters: dict


@dataclass
class _Gpu:
    id: int
    index: int
    inventory: tuple  # values of GPU_INVENTORY_FIELDS
    ecc_corrected: int | None
    ecc_uncorrected: int | None

    @property
    def uuid(self):
        return self.inventory[0]

    @property
    def present(self):
        return self.inventory[-1]


def _thresholds():
    return int(getattr(settings, "STALE_AFTER", 3)), int(getattr(settings, "UNREACHABLE_AFTER", 6))


def apply_results(results: list[Result]) -> IngestStats:
    stats = IngestStats()
    if not results:
        return stats
    with transaction.atomic():
        _Ingest(results, stats).run()
        reports = [(r.host_id, r.name, r.report["allocations"]) for r in results if r.ok]
        # After every chunk's commit, even one where every host failed (the live views show
        # hosts turning stale): listeners see the committed rows, and a failing listener
        # cannot undo the ingest (robust: it is logged).
        transaction.on_commit(lambda: allocations_reported.send(sender=Host, reports=reports), robust=True)
    return stats


class _Ingest:
    def __init__(self, results, stats):
        self.results = results
        self.stats = stats
        self.now = timezone.now()
        self.stale_after, self.unreachable_after = _thresholds()
        self.events: list[HostEvent] = []
        self.fp64: dict[str, str] = {}  # model name -> class, once per chunk

    def event(self, host_id, kind, message, severity=HostEvent.Severity.INFO, data=None, when=None):
        self.events.append(HostEvent(host_id=host_id, kind=kind, severity=severity, message=message[:500],
                                     data=data or {}, created_at=when or self.now))

    def run(self):
        hosts = {
            row[0]: _Host(*row)
            for row in Host.objects.filter(pk__in=[r.host_id for r in self.results]).values_list(
                "id", "name", "state", "state_changed_at", "missed_rounds", "last_error", "last_report_at", "ib_counters")
        }
        results = [r for r in self.results if r.host_id in hosts]  # a host deleted meanwhile is skipped
        good = [r for r in results if r.ok]
        bad = [r for r in results if not r.ok]
        self._errors(bad, hosts)
        if good:
            self._reports(good, hosts)
        if self.events:
            HostEvent.objects.bulk_create(self.events, batch_size=500)
        self.stats.events = len(self.events)

    # --- errors ---------------------------------------------------------------------------

    def _errors(self, results, hosts):
        rows = []
        for r in results:
            host = hosts[r.host_id]
            missed = host.missed_rounds + 1
            reason = r.reason[:2000]
            state = states.next_state(host.state, ok=False, missed_rounds=missed, ever_reported=host.last_report_at is not None,
                                      stale_after=self.stale_after, unreachable_after=self.unreachable_after)
            if reason != host.last_error:
                self.event(host.id, HostEvent.Kind.REPORT_ERROR, f"no report: {reason}", HostEvent.Severity.WARNING,
                           {"error": r.error, "message": r.message})
            changed_at = self._state_change(host, state, f"after {missed} missed poll rounds ({r.error})")
            rows.append((host.id, state, changed_at, missed, reason, self.now))
        bulk.update_rows(Host, HOST_ERROR_FIELDS, rows)
        self.stats.hosts_error = len(rows)

    def _state_change(self, host: _Host, state: str, why: str):
        if state == host.state:
            return host.state_changed_at
        key = f"{host.state}->{state}"
        self.stats.state_changes[key] = self.stats.state_changes.get(key, 0) + 1
        severity = HostEvent.Severity.INFO if state == states.UP else HostEvent.Severity.WARNING
        self.event(host.id, HostEvent.Kind.STATE_CHANGED, f"{host.state} → {state}: {why}", severity,
                   {"from": host.state, "to": state})
        return self.now

    # --- good reports -----------------------------------------------------------------------

    def _reports(self, results, hosts):
        host_ids = [r.host_id for r in results]
        gpus = defaultdict(list)
        for row in Gpu.objects.filter(host_id__in=host_ids).values_list("id", "host_id", "index", *GPU_INVENTORY_FIELDS,
                                                                        "ecc_corrected", "ecc_uncorrected"):
            gpus[row[1]].append(_Gpu(row[0], row[2], tuple(row[3:-2]), row[-2], row[-1]))

        host_rows, host_samples = [], []
        current, inventory, samples, new_gpus, reindex = [], [], [], [], []
        guids_by_host = {}
        for r in results:
            host, report = hosts[r.host_id], r.report
            t = datetime.fromtimestamp(r.received_at, tz=UTC) if r.received_at else self.now
            t_db = bulk.db_datetime(t)
            host_rows.append(self._host_row(host, report, t, host_samples, t_db))
            self._gpus(host, report, gpus[host.id], t_db, current, inventory, samples, new_gpus, reindex)
            guids = {node_guid_hex(p["node_guid"]) for p in report["ib_ports"]} - {""}
            if guids:
                guids_by_host[host.id] = guids

        if reindex:
            self._reindex(reindex)
        if new_gpus:
            Gpu.objects.bulk_create([gpu for gpu, _ in new_gpus], batch_size=500)
            self.stats.gpus_created = len(new_gpus)
            for gpu, values in new_gpus:
                samples.append((gpu.pk, *values))
        bulk.update_rows(Host, HOST_OK_FIELDS, host_rows, prepared=True)
        bulk.update_rows(Gpu, GPU_INVENTORY_FIELDS, inventory, prepared=True)
        bulk.update_rows(Gpu, GPU_CURRENT_FIELDS, current, prepared=True)
        bulk.insert_rows(GpuSample, GPU_SAMPLE_FIELDS, samples, prepared=True)
        bulk.insert_rows(HostSample, HOST_SAMPLE_FIELDS, host_samples, prepared=True)
        if guids_by_host:
            self._link_adapters(guids_by_host)
        self.stats.hosts_ok = len(host_rows)
        self.stats.gpu_samples = len(samples)
        self.stats.host_samples = len(host_samples)

    def _host_row(self, host: _Host, report: dict, t: datetime, host_samples: list, t_db):
        state = states.next_state(host.state, ok=True, missed_rounds=0, ever_reported=True,
                                  stale_after=self.stale_after, unreachable_after=self.unreachable_after)
        why = "first report" if host.last_report_at is None else (
            f"reports again after {host.missed_rounds} missed poll rounds" if host.missed_rounds else "reports again")
        changed_at = self._state_change(host, state, why)
        ports, counters, tx, rx = _ib_throughput(report["ib_ports"], report["time"], host.ib_counters)
        cpu, memory = report["cpu"], report["memory"]
        host_samples.append((host.id, t_db, cpu["percent"], memory["used_mib"], tx, rx))
        return (host.id, state, changed_at, bulk.db_datetime(t), report["agent_version"], 0, "", None,
                cpu["percent"], cpu["count"], cpu["load1"], memory["total_mib"], memory["used_mib"], tx, rx,
                json.dumps(ports), json.dumps(counters))

    def _gpus(self, host: _Host, report: dict, rows: list[_Gpu], t_db, current, inventory, samples, new_gpus, reindex):
        reported = report["gpus"]
        by_uuid = {row.uuid: row for row in rows if row.uuid}
        by_index = {row.index: row for row in rows}
        reported_uuids = {g["uuid"] for g in reported}
        taken: set[int] = set()
        pairs: list[tuple[_Gpu | None, dict]] = []
        for g in reported:
            row = by_uuid.get(g["uuid"])
            if row is not None:
                taken.add(row.id)
            pairs.append((row, g))
        joined, replaced, swapped = [], [], set()
        for i, (row, g) in enumerate(pairs):
            if row is not None:
                continue
            candidate = by_index.get(g["index"])
            if candidate is not None and candidate.id not in taken and candidate.uuid not in reported_uuids:
                # A placeholder (build_fattree) takes the real UUID; a real one here was swapped out.
                if candidate.uuid and candidate.uuid != synthetic_gpu_uuid(host.name, candidate.index):
                    replaced.append(f"gpu{g['index']}: {candidate.uuid} → {g['uuid']}")
                    swapped.add(candidate.id)
                else:
                    joined.append(g)
                taken.add(candidate.id)
                pairs[i] = (candidate, g)

        for row, g in pairs:
            values = (g["utilization_pct"], g["memory_used_mib"], g["temperature_c"], g["power_w"])
            if row is None:
                joined.append(g)
                gpu = Gpu(host_id=host.id, index=g["index"], updated_at=self.now, **_inventory_kwargs(g, None, self.fp64))
                gpu.utilization, gpu.memory_used_mib, gpu.temperature_c, gpu.power_w = \
                    g["utilization_pct"], _mib(g["memory_used_mib"]), g["temperature_c"], g["power_w"]
                gpu.power_limit_w, gpu.ecc_corrected, gpu.ecc_uncorrected = g["power_limit_w"], g["ecc_corrected"], g["ecc_uncorrected"]
                new_gpus.append((gpu, (t_db, *values)))
                continue
            if row.index != g["index"]:
                reindex.append((row.id, host.id, row.index, g["index"]))
            wanted = _inventory(g, row.inventory, self.fp64)
            if wanted != row.inventory:
                inventory.append((row.id, *wanted[:7], json.dumps(wanted[7]), *wanted[8:]))
                if not row.present:
                    self.event(host.id, HostEvent.Kind.GPU_ADDED, f"gpu{g['index']} ({g['uuid']}) is reported again")
                if row.inventory[1] and wanted[1] != row.inventory[1] and row.uuid == g["uuid"]:
                    self.event(host.id, HostEvent.Kind.GPU_CHANGED, f"gpu{g['index']} ({g['uuid']}) is now a {wanted[1]} (was {row.inventory[1]})")
            self._ecc(host, row, g, new_board=row.id in swapped)
            current.append((row.id, g["utilization_pct"], _mib(g["memory_used_mib"]), g["temperature_c"], g["power_w"],
                            g["power_limit_w"], g["ecc_corrected"], g["ecc_uncorrected"], t_db))
            samples.append((row.id, t_db, *values))

        if joined:
            models = sorted({g["model"] for g in joined if g["model"]})
            self.event(host.id, HostEvent.Kind.GPU_ADDED,
                       f"{len(joined)} GPU{'s' if len(joined) != 1 else ''} reported for the first time"
                       + (f" ({', '.join(models)})" if models else ""),
                       data={"gpus": [g["uuid"] for g in joined][:64]})
        for text in replaced:
            self.event(host.id, HostEvent.Kind.GPU_CHANGED, f"GPU replaced: {text}", HostEvent.Severity.WARNING)
        gone = [row for row in rows if row.id not in taken and row.present]
        if gone:
            for row in gone:
                inventory.append((row.id, *row.inventory[:7], json.dumps(row.inventory[7]), *row.inventory[8:-1], False))
            self.event(host.id, HostEvent.Kind.GPU_MISSING,
                       f"not in the report, no longer offered: {', '.join(f'gpu{row.index}' for row in gone)}",
                       HostEvent.Severity.WARNING, {"gpus": [row.uuid for row in gone]})

    def _ecc(self, host: _Host, row: _Gpu, g: dict, *, new_board: bool):
        before = (None, None) if new_board else (row.ecc_uncorrected, row.ecc_corrected)  # a swapped board starts afresh
        for kind, old, new, severity in (
            ("uncorrected", before[0], g["ecc_uncorrected"], HostEvent.Severity.ERROR),
            ("corrected", before[1], g["ecc_corrected"], HostEvent.Severity.WARNING),
        ):
            # Volatile counters reset with the driver: a drop is a reset, not news.
            if new and new > (old or 0):
                delta = new - (old or 0)
                self.event(host.id, HostEvent.Kind.ECC, f"gpu{g['index']} ({g['uuid']}): {delta} new {kind} ECC "
                           f"error{'s' if delta != 1 else ''} ({new} since the driver loaded)", severity,
                           {"gpu": g["uuid"], "kind": kind, "before": old, "now": new})

    def _reindex(self, moves):
        """GPU indexes changed (same UUIDs, new order): move through free indexes so the
        (host, index) constraint holds after every statement."""
        for gpu_id, _, _, new in moves:
            Gpu.objects.filter(pk=gpu_id).update(index=30000 + new)
        for gpu_id, host_id, old, new in moves:
            Gpu.objects.filter(pk=gpu_id).update(index=new)
            self.event(host_id, HostEvent.Kind.GPU_CHANGED, f"GPU index {old} → {new} (same UUID)")

    def _link_adapters(self, guids_by_host: dict[int, set[str]]):
        """Confirm or repair Host.adapters from reported node GUIDs: a GUID that matches an
        adapter of a fabric links that adapter to this host (and to no other host)."""
        through = Host.adapters.through
        linked = defaultdict(set)
        for host_id, guid in through.objects.filter(host_id__in=list(guids_by_host)).values_list("host_id", "channeladapter__guid"):
            linked[host_id].add(guid)
        wanted = {host_id: guids - linked[host_id] for host_id, guids in guids_by_host.items() if guids - linked[host_id]}
        if not wanted:
            return
        all_guids = set().union(*wanted.values())
        adapters = defaultdict(list)
        for pk, guid, fabric_id, description in ChannelAdapter.objects.filter(guid__in=all_guids).values_list(
                "id", "guid", "fabric_id", "description"):
            adapters[guid].append((pk, fabric_id, description))
        owners = defaultdict(set)
        adapter_ids = [pk for found in adapters.values() for pk, _, _ in found]
        for adapter_id, host_id, name in through.objects.filter(channeladapter_id__in=adapter_ids).values_list(
                "channeladapter_id", "host_id", "host__name"):
            owners[adapter_id].add((host_id, name))
        add, fabric_for = [], {}
        for host_id, guids in wanted.items():
            for guid in sorted(guids):
                for pk, fabric_id, description in adapters.get(guid, ()):
                    others = sorted(name for owner, name in owners[pk] if owner != host_id)
                    if others:
                        through.objects.filter(channeladapter_id=pk).exclude(host_id=host_id).delete()
                    add.append(through(host_id=host_id, channeladapter_id=pk))
                    fabric_for.setdefault(host_id, fabric_id)
                    moved = f", moved from {', '.join(others)}" if others else ""
                    self.event(host_id, HostEvent.Kind.ADAPTER_LINKED,
                               f"adapter {description} (0x{guid}) linked: the agent reports its node GUID{moved}",
                               data={"guid": guid, "adapter": pk, "from": others})
        through.objects.bulk_create(add, ignore_conflicts=True)
        for host_id, fabric_id in fabric_for.items():
            Host.objects.filter(pk=host_id, fabric__isnull=True).update(fabric_id=fabric_id)


def _mib(value):
    return None if value is None else int(round(value))


def _inventory(g: dict, old: tuple | None, fp64: dict) -> tuple:
    """GPU_INVENTORY_FIELDS values from a report; what the report leaves out keeps its old value."""
    old = old or ("", "", 0, "", "", "unknown", False, [], None, "", True)
    model = g["model"] or old[1]
    if model not in fp64:
        fp64[model] = fp64_class_for(model)
    memory = int(round(g["memory_total_mib"])) if g["memory_total_mib"] is not None else old[2]
    return (g["uuid"], model, memory, g["nearest_hca"] or old[3], g["compute_capability"] or old[4],
            fp64[model], g["mig_mode"], g["mig_instances"],
            g["numa_node"] if g["numa_node"] is not None else old[8], g["pci_bus_id"] or old[9], True)


def _inventory_kwargs(g: dict, old: tuple | None, fp64: dict) -> dict:
    return dict(zip(GPU_INVENTORY_FIELDS, _inventory(g, old, fp64)))


def _ib_throughput(ports: list[dict], now: float, previous: dict):
    """(ports for Host.ib_ports, counters to keep, host tx B/s, host rx B/s). A rate needs
    two readings of the same port; a counter that went down was reset (reboot, driver
    reload) and gives no rate this time."""
    shown, kept = [], {}
    tx_total = rx_total = None
    for p in ports:
        key = f"{p['device']}/{p['port']}"
        tx, rx = p["counters"].get("port_xmit_data_bytes"), p["counters"].get("port_rcv_data_bytes")
        tx_rate = rx_rate = None
        before = previous.get(key)
        if before and isinstance(before, list) and len(before) == 3 and now > before[0]:
            elapsed = now - before[0]
            if tx is not None and before[1] is not None and tx >= before[1]:
                tx_rate = (tx - before[1]) / elapsed
            if rx is not None and before[2] is not None and rx >= before[2]:
                rx_rate = (rx - before[2]) / elapsed
        if tx is not None or rx is not None:
            kept[key] = [now, tx, rx]
        if tx_rate is not None:
            tx_total = (tx_total or 0.0) + tx_rate
        if rx_rate is not None:
            rx_total = (rx_total or 0.0) + rx_rate
        shown.append({
            "device": p["device"], "port": p["port"], "node_guid": p["node_guid"], "state": p["state"],
            "phys_state": p["phys_state"], "rate_gbps": p["rate_gbps"], "link_layer": p["link_layer"], "lid": p["lid"],
            "tx_bytes_per_s": tx_rate, "rx_bytes_per_s": rx_rate,
        })
    return shown, kept, tx_total, rx_total
