"""Dispatch: approved placements go to the agents of their hosts; cancelled ones are stopped.

dispatch_placement(placement_id), a Celery task sent after the approval commits
(scheduler.receivers):

1. approved -> dispatching (the job too), audited. A placement already past dispatching
   is left alone; one still dispatching (a retry, or a message delivered again after a
   worker died: acks_late) is sent again, which is safe: an agent answers 200 to a request
   it already has and starts nothing twice (the request is built the same way each time).
2. Each host's part is POSTed to {agent_url}/v1/allocations, all hosts at once, with the
   allocation id "p<placement id>" (allocation_id()), the host's GPU UUIDs, the job's
   command and environment, and for a multi-host job the rendezvous (rank 0: the first
   host by name).
3. Every host accepted: the placement stays dispatching until the agents report it
   (scheduler.reconcile). A host that did not answer (timeout, connection error, 5xx) is
   tried again with exponential backoff, DISPATCH_RETRIES times, DISPATCH_BACKOFF_S
   doubling (2 + 4 + 8 + 16 s by default). A host that refused (4xx: a GPU in use, a bad
   request), or retries exhausted: the placement fails, its GPUs are freed, the job goes
   back to pending with the reason, and then what may have started on the other hosts is
   stopped (DELETE). The database decides first and the agents are told after, so a
   placement that a report moved to running meanwhile is never stopped by a late failure.

A request that can never be valid (a job without a command) fails the job instead: sending
it back to the queue would only fail again.

resend_stuck(), at the start of every allocation cycle task: placements approved more than
DISPATCH_STALE_S ago that never started dispatching (the broker was away when the approval
committed), and placements dispatching that long with no dispatch activity (the worker died
mid-dispatch), are sent again, audited ("dispatch_resend").

stop_placement(placement_id, hosts=None): DELETE on each host (after a cancel, or to stop
work that runs for a placement that has ended); retried like dispatch. 404 is fine: the
agent has nothing by that id. ack_allocations: POST .../ack for finished work whose end
is recorded, one attempt (the next report lists it again until an ack gets through).
"""
from __future__ import annotations

import asyncio
import json
import logging
import re
from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta

import aiohttp
from celery import shared_task
from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from agent.protocol import ALLOCATION_ID, ALLOCATION_SCHEMA, ProtocolError, parse_allocation_request
from fabric.fattree import natural_key
from pool.models import Host
from pool.tokens import token_for

from core import faults

from . import signals
from .audit import SYSTEM, record
from .models import AuditEvent, Job, Placement, PlacementGpu

log = logging.getLogger(__name__)

USER_AGENT = "fabricpool-dispatch/1"
MASTER_PORT = 29500
MAX_ERROR_BODY = 4096  # what is read of a refusal, to quote its "error"
DISPATCH_FAILED = "dispatch_failed"  # Job.pending_reason after a failed dispatch
_PLACEMENT_ALLOCATION = re.compile(r"^p([1-9][0-9]{0,17})$")


def allocation_id(placement_id: int) -> str:
    """The allocation id of a placement on its agents: stable, so a retried POST is the same request."""
    value = f"p{placement_id}"
    assert ALLOCATION_ID.match(value)
    return value


def placement_id_of(alloc_id: str) -> int | None:
    """The placement an allocation id names, or None for ids the scheduler did not make."""
    found = _PLACEMENT_ALLOCATION.match(alloc_id or "")
    return int(found.group(1)) if found else None


# -- talking to agents ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Call:
    host: str
    method: str
    url: str
    token: str
    body: dict | None = None


@dataclass(frozen=True)
class Answer:
    host: str
    status: int | None  # None: no HTTP answer (timeout, connection refused or reset)
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    @property
    def transient(self) -> bool:
        """Worth trying again: no answer, the agent's own trouble (5xx), or "later" (408, 429)."""
        return self.status is None or self.status >= 500 or self.status in (408, 429)

    def describe(self) -> str:
        if self.status is None:
            return f"{self.host}: {self.message}"
        return f"{self.host} answered {self.status}" + (f": {self.message}" if self.message else "")


def request_timeout() -> float:
    return float(settings.DISPATCH_TIMEOUT)


def call_agents(calls: list[Call], timeout: float | None = None) -> list[Answer]:
    """Make the calls concurrently; one Answer per call, in order. Never raises for a host."""
    if not calls:
        return []
    return asyncio.run(_call_all(calls, request_timeout() if timeout is None else timeout))


async def _call_all(calls: list[Call], timeout: float) -> list[Answer]:
    client_timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=min(timeout, 3.0))
    connector = aiohttp.TCPConnector(limit=64)
    async with aiohttp.ClientSession(connector=connector, timeout=client_timeout,
                                     headers={"User-Agent": USER_AGENT}) as session:
        return list(await asyncio.gather(*(_call_one(session, call, timeout) for call in calls)))


async def _call_one(session: aiohttp.ClientSession, call: Call, timeout: float) -> Answer:
    headers = {"Authorization": f"Bearer {call.token}"}
    data = None
    if call.body is not None:
        data = json.dumps(call.body, separators=(",", ":")).encode()
        headers["Content-Type"] = "application/json"
    try:
        async with asyncio.timeout(timeout):
            async with session.request(call.method, call.url, data=data, headers=headers,
                                       allow_redirects=False) as resp:
                body = await resp.content.read(MAX_ERROR_BODY)
                return Answer(call.host, resp.status, "" if 200 <= resp.status < 300 else _error_text(body))
    except TimeoutError:
        return Answer(call.host, None, f"no answer within {timeout:g} s")
    except aiohttp.ClientConnectorError as exc:
        return Answer(call.host, None, f"cannot connect ({exc.os_error.strerror or exc.os_error})")
    except aiohttp.InvalidURL:
        return Answer(call.host, 400, f"agent URL {call.url!r} is not a URL")
    except (aiohttp.ClientError, OSError) as exc:
        return Answer(call.host, None, f"connection failed ({type(exc).__name__}: {exc})"[:300])


def _error_text(body: bytes) -> str:
    """An agent's {"error": ...}, else the start of whatever it sent."""
    try:
        data = json.loads(body)
        if isinstance(data, dict) and isinstance(data.get("error"), str):
            path = data.get("path")
            return (f"{path}: " if isinstance(path, str) and path else "") + data["error"][:300]
    except ValueError:
        pass
    return body[:200].decode("utf-8", "replace").strip()


def agent_url(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), "v1", "allocations", *parts])


# -- what each host is sent -------------------------------------------------------------------------

@dataclass(frozen=True)
class Part:
    host_id: int
    host: str
    url: str  # the agent's base URL
    agent_kind: str
    gpus: tuple[str, ...]  # UUIDs, by GPU index


class DispatchError(Exception):
    """This placement cannot be sent, ever (the message says why)."""


def placement_parts(placement_id: int, *, active_only: bool = True) -> list[Part]:
    """The hosts of a placement with their GPUs, ordered by host name (rank order)."""
    rows = PlacementGpu.objects.filter(placement_id=placement_id)
    if active_only:
        rows = rows.filter(active=True)
    hosts: dict[int, list] = {}
    gpus = defaultdict(list)
    for host_id, name, url, kind, index, uuid in rows.values_list(
            "gpu__host_id", "gpu__host__name", "gpu__host__agent_url", "gpu__host__agent_kind", "gpu__index",
            "gpu__uuid"):
        hosts[host_id] = [name, url, kind]
        gpus[host_id].append((index, uuid))
    parts = [Part(host_id, name, url, kind, tuple(uuid for _, uuid in sorted(gpus[host_id])))
             for host_id, (name, url, kind) in hosts.items()]
    return sorted(parts, key=lambda p: natural_key(p.host))


def allocation_requests(job: Job, placement_id: int, parts: list[Part]) -> list[dict]:
    """One agent.protocol allocation request per part; DispatchError if one cannot be valid."""
    if not parts:
        raise DispatchError("it holds no GPUs")
    for part in parts:
        if part.agent_kind != Host.AgentKind.FABRICPOOL or not part.url:
            raise DispatchError(f"host {part.host} has no FabricPool agent to start work")
        if not all(part.gpus):
            raise DispatchError(f"a GPU of {part.host} has no UUID (its agent never reported it)")
    env = {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in (job.env or {}).items()}
    env["FABRICPOOL_JOB_ID"] = str(job.pk)
    total = sum(len(p.gpus) for p in parts)
    share = None  # sharing: a fractional placement tells the agent its share (and MIG profile)
    if job.gpu_milli or job.gpu_memory_mib or job.mig_profile:
        row = PlacementGpu.objects.filter(placement_id=placement_id, share_milli__lt=1000).values_list(
            "share_milli", "memory_mib").first()
        if row:
            share = {"milli": row[0], "memory_mib": row[1], **({"mig_profile": job.mig_profile} if job.mig_profile else {})}
    requests = []
    for rank, part in enumerate(parts):
        request = {
            "schema": ALLOCATION_SCHEMA,
            "id": allocation_id(placement_id),
            "command": job.command,
            "env": env,
            "gpus": list(part.gpus),
            "workload": job.task_class,
        }
        if share:
            request["share"] = share  # sharing
        request["grace_period_s"] = job.grace_period_s  # the job's SIGTERM -> SIGKILL grace on stop
        if job.estimated_runtime_s is not None:
            request["duration_s"] = job.estimated_runtime_s  # how long the simulator's fake work runs
        if len(parts) > 1:
            # torchrun's meaning: world_size counts processes (one per GPU), node_rank the host.
            request["distributed"] = {"master_addr": parts[0].host, "master_port": MASTER_PORT, "world_size": total,
                                      "node_rank": rank, "nproc_per_node": len(part.gpus)}
        try:
            parse_allocation_request(request)  # the agent's own check, before anything is sent
        except ProtocolError as exc:
            raise DispatchError(f"the job's {exc}") from None
        requests.append(request)
    return requests


# -- state changes ------------------------------------------------------------------------------------

def _announce(job_ids: list[int], to_state: str) -> None:
    transaction.on_commit(lambda: signals.job_state_changed.send_robust(
        sender=Placement, job_ids=job_ids, to_state=to_state))


def _lock(placement_id: int) -> tuple[Job | None, Placement | None]:
    """Lock the placement's job, then the placement: the order cancel_job and the cycle use."""
    job_id = Placement.objects.filter(pk=placement_id).values_list("job_id", flat=True).first()
    if job_id is None:
        return None, None
    job = Job.objects.select_for_update().filter(pk=job_id).first()
    return job, Placement.objects.select_for_update().filter(pk=placement_id).first()


def begin(placement_id: int) -> Placement | None:
    """approved -> dispatching; the placement to send, or None when it is not ours to send
    (gone, decided otherwise, past dispatching, or cancelled meanwhile)."""
    with transaction.atomic():
        job, placement = _lock(placement_id)
        if placement is None or placement.stop_requested_at is not None:
            return None
        if placement.kind == Placement.Kind.PREEMPTION and not placement.placement_gpus.filter(active=True).exists():
            return None  # its victims are still stopping: scheduler.cycle.claim_preemptions sends it later
        if placement.state == Placement.State.DISPATCHING:
            return placement  # a retry or a redelivered message: send again (idempotent)
        if placement.state != Placement.State.APPROVED:
            return None
        now = timezone.now()
        Placement.objects.filter(pk=placement.pk).update(state=Placement.State.DISPATCHING, dispatched_at=now,
                                                         version=F("version") + 1)
        before = job.state
        if job.state == Job.State.APPROVED:
            Job.objects.filter(pk=job.pk).update(state=Job.State.DISPATCHING, state_changed_at=now)
            _announce([job.pk], Job.State.DISPATCHING)
        hosts = ", ".join(p.host for p in placement_parts(placement.pk))
        record(SYSTEM, "dispatch", job=job.pk, placement=placement.pk, from_state=before,
               to_state=Job.State.DISPATCHING, message=f"sending to {hosts}")
        placement.refresh_from_db()
    return placement


def fail(placement_id: int, message: str, *, job_state: str = Job.State.PENDING, data: dict | None = None) -> bool:
    """dispatching -> failed, GPUs freed, the job pending again (or failed for good).
    False when the placement is no longer dispatching (a report or a cancel moved it)."""
    with transaction.atomic():
        job, placement = _lock(placement_id)
        if placement is None or placement.state != Placement.State.DISPATCHING:
            return False
        now = timezone.now()
        Placement.objects.filter(pk=placement.pk).update(state=Placement.State.FAILED, finished_at=now,
                                                         message=message[:2000], version=F("version") + 1)
        PlacementGpu.objects.filter(placement_id=placement.pk, active=True).update(active=False)
        before = job.state
        if job.state in (Job.State.APPROVED, Job.State.DISPATCHING):
            if job_state == Job.State.PENDING:
                # Held back a while (scheduler.snapshot), so that the next cycle does not pick
                # the same refusing GPUs again at once.
                retry_at = (now + timedelta(seconds=failed_backoff())).replace(microsecond=0)
                waits = f"{message} (retry after {timezone.localtime(retry_at):%H:%M:%S})"
                Job.objects.filter(pk=job.pk).update(state=Job.State.PENDING, state_changed_at=now,
                                                     pending_reason=DISPATCH_FAILED, pending_message=waits[:2000],
                                                     expected_start=retry_at, message=message[:2000])
            else:
                Job.objects.filter(pk=job.pk).update(state=job_state, state_changed_at=now, finished_at=now,
                                                     pending_reason="", pending_message="", expected_start=None,
                                                     message=message[:2000])
            _announce([job.pk], job_state)
        else:
            job_state = before  # cancelled meanwhile: it stays so
        record(SYSTEM, "dispatch_failed", job=job.pk, placement=placement.pk, from_state=before, to_state=job_state,
               message=message, data=data or {})
    return True


# -- the tasks ------------------------------------------------------------------------------------------

def failed_backoff() -> float:
    """Seconds a job whose dispatch failed sits out before the cycles consider it again."""
    return max(0.0, float(getattr(settings, "DISPATCH_FAILED_BACKOFF_S", 60.0)))


def retries() -> int:
    return max(0, int(settings.DISPATCH_RETRIES))


def backoff(attempt: int) -> float:
    """Seconds before retry number attempt + 1 (0-based): DISPATCH_BACKOFF_S doubling."""
    return float(settings.DISPATCH_BACKOFF_S) * 2 ** attempt


@dataclass
class Outcome:
    state: str  # sent | retry | failed | skipped
    message: str = ""

    def as_dict(self) -> dict:
        return {"state": self.state, "message": self.message}


def dispatch(placement_id: int, *, attempt: int = 0, last_attempt: bool = True) -> Outcome:
    """One attempt at sending a placement (the task's body; attempt counts from 0)."""
    placement = begin(placement_id)
    if placement is None:
        state = Placement.objects.filter(pk=placement_id).values_list("state", flat=True).first()
        return Outcome("skipped", f"placement is {state or 'gone'}")
    job = Job.objects.get(pk=placement.job_id)
    parts = placement_parts(placement_id)
    try:
        requests = allocation_requests(job, placement_id, parts)
    except DispatchError as exc:
        message = f"cannot be dispatched: {exc}"
        fail(placement_id, message, job_state=Job.State.FAILED)
        return Outcome("failed", message)

    calls = [Call(p.host, "POST", agent_url(p.url), token_for(p.host), body) for p, body in zip(parts, requests)]
    answers = call_agents(calls)
    faults.pause_point("dispatch.sent")  # reliability tests kill the worker here: agents have it, we have not noted it
    refused = [a for a in answers if not a.ok and not a.transient]
    unanswered = [a for a in answers if not a.ok and a.transient]
    if not refused and not unanswered:
        record(SYSTEM, "dispatched", job=job.pk, placement=placement_id,
               message=f"accepted by {', '.join(a.host for a in answers)}")
        return Outcome("sent", f"accepted by {len(answers)} host{'s' if len(answers) != 1 else ''}")
    if not refused and not last_attempt:
        wait = backoff(attempt)
        message = "; ".join(a.describe() for a in unanswered[:5])
        record(SYSTEM, "dispatch_retry", job=job.pk, placement=placement_id,
               message=f"attempt {attempt + 1}: {message}; trying again in {wait:g} s")
        return Outcome("retry", message)

    problems = refused or unanswered
    message = "dispatch failed: " + "; ".join(a.describe() for a in problems[:3])
    if len(problems) > 3:
        message += f" (and {len(problems) - 3} more hosts)"
    if unanswered and not refused:
        message += f" after {attempt + 1} attempts"
    if fail(placement_id, message, data={"answers": [[a.host, a.status, a.message] for a in answers][:64]}):
        # Stop what may have started: every host except those that refused it outright.
        refusing = {a.host for a in refused}
        stops = [Call(p.host, "DELETE", agent_url(p.url, allocation_id(placement_id)), token_for(p.host))
                 for p in parts if p.host not in refusing]
        for answer in call_agents(stops):
            if not answer.ok and answer.status != 404:
                log.warning("placement %s: could not stop its part on %s (%s); it is stopped when that host "
                            "reports it", placement_id, answer.host, answer.describe())
    return Outcome("failed", message)


@shared_task(bind=True, name="scheduler.dispatch_placement", acks_late=True, ignore_result=True,
             soft_time_limit=120, time_limit=180)
def dispatch_placement(self, placement_id: int) -> dict:
    attempt = self.request.retries or 0
    outcome = dispatch(placement_id, attempt=attempt, last_attempt=attempt >= retries())
    if outcome.state == "retry":
        raise self.retry(countdown=backoff(attempt), max_retries=retries())
    log.info("placement %s: %s %s", placement_id, outcome.state, outcome.message)
    return outcome.as_dict()


def stop(placement_id: int, hosts: list[str] | None = None) -> list[Answer]:
    """DELETE the placement's allocation on its hosts (all of them, or those named).
    Returns the answers that may be worth another try. A host that answers 404 has no such
    work: it counts as stopped (scheduler.reconcile), so that the placement can end."""
    parts = [p for p in placement_parts(placement_id, active_only=False) if hosts is None or p.host in hosts]
    parts = [p for p in parts if p.url and p.agent_kind == Host.AgentKind.FABRICPOOL]
    calls = [Call(p.host, "DELETE", agent_url(p.url, allocation_id(placement_id)), token_for(p.host)) for p in parts]
    answers = call_agents(calls)
    absent = [(p.host_id, p.host) for p, a in zip(parts, answers) if a.status == 404]
    for answer in answers:
        if not answer.ok and not answer.transient and answer.status != 404:
            log.warning("placement %s: %s refused the stop: %s", placement_id, answer.host, answer.describe())
    if absent:
        from .reconcile import stopped_without_agent  # reconcile sends this module's tasks

        stopped_without_agent(placement_id, absent, "not on the agent when the stop arrived (it never started there)")
    return [a for a in answers if a.transient]


# -- stuck placements -----------------------------------------------------------------------------

# What counts as dispatch activity on a placement (each attempt and each re-send is audited).
DISPATCH_ACTIVITY = ("approve", "dispatch", "dispatch_retry", "dispatched", "dispatch_resend")


def stale_after() -> timedelta:
    return timedelta(seconds=max(1.0, float(getattr(settings, "DISPATCH_STALE_S", 60.0))))


def resend_stuck(now=None) -> list[int]:
    """Send dispatch again for placements stuck on the way to their agents: approved more
    than DISPATCH_STALE_S ago and never sent (the broker was away when the approval
    committed), or dispatching with no dispatch activity for that long (the worker died
    mid-dispatch and the broker holds the message for its visibility timeout). The agents
    answer a repeated request with 200 and start nothing twice. Each re-send is audited,
    and counts as activity: a placement is re-sent at most once per DISPATCH_STALE_S.
    Returns the placement ids sent again."""
    now = now or timezone.now()
    cutoff = now - stale_after()
    candidates = dict(Placement.objects.filter(
        Q(state=Placement.State.APPROVED) & (Q(decided_at__lte=cutoff) | Q(decided_at__isnull=True,
                                                                          created_at__lte=cutoff))
        | Q(state=Placement.State.DISPATCHING, dispatched_at__lte=cutoff),
        stop_requested_at__isnull=True).exclude(  # preemptions waiting for their victims have nothing to send
        Q(kind=Placement.Kind.PREEMPTION) & ~Q(placement_gpus__active=True)).order_by("pk").distinct()
        .values_list("id", "state"))
    if not candidates:
        return []
    recent = set(AuditEvent.objects.filter(placement_id__in=list(candidates), action__in=DISPATCH_ACTIVITY,
                                           created_at__gt=cutoff).values_list("placement_id", flat=True))
    stuck = {pid: state for pid, state in candidates.items() if pid not in recent}
    if not stuck:
        return []
    ids = sorted(stuck)
    seconds = int(stale_after().total_seconds())
    jobs = dict(Placement.objects.filter(pk__in=ids).values_list("id", "job_id"))
    events = AuditEvent.objects.bulk_create([AuditEvent(
        created_at=now, actor=SYSTEM, action="dispatch_resend", job_id=jobs.get(pid), placement_id=pid,
        message=(f"approved over {seconds} s ago and never sent to its agents" if state == Placement.State.APPROVED
                 else f"dispatching for over {seconds} s with no sign of its dispatch") + ": sending it again",
        data={"state": state}) for pid, state in stuck.items()])
    failures = [r for _, r in signals.placements_approved.send_robust(sender=Placement, placement_ids=ids)
                if isinstance(r, Exception)]
    if failures:
        # The broker is still away: the event says so, and the next try is DISPATCH_STALE_S later.
        for event in events:
            AuditEvent.objects.filter(pk=event.pk).update(
                message=f"{event.message}, but it could not be queued ({failures[0]}); trying again in {seconds} s")
        log.error("could not queue %s stuck placements again: %s", len(ids), failures[0])
    else:
        log.warning("%s placements stuck on their way to the agents sent again: %s", len(ids), ids[:20])
    return ids


@shared_task(bind=True, name="scheduler.stop_placement", acks_late=True, ignore_result=True,
             soft_time_limit=120, time_limit=180)
def stop_placement(self, placement_id: int, hosts: list[str] | None = None) -> dict:
    attempt = self.request.retries or 0
    unanswered = stop(placement_id, hosts)
    if unanswered:
        if attempt < retries():
            raise self.retry(args=[placement_id, [a.host for a in unanswered]], countdown=backoff(attempt),
                             max_retries=retries())
        message = "; ".join(a.describe() for a in unanswered[:5])
        job_id = Placement.objects.filter(pk=placement_id).values_list("job_id", flat=True).first()
        record(SYSTEM, "stop_failed", job=job_id, placement=placement_id,
               message=f"could not reach {len(unanswered)} host(s) to stop the work: {message}; "
                       "it is stopped when they report it")
        return {"stopped": False, "unanswered": [a.host for a in unanswered]}
    return {"stopped": True}


@shared_task(name="scheduler.ack_allocations", ignore_result=True, soft_time_limit=60, time_limit=90)
def ack_allocations(items: list[list]) -> int:
    """items: [[host_id, allocation id], ...] of finished work whose end is recorded."""
    hosts = {pk: (name, url) for pk, name, url in Host.objects.filter(pk__in={h for h, _ in items}).values_list(
        "id", "name", "agent_url")}
    calls = [Call(hosts[h][0], "POST", agent_url(hosts[h][1], alloc, "ack"), token_for(hosts[h][0]), {})
             for h, alloc in items if h in hosts and hosts[h][1]]
    answers = call_agents(calls)
    for answer in answers:
        if not answer.ok:
            log.info("ack not delivered (%s); it is sent again after the next report", answer.describe())
    return sum(a.ok for a in answers)
