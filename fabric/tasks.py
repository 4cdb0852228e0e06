"""Celery tasks: fabric discovery and link health. Beat triggers them (see migration
0002_discovery_schedule); they also run by hand: `discover_fabric.delay()`.

The commands come from settings as strings (a full command line is fine, e.g.
`ssh ib-host ibnetdiscover`): IB_DISCOVER_COMMAND, IB_LINKINFO_COMMAND, IB_PERFQUERY_COMMAND.

Both tasks are idempotent (an import is a diff; a health check right after another keeps
the older counter reading as the baseline) and never run twice at once for one fabric:
a Redis lock per task and fabric, taken without waiting, makes a second run return
`skipped`. The lock is in Redis, not a database row lock, because the commands run for
up to minutes and a transaction held that long would block imports and, on SQLite, every
write. It expires by itself (ttl) if a worker dies holding it. The database writes take
the fabric row lock besides, so an import and a health check apply one after the other.
"""
from __future__ import annotations

import logging
import os
import shlex
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager

import redis
from celery import shared_task
from django.conf import settings
from django.utils import timezone

from . import health, ibnetdiscover, linkinfo, perfquery
from .ibnetdiscover import TopologyError
from .importer import import_topology
from .models import Fabric, FabricEvent, FabricNameError, Port, Switch, validate_fabric_name

log = logging.getLogger(__name__)

PERFQUERY_WORKERS = 4  # perfquery processes at once (ibsim serves at most 10 clients)
ALL_PORTS = "255"  # `perfquery -l <lid> 255` reads every port of the node, one block each


class CommandFailed(RuntimeError):
    pass


class LockUnavailable(RuntimeError):
    pass


def command_argv(setting_name: str, *extra: str) -> list[str]:
    text = getattr(settings, setting_name)
    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise CommandFailed(f"{setting_name} {text!r} cannot be split into arguments: {exc}") from None
    if not argv:
        raise CommandFailed(f"{setting_name} is empty")
    return argv + list(extra)


def run_command(argv: list[str], timeout: float) -> bytes:
    """stdout of the command, or CommandFailed with a reason a person can act on. The
    command runs in its own process group so that a timeout kills wrappers' children too."""
    shown = shlex.join(argv)
    if len(shown) > 200:
        shown = shown[:200] + "…"
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    except FileNotFoundError:
        raise CommandFailed(f"{argv[0]}: command not found (running {shown})") from None
    except OSError as exc:
        raise CommandFailed(f"{argv[0]}: cannot run it: {exc.strerror} (running {shown})") from None
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        raise CommandFailed(f"{shown} timed out after {timeout:g} s") from None
    if proc.returncode != 0:
        tail = " ".join(err.decode(errors="replace").split())[-300:]
        how = f"was killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exited with status {proc.returncode}"
        raise CommandFailed(f"{shown} {how}" + (f": {tail}" if tail else ""))
    return out


@contextmanager
def fabric_lock(task: str, fabric_name: str, ttl: float):
    """Yields True when this run holds the lock, False when another run does."""
    client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=3, socket_timeout=5)
    lock = client.lock(f"fabricpool:lock:{task}:{fabric_name}", timeout=ttl, blocking=False)
    try:
        acquired = lock.acquire()
    except redis.RedisError as exc:
        raise LockUnavailable(f"cannot take the {task} lock in Redis ({exc}); not running") from None
    try:
        yield acquired
    finally:
        if acquired:
            try:
                lock.release()
            except redis.RedisError:
                pass  # expired meanwhile, or Redis went away: the ttl cleans up


def _skipped(fabric_name: str, task: str) -> dict:
    log.info("%s for fabric %s skipped: another run is in progress", task, fabric_name)
    return {"fabric": fabric_name, "ok": False, "skipped": f"another {task} of fabric {fabric_name} is running"}


# --- discovery --------------------------------------------------------------------------


@shared_task(name="fabric.tasks.discover_fabric")
def discover_fabric(fabric_name: str | None = None) -> dict:
    """Run the discovery command and import its output as a diff. On any failure, one
    discovery_failed event and nothing else changes."""
    name = fabric_name or settings.IB_FABRIC_NAME
    try:
        validate_fabric_name(name)
    except FabricNameError as exc:
        return {"fabric": name, "ok": False, "error": str(exc)}
    timeout = float(settings.IB_DISCOVER_TIMEOUT)
    started = time.monotonic()
    try:
        with fabric_lock("discover", name, ttl=timeout + 120) as acquired:
            if not acquired:
                return _skipped(name, "discovery")
            try:
                output = run_command(command_argv("IB_DISCOVER_COMMAND"), timeout)
                topo = ibnetdiscover.parse(output)
                if loss := _implausible_loss(name, topo):
                    return _discovery_failed(name, loss)
                result = import_topology(topo, name, source_name=f"discover_fabric: {settings.IB_DISCOVER_COMMAND}")
            except (CommandFailed, TopologyError) as exc:
                reason = str(exc) if isinstance(exc, CommandFailed) else f"output of {settings.IB_DISCOVER_COMMAND} is not a topology: {exc}"
                return _discovery_failed(name, reason)
    except LockUnavailable as exc:
        log.error("discovery of fabric %s: %s", name, exc)
        return {"fabric": name, "ok": False, "error": str(exc)}
    summary = {
        "fabric": name,
        "ok": True,
        "first_import": result.first_import,
        "switches": result.switches,
        "adapters": result.adapters,
        "links": result.links,
        "changes": {k: v for k, v in result.changes.items() if v},
        "warnings": len(result.warnings),
        "summary": result.summary(),
        "seconds": round(time.monotonic() - started, 2),
    }
    log.info("discovery: %s", summary["summary"])
    return summary


def _implausible_loss(name: str, topo) -> str | None:
    """A discovery host that lost its own cable sees only itself and still exits 0: refuse
    an unattended import that would mark most of the fabric missing. An operator who knows
    the fabric shrank imports the file by hand (import_ibnetdiscover)."""
    present = Switch.objects.filter(fabric__name=name, present=True).count()
    found = sum(1 for node in topo.nodes.values() if node.kind == ibnetdiscover.SWITCH)
    max_loss = float(getattr(settings, "IB_DISCOVER_MAX_LOSS", 0.5))
    if present >= 4 and found < present * (1 - max_loss):
        return (
            f"found {found} of {present} known switches (more than {max_loss:.0%} lost): "
            "is the discovery host's own link down? Import by hand with import_ibnetdiscover if the fabric really shrank"
        )
    return None


def _discovery_failed(name: str, reason: str) -> dict:
    fabric, _ = Fabric.objects.get_or_create(name=name)  # the event needs its fabric row
    FabricEvent.objects.create(
        fabric=fabric, kind=FabricEvent.Kind.DISCOVERY_FAILED, severity=FabricEvent.Severity.ERROR,
        message=f"discovery failed, topology unchanged: {reason}"[:500],
        data={"command": settings.IB_DISCOVER_COMMAND, "reason": reason[:2000]},
    )
    log.warning("discovery of fabric %s failed: %s", name, reason)
    return {"fabric": name, "ok": False, "error": reason}


# --- link health ------------------------------------------------------------------------


@shared_task(name="fabric.tasks.check_link_health")
def check_link_health(fabric_name: str | None = None) -> dict:
    """Read port states (one iblinkinfo for the whole fabric) and the counters of every
    switch port (one perfquery per switch), then set link states (fabric.health)."""
    name = fabric_name or settings.IB_FABRIC_NAME
    timeout = float(settings.IB_COUNTERS_TIMEOUT)
    fabric = Fabric.objects.filter(name=name).first()
    if fabric is None or not Switch.objects.filter(fabric=fabric).exists():
        return {"fabric": name, "ok": False, "error": f"fabric {name} has no discovered switches yet: run discovery first"}
    started = time.monotonic()
    try:
        with fabric_lock("link-health", name, ttl=3 * timeout + 60) as acquired:
            if not acquired:
                return _skipped(name, "link health check")
            errors: list[str] = []
            port_links = None
            try:
                port_links = linkinfo.parse(run_command(command_argv("IB_LINKINFO_COMMAND", "-l"), timeout))
            except (CommandFailed, linkinfo.LinkInfoError) as exc:
                errors.append(f"port states unknown: {exc}")
            readings, read, unreachable = _read_switch_counters(fabric, port_links, timeout, errors)
            result = health.apply_health(fabric, readings=readings, port_links=port_links)
    except LockUnavailable as exc:
        log.error("link health of fabric %s: %s", name, exc)
        return {"fabric": name, "ok": False, "error": str(exc)}
    for error in errors:
        log.warning("link health of fabric %s: %s", name, error)
    if errors:
        FabricEvent.objects.create(
            fabric=fabric, kind=FabricEvent.Kind.HEALTH_CHECK_FAILED, severity=FabricEvent.Severity.WARNING,
            message=f"link health check incomplete: {'; '.join(errors)}"[:500], data={"errors": errors[:50]},
        )
    summary = {
        "ok": not errors,
        **result.summary(),
        "ports_reported": len(port_links) if port_links is not None else None,
        "switches_read": read,
        "switches_unreachable": len(unreachable),
        "unreachable": unreachable[:20],
        "errors": errors[:20],
        "seconds": round(time.monotonic() - started, 2),
    }
    return summary


def _switch_lids(fabric: Fabric, port_links) -> list[tuple[Switch, int | None]]:
    """(switch, LID to query). iblinkinfo's LIDs are current (the SM may have renumbered
    since discovery); a switch that iblinkinfo did not reach gets None."""
    switches = list(Switch.objects.filter(fabric=fabric, present=True))
    if port_links is None:
        return [(sw, sw.lid or None) for sw in switches]
    lid_by_guid = {record.guid: record.lid for record in port_links}
    port_guids: dict[int, set[int]] = {}
    for switch_id, guid in Port.objects.filter(switch__in=switches).exclude(guid="").values_list("switch_id", "guid"):
        port_guids.setdefault(switch_id, set()).add(int(guid, 16))
    pairs = []
    for sw in switches:
        guids = [int(sw.guid, 16), *port_guids.get(sw.pk, ())]
        lid = next((lid_by_guid[g] for g in guids if g in lid_by_guid), None)
        pairs.append((sw, lid or None))
    return pairs


def _read_switch_counters(fabric, port_links, timeout, errors):
    try:
        base = command_argv("IB_PERFQUERY_COMMAND")
    except CommandFailed as exc:
        errors.append(f"counters not read: {exc}")
        return [], 0, []
    targets = _switch_lids(fabric, port_links)
    unreachable = [sw.description for sw, lid in targets if lid is None]
    targets = [(sw, lid) for sw, lid in targets if lid is not None]

    def read(sw, lid):
        output = run_command(base + ["-l", str(lid), ALL_PORTS], timeout)
        read_at = timezone.now()
        records = perfquery.parse(output)
        if not records:
            raise CommandFailed("no counters in the output")
        wrong = [r for r in records if r.lid != lid]
        if wrong:
            raise CommandFailed(f"asked for lid {lid}, got counters of lid {wrong[0].lid}")
        return [health.Reading(int(sw.guid, 16), record, read_at) for record in records]

    readings, read_ok = [], 0
    if not targets:
        return readings, read_ok, unreachable
    with ThreadPoolExecutor(max_workers=min(PERFQUERY_WORKERS, len(targets))) as pool:
        futures = {pool.submit(read, sw, lid): (sw, lid) for sw, lid in targets}
        done, pending = wait(futures, timeout=2 * timeout)
        for future in pending:
            future.cancel()
            sw, lid = futures[future]
            errors.append(f"counters of {sw.description} (lid {lid}) not read: the round ran out of time")
        for future in done:
            sw, lid = futures[future]
            try:
                readings.extend(future.result())
                read_ok += 1
            except (CommandFailed, perfquery.PerfqueryError) as exc:
                errors.append(f"counters of {sw.description} (lid {lid}) not read: {exc}")
    return readings, read_ok, unreachable
