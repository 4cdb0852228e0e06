"""Reconciliation: what the agents report about their allocations moves placements and
jobs on, and frees GPUs when work ends. Fed by pool.signals.allocations_reported after
every poll chunk (scheduler.receivers), so it runs each poll round for thousands of hosts:
the common case, work that runs and keeps running, costs one query (placements by id) and
writes nothing.

An allocation id "p<n>" names placement n (scheduler.dispatch.allocation_id). Per host of
a placement the agent's states are kept as audit events ("allocation_started",
"allocation_ended": who reported what, when), which is also how a placement spread over
hosts that different poll chunks report learns what the other hosts said: each batch
locks the placements it changes and re-reads those events under the lock.

* starting / running: once every host of the placement has reported it, the placement and
  its job are running (started_at set).
* succeeded / failed / stopped / lost: recorded for that host, and the agent is told it may
  forget it (ack, after commit). When every host has ended the placement ends and its GPUs
  are freed: finished and the job succeeded when all succeeded; failed (and the job failed,
  with the host's reason and exit code) when one failed or was lost; cancelled when its
  work was stopped after the job was cancelled; failed when it was stopped by anyone else.
  When one host of a multi-host placement fails, the others are stopped at once (a
  distributed job without one of its ranks cannot go on); its GPUs stay held until each
  host confirms.
* lost (the agent restarted and the work had ended meanwhile): the job fails with "lost:
  the agent restarted without it". It is not queued again: the work may have finished,
  and running it twice is the user's call (submit it again).
* work still running for a placement that has ended (a stop that did not get through, a
  POST that arrived after a failed dispatch) is stopped again; so is work of a cancelled
  job still running STOP_RESEND_AFTER seconds after the stop was asked for.
* allocations no placement knows (not "p<n>", no such placement, a host that is not part
  of it, or one never dispatched): one "unknown_allocation" audit event per host and id;
  while such work runs, its GPUs are not offered to jobs (pool.Gpu.foreign_busy_until,
  renewed for FOREIGN_BUSY_S by each report that shows it).
"""
from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from pool.models import Gpu

from . import signals
from .audit import SYSTEM
from .dispatch import ack_allocations, allocation_id, placement_id_of, stop_placement
from .models import AuditEvent, Job, Placement, PlacementGpu
from .policy import MOVED, MOVED_PREFIX, PREEMPTED, PREEMPTED_PREFIX

log = logging.getLogger(__name__)

STARTED = ("starting", "running")
ENDED = ("succeeded", "failed", "stopped", "lost")
HOST_STARTED, HOST_ENDED, UNKNOWN = "allocation_started", "allocation_ended", "unknown_allocation"
STOP_RESEND_AFTER = timedelta(seconds=30)
LOST_REASON = "lost: the agent restarted without it"
# Placements whose allocations were sent to agents (earlier states never were).
SENT_STATES = (Placement.State.APPROVED, Placement.State.DISPATCHING, Placement.State.RUNNING)
ENDED_STATES = (Placement.State.FINISHED, Placement.State.FAILED, Placement.State.CANCELLED)


@dataclass
class Stats:
    running: int = 0  # placements that started running
    ended: int = 0  # placements that ended
    host_events: int = 0
    acks: int = 0
    stops: int = 0
    unknown: int = 0
    job_changes: dict = field(default_factory=dict)  # to_state -> [job ids]


@dataclass
class _Report:
    host_id: int
    host: str
    alloc: dict


def apply_reports(reports, *, ack: bool = True) -> Stats:
    """reports: [(host_id, host_name, [allocation dicts as agent.protocol.parse_report gives them])].
    `ack` False: the reports are the scheduler's own conclusions (a stop the agent answered
    404 to), not the agent's, and there is nothing to acknowledge."""
    stats = Stats()
    by_placement: dict[int, dict[int, _Report]] = defaultdict(dict)
    unknown: list[_Report] = []
    for host_id, host, allocations in reports:
        for alloc in allocations:
            pid = placement_id_of(alloc.get("id", ""))
            if pid is None:
                unknown.append(_Report(host_id, host, alloc))
            else:
                by_placement[pid][host_id] = _Report(host_id, host, alloc)
    if not by_placement and not unknown:
        return stats

    # The common case first, without locks: running work of a running placement.
    rows = {pk: (state, stop_at) for pk, state, stop_at in Placement.objects.filter(pk__in=list(by_placement))
            .values_list("id", "state", "stop_requested_at")}
    now = timezone.now()
    candidates = {}
    for pid, by_host in by_placement.items():
        if pid not in rows:
            unknown.extend(by_host.values())
            continue
        state, stop_at = rows[pid]
        quiet = state == Placement.State.RUNNING and (stop_at is None or now - stop_at < STOP_RESEND_AFTER)
        if quiet and all(r.alloc["state"] in STARTED for r in by_host.values()):
            continue
        candidates[pid] = by_host
    if not candidates and not unknown:
        return stats

    acks: list[list] = []
    stops: dict[int, set[str]] = defaultdict(set)
    with transaction.atomic():
        if candidates:
            _apply(candidates, now, stats, acks, stops, unknown)
        if unknown:
            _unknown(unknown, now, stats)
            _foreign_busy(unknown, now)
        transaction.on_commit(lambda: _after(acks if ack else [], stops, stats.job_changes))
    stats.acks = len(acks) if ack else 0
    stats.stops = sum(len(h) for h in stops.values())
    return stats


def _apply(candidates: dict[int, dict[int, _Report]], now, stats: Stats, acks: list, stops: dict, unknown: list):
    ids = sorted(candidates)
    members: dict[int, dict[int, str]] = defaultdict(dict)  # placement -> {host id: name}
    for pid, host_id, name in PlacementGpu.objects.filter(placement_id__in=ids).values_list(
            "placement_id", "gpu__host_id", "gpu__host__name").distinct():
        members[pid][host_id] = name
    # Lock jobs, then placements (the order of cancel_job and the cycle), and read again under the lock.
    job_ids = sorted(set(Placement.objects.filter(pk__in=ids).values_list("job_id", flat=True)))
    jobs = {j.pk: j for j in Job.objects.select_for_update().filter(pk__in=job_ids).order_by("pk")}
    placements = {p.pk: p for p in Placement.objects.select_for_update().filter(pk__in=ids).order_by("pk")}
    history: dict[int, dict[str, dict]] = defaultdict(lambda: {"started": {}, "ended": {}})
    for pid, action, data in AuditEvent.objects.filter(placement_id__in=ids, action__in=(HOST_STARTED, HOST_ENDED)) \
            .order_by("id").values_list("placement_id", "action", "data"):  # in the order they were reported
        history[pid]["started" if action == HOST_STARTED else "ended"][data.get("host_id")] = data

    events: list[AuditEvent] = []
    for pid in ids:
        p = placements.get(pid)
        if p is None:
            unknown.extend(candidates[pid].values())
            continue
        mine = members[pid]
        reports = []
        for host_id, report in candidates[pid].items():
            (reports if host_id in mine else unknown).append(report)
        if not reports:
            continue
        if p.state not in SENT_STATES and p.state not in ENDED_STATES:
            unknown.extend(reports)  # proposed, rejected, expired: never sent, so not ours
            continue
        if p.state in ENDED_STATES:
            for r in reports:
                if r.alloc["state"] in ENDED:
                    acks.append([r.host_id, r.alloc["id"]])
                else:
                    stops[pid].add(r.host)  # still running for a placement that has ended
            continue
        _placement(p, jobs[p.job_id], mine, reports, history[pid], now, stats, acks, stops, events)
    AuditEvent.objects.bulk_create(events, batch_size=500)
    stats.host_events = sum(e.action in (HOST_STARTED, HOST_ENDED) for e in events)


def _placement(p: Placement, job: Job, mine: dict, reports: list[_Report], seen: dict, now, stats, acks, stops, events):
    started, ended = seen["started"], seen["ended"]
    newly_failed = False
    for r in reports:
        alloc = r.alloc
        data = {"host": r.host, "host_id": r.host_id, "allocation": alloc["id"], "state": alloc["state"]}
        if alloc["state"] in ENDED:
            acks.append([r.host_id, alloc["id"]])
            if r.host_id in ended:
                continue
            data |= {"exit_code": alloc.get("exit_code"), "reason": alloc.get("reason") or ""}
            ended[r.host_id] = data
            events.append(_event(now, HOST_ENDED, job, p, f"{r.host}: {_describe(data)}", data))
            newly_failed |= _problem(data, p) is not None
        else:
            if p.stop_requested_at is not None and now - p.stop_requested_at >= STOP_RESEND_AFTER:
                stops[p.pk].add(r.host)  # cancelled a while ago and still running: say it again
            if r.host_id in started or r.host_id in ended:
                continue
            started[r.host_id] = data
            events.append(_event(now, HOST_STARTED, job, p, f"{r.host}: {alloc['state']}", data))

    if set(mine) <= set(ended):
        _end(p, job, [d for h, d in ended.items() if h in mine], now, stats, events)
        return
    if newly_failed:
        # One rank is gone: stop the others now; the GPUs are freed when they confirm.
        problem = next(_problem(d, p) for d in ended.values() if _problem(d, p) is not None)
        stops[p.pk].update(mine[h] for h in mine if h not in ended)
        Placement.objects.filter(pk=p.pk).update(message=problem[:2000], version=F("version") + 1)
        events.append(_event(now, "stop_others", job, p, f"{problem}; stopping it on the other hosts", {}))
        return
    up = set(started) | {h for h, d in ended.items() if d["state"] == "succeeded"}
    if p.state != Placement.State.RUNNING and set(mine) <= up and not any(_problem(d, p) for d in ended.values()):
        Placement.objects.filter(pk=p.pk).update(state=Placement.State.RUNNING, started_at=now,
                                                 version=F("version") + 1)
        stats.running += 1
        before = job.state
        if job.state in (Job.State.APPROVED, Job.State.DISPATCHING):
            # An earlier failed dispatch's message is history now (the audit log keeps it).
            Job.objects.filter(pk=job.pk).update(state=Job.State.RUNNING, state_changed_at=now, started_at=now,
                                                 pending_reason="", pending_message="", expected_start=None,
                                                 message="", exit_code=None)
            stats.job_changes.setdefault(Job.State.RUNNING, []).append(job.pk)
            job.state = Job.State.RUNNING
        hosts = ", ".join(sorted(mine.values()))
        events.append(_event(now, "run", job, p, f"running on {hosts}", {}, before, job.state))


def _problem(data: dict, p: Placement) -> str | None:
    """Why this host's end ends the placement badly, or None (succeeded, or stopped on request)."""
    state = data["state"]
    if state == "succeeded" or (state == "stopped" and p.stop_requested_at is not None):
        return None
    return f"{data['host']}: {_describe(data)}"


def _describe(data: dict) -> str:
    """"exited with code 3", "killed (exit code -9)", "lost: the agent restarted without it"."""
    state, code, reason = data["state"], data.get("exit_code"), data.get("reason") or ""
    if state == "lost":
        return LOST_REASON + (f" ({reason})" if reason else "")
    text = reason or (f"exited with code {code}" if state == "failed" and code is not None else state)
    return text if code is None or str(code) in text else f"{text} (exit code {code})"


def _end(p: Placement, job: Job, ends: list[dict], now, stats: Stats, events: list):
    """Every host has ended (`ends` in the order they were reported: the first problem is the
    cause, later stops are its consequence): the placement ends, its GPUs are free, the job
    is decided."""
    problems = [d for d in ends if d["state"] in ("failed", "lost")] or [d for d in ends if _problem(d, p)]
    codes = {d["host"]: d.get("exit_code") for d in ends}
    if problems:
        first = problems[0]
        state, job_state = Placement.State.FAILED, Job.State.FAILED
        message = f"{first['host']}: {_describe(first)}"
        if first["state"] == "stopped":
            message += " (not stopped by the scheduler)"
        exit_code = first.get("exit_code")
    elif all(d["state"] == "succeeded" for d in ends):
        state, job_state = Placement.State.FINISHED, Job.State.SUCCEEDED
        message = "succeeded" + (" on every host" if len(ends) > 1 else "") + " (exit code 0)"
        exit_code = 0
    else:
        state, job_state = Placement.State.CANCELLED, Job.State.CANCELLED
        message = p.message or "stopped after the job was cancelled"
        exit_code = next((d.get("exit_code") for d in ends if d.get("exit_code") is not None), None)
    requeue = (state == Placement.State.CANCELLED and p.message.startswith((PREEMPTED_PREFIX, MOVED_PREFIX))
               and job.state in (Job.State.APPROVED, Job.State.DISPATCHING, Job.State.RUNNING))
    if requeue:
        state = Placement.State.PREEMPTED  # stopped by the scheduler; the job goes back to the queue
    Placement.objects.filter(pk=p.pk).update(state=state, finished_at=now, started_at=p.started_at or now,
                                             message=message[:2000], version=F("version") + 1)
    PlacementGpu.objects.filter(placement_id=p.pk, active=True).update(active=False)
    stats.ended += 1
    before = job.state
    if requeue:
        preempted = p.message.startswith(PREEMPTED_PREFIX)
        text = (f"Stopped: {p.message}; back in the queue." if preempted
                else "Stopped to be restarted elsewhere (rebalancing); back in the queue.")
        Job.objects.filter(pk=job.pk).update(
            state=Job.State.PENDING, state_changed_at=now, pending_reason=PREEMPTED if preempted else MOVED,
            pending_message=text, expected_start=None, preemption_count=F("preemption_count") + int(preempted))
        stats.job_changes.setdefault(Job.State.PENDING, []).append(job.pk)
        events.append(_event(now, "preempted" if preempted else "moved", job, p, text, {"exit_codes": codes},
                             before, Job.State.PENDING))
        return
    if job.state in (Job.State.APPROVED, Job.State.DISPATCHING, Job.State.RUNNING):
        Job.objects.filter(pk=job.pk).update(state=job_state, state_changed_at=now, finished_at=now,
                                             started_at=job.started_at or now, pending_reason="", pending_message="",
                                             expected_start=None, exit_code=exit_code, message=message[:2000])
        stats.job_changes.setdefault(job_state, []).append(job.pk)
    else:
        job_state = before  # cancelled before it ended: it stays so, with the cancel's message
        if exit_code is not None:  # what its work's end says still counts
            Job.objects.filter(pk=job.pk, exit_code__isnull=True).update(exit_code=exit_code)
    action = {Placement.State.FINISHED: "succeed", Placement.State.FAILED: "fail"}.get(state, "stopped")
    events.append(_event(now, action, job, p, message, {"exit_codes": codes}, before, job_state))


def _event(now, action: str, job: Job, p: Placement, message: str, data: dict, from_state="",
           to_state="") -> AuditEvent:
    return AuditEvent(created_at=now, actor=SYSTEM, action=action, job_id=job.pk, placement_id=p.pk,
                      from_state=from_state, to_state=to_state, message=message[:2000], data=data)


def _unknown(reports: list[_Report], now, stats: Stats) -> None:
    """One audit event per host and allocation id nobody knows; repeats stay quiet."""
    keys = {f"{r.host}/{r.alloc['id']}": r for r in reports}
    seen = set()
    keys_list = list(keys)
    for i in range(0, len(keys_list), 500):
        seen.update(AuditEvent.objects.filter(action=UNKNOWN, data__key__in=keys_list[i:i + 500])
                    .values_list("data__key", flat=True))
    new = [AuditEvent(created_at=now, actor=SYSTEM, action=UNKNOWN,
                      message=f"{r.host} reports allocation {r.alloc['id']} ({r.alloc['state']}), which no "
                              "placement of this scheduler holds; it is left alone",
                      data={"key": key, "host": r.host, "host_id": r.host_id, "allocation": r.alloc["id"],
                            "state": r.alloc["state"], "gpus": list(r.alloc.get("gpus") or [])[:64]})
           for key, r in keys.items() if key not in seen]
    AuditEvent.objects.bulk_create(new, batch_size=500)
    stats.unknown = len(new)
    if new:
        log.warning("%s allocations reported that no placement holds, e.g. %s", len(new), new[0].message)


def _foreign_busy(reports: list[_Report], now) -> None:
    """GPUs that running work nobody here knows uses are not offered to jobs for
    FOREIGN_BUSY_S (scheduler.snapshot); each report that still shows the work renews it,
    and once the work is gone the hold runs out by itself."""
    until = now + timedelta(seconds=float(getattr(settings, "FOREIGN_BUSY_S", 60.0)))
    hosts = {r.host_id for r in reports if r.alloc["state"] in STARTED}
    uuids = {u for r in reports if r.alloc["state"] in STARTED for u in (r.alloc.get("gpus") or []) if u}
    if uuids:
        Gpu.objects.filter(host_id__in=hosts, uuid__in=uuids).update(foreign_busy_until=until)


def _after(acks: list, stops: dict[int, set[str]], job_changes: dict) -> None:
    """After the commit: tell the agents, and whoever shows jobs."""
    for to_state, job_ids in job_changes.items():
        signals.job_state_changed.send_robust(sender=Placement, job_ids=job_ids, to_state=to_state)
    try:
        if acks:
            ack_allocations.delay(acks)
        for pid, hosts in stops.items():
            stop_placement.delay(pid, sorted(hosts))
    except Exception:  # noqa: BLE001 - the broker is away: the next report brings them up again
        log.exception("could not queue acks/stops for the agents; the next poll round tries again")


def stopped_without_agent(placement_id: int, hosts: list[tuple[int, str]], why: str) -> Stats:
    """A stop the agents answered 404 to (they do not have the work): record those hosts as
    stopped, so that the placement can end and free its GPUs."""
    alloc = allocation_id(placement_id)
    return apply_reports([(host_id, name, [{"id": alloc, "state": "stopped", "exit_code": None, "reason": why}])
                          for host_id, name in hosts], ack=False)
