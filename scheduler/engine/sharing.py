"""GPU sharing: pack jobs that ask for a fraction of one GPU onto GPUs (pure, no Django).

A fractional request is a share in thousandths (`milli`, 1-999, as the Alibaba trace's
`gpu_milli`), GPU memory in MiB, or both; or a MIG profile ("3g.40gb"). On a GPU:

  * the shares of its jobs sum to at most 1000 and their memory to at most its memory; a
    memory-only request counts as the share of the GPU's memory it takes, so memory alone
    cannot pile up unlimited jobs on one GPU;
  * a GPU held by a whole-GPU job takes no share, and a shared GPU takes no whole-GPU job;
  * MIG: a profile "Ng.Mgb" takes N of the GPU's 7 compute slices and M GiB; a GPU with MIG
    instances takes only MIG jobs and one without takes no MIG job (MIG mode is per GPU).

Choice of GPU (so whole GPUs stay whole for whole-GPU jobs): a GPU already shared before an
untouched one; then the least fragmenting (FGD, Weng et al., ATC'23: the fragmentation of a
GPU is the free share that a typical request could not use; the typical requests are the
`workload`, a list of (milli, weight)); then the tightest fit; then the id.
"""
from __future__ import annotations

import math
import re
from fractions import Fraction
from dataclasses import dataclass, field
from typing import Hashable, Iterable, Sequence

MILLI = 1000
MIG_SLICES = 7
MIG_PROFILE = re.compile(r"^(?P<slices>[1-7])g\.(?P<gb>\d{1,3})gb$")
MIG_MODELS = ("A100", "A30", "H100", "H200", "H20", "B200", "GB200")  # GPUs that have MIG

# The openb trace's sharing requests, as (milli, share of sharing pods): the default workload.
DEFAULT_WORKLOAD = ((1000, 0.56), (810, 0.15), (470, 0.11), (320, 0.05), (650, 0.04), (230, 0.02),
                    (460, 0.02), (590, 0.01), (160, 0.01), (550, 0.01), (220, 0.01), (370, 0.01))


class SharingError(ValueError):
    """A fractional request that can never be valid (the message says which field and why)."""


@dataclass(frozen=True, slots=True)
class Request:
    job_id: Hashable
    milli: int = 0  # 1-999; 0 with memory_mib: memory only
    memory_mib: int = 0
    mig_profile: str = ""

    @property
    def mig(self) -> tuple[int, int] | None:
        return parse_mig(self.mig_profile) if self.mig_profile else None


@dataclass(slots=True)
class SharedGpu:
    """One GPU as sharing sees it. `whole`: held by a whole-GPU job."""
    id: Hashable
    host: Hashable = None
    memory_mib: int = 0
    model: str = ""
    used_milli: int = 0
    used_memory_mib: int = 0
    whole: bool = False
    mig_slices: int = 0  # compute slices taken by MIG instances (0: not in MIG use)
    jobs: list = field(default_factory=list)

    @property
    def free_milli(self) -> int:
        return 0 if self.whole else MILLI - self.used_milli

    @property
    def shared(self) -> bool:
        return self.used_milli > 0 or self.mig_slices > 0

    @property
    def mig_capable(self) -> bool:
        words = set(re.split(r"[^A-Z0-9]+", self.model.upper()))
        return any(m in words for m in MIG_MODELS)


@dataclass(frozen=True, slots=True)
class Assignment:
    job_id: Hashable
    gpu_id: Hashable
    milli: int  # the share it holds on that GPU (what PlacementGpu.share_milli stores)
    memory_mib: int
    mig_device: str = ""  # "<profile>@<first slice>" for MIG; the agent resolves the instance


@dataclass
class Packing:
    assigned: dict  # job id -> Assignment
    refused: dict  # job id -> sentence
    fragmentation: float  # milli-GPUs typical requests could not use, summed over GPUs
    whole_free: int  # GPUs wholly free after packing


def parse_mig(profile: str) -> tuple[int, int]:
    """'3g.40gb' -> (3 slices, 40 GiB). SharingError names the profile when it is not one."""
    m = MIG_PROFILE.match((profile or "").strip().lower())
    if not m or int(m["slices"]) not in (1, 2, 3, 4, 7) or int(m["gb"]) < 1:
        raise SharingError(f"MIG profile {profile!r} is not of the form Ng.Mgb with N in 1, 2, 3, 4 or 7 "
                           "(e.g. 1g.10gb, 3g.40gb)")
    return int(m["slices"]), int(m["gb"])


def check_request(milli: int = 0, memory_mib: int = 0, mig_profile: str = "") -> None:
    """Raise SharingError (naming the field) unless this is a valid fractional request."""
    if isinstance(milli, bool) or not isinstance(milli, int) or not 0 <= milli < MILLI:
        raise SharingError(f"gpu_milli must be a whole number from 1 to 999 (thousandths of one GPU), "
                           f"not {milli!r}")
    if isinstance(memory_mib, bool) or not isinstance(memory_mib, int) or memory_mib < 0:
        raise SharingError(f"gpu_memory_mib must be a whole number of MiB, not {memory_mib!r}")
    if mig_profile:
        parse_mig(mig_profile)
        if milli or memory_mib:
            raise SharingError("a MIG profile fixes the share and memory: leave gpu_milli and gpu_memory_mib at 0")
    elif not milli and not memory_mib:
        raise SharingError("a fractional request needs gpu_milli, gpu_memory_mib or a MIG profile")


def is_fractional(milli: int = 0, memory_mib: int = 0, mig_profile: str = "") -> bool:
    return bool(milli or memory_mib or mig_profile)


def need(gpu: SharedGpu, req: Request) -> tuple[int, int] | None:
    """(milli, memory MiB) the request takes on this GPU, or None if it can never go there."""
    mig = req.mig
    if mig is not None:
        slices, gb = mig
        if not gpu.mig_capable or gpu.memory_mib and gb * 1024 > gpu.memory_mib:
            return None
        return min(MILLI - 1, slices * MILLI // MIG_SLICES), gb * 1024  # < 1000: stays a shared row
    milli = req.milli
    if req.memory_mib:
        if gpu.memory_mib and req.memory_mib > gpu.memory_mib:
            return None
        if gpu.memory_mib:
            milli = max(milli, math.ceil(MILLI * req.memory_mib / gpu.memory_mib))
    return max(milli, 1), req.memory_mib


def fits(gpu: SharedGpu, req: Request) -> tuple[int, int] | None:
    """(milli, memory) if the request fits on the GPU now, else None."""
    if gpu.whole:
        return None
    n = need(gpu, req)
    if n is None:
        return None
    milli, mem = n
    if req.mig is not None:
        if gpu.used_milli and not gpu.mig_slices:
            return None  # shared without MIG
        if gpu.mig_slices + req.mig[0] > MIG_SLICES:
            return None
    elif gpu.mig_slices:
        return None
    if gpu.used_milli + milli > MILLI:
        return None
    if gpu.memory_mib and gpu.used_memory_mib + mem > gpu.memory_mib:
        return None
    return milli, mem


def gpu_fragmentation(free_milli: int, workload: Sequence[tuple[int, float]] = DEFAULT_WORKLOAD) -> float:
    """FGD's measure for one GPU: the expected free share a typical request cannot use."""
    if free_milli <= 0:
        return 0.0
    total = sum(w for _, w in workload) or 1.0
    lost = 0.0
    for milli, weight in workload:
        # A whole-GPU request cannot use a partly used GPU; a fraction cannot use less than it.
        unusable = free_milli < MILLI if milli >= MILLI else free_milli < milli
        if unusable:
            lost += weight * free_milli
    return lost / total


def fragmentation(gpus: Iterable[SharedGpu], workload: Sequence[tuple[int, float]] = DEFAULT_WORKLOAD) -> float:
    return sum(gpu_fragmentation(g.free_milli, workload) for g in gpus)


def choose(gpus: Sequence[SharedGpu], req: Request,
           workload: Sequence[tuple[int, float]] = DEFAULT_WORKLOAD) -> tuple[SharedGpu, int, int] | None:
    """The GPU for one request (see module doc) with its (milli, memory), or None."""
    best = None
    for gpu in gpus:
        taken = fits(gpu, req)
        if taken is None:
            continue
        milli, _ = taken
        before = gpu_fragmentation(gpu.free_milli, workload)
        after = gpu_fragmentation(gpu.free_milli - milli, workload)
        key = (not gpu.shared, after - before, gpu.free_milli - milli, repr(gpu.id))
        if best is None or key < best[0]:
            best = (key, gpu, taken)
    if best is None:
        return None
    return best[1], best[2][0], best[2][1]


def take(gpu: SharedGpu, req: Request, milli: int, memory_mib: int) -> Assignment:
    mig_device = ""
    if req.mig is not None:
        mig_device = f"{req.mig_profile.strip().lower()}@{gpu.mig_slices}"
        gpu.mig_slices += req.mig[0]
    gpu.used_milli += milli
    gpu.used_memory_mib += memory_mib
    gpu.jobs.append(req.job_id)
    return Assignment(job_id=req.job_id, gpu_id=gpu.id, milli=milli, memory_mib=memory_mib, mig_device=mig_device)


def pack(gpus: Sequence[SharedGpu], requests: Iterable[Request],
         workload: Sequence[tuple[int, float]] = DEFAULT_WORKLOAD) -> Packing:
    """Place requests in the order given; `gpus` are updated in place."""
    assigned, refused = {}, {}
    for req in requests:
        try:
            check_request(req.milli, req.memory_mib, req.mig_profile)
        except SharingError as exc:
            refused[req.job_id] = str(exc)
            continue
        pick = choose(gpus, req, workload)
        if pick is None:
            refused[req.job_id] = _why_not(gpus, req)
            continue
        gpu, milli, mem = pick
        assigned[req.job_id] = take(gpu, req, milli, mem)
    return Packing(assigned=assigned, refused=refused, fragmentation=fragmentation(gpus, workload),
                   whole_free=sum(1 for g in gpus if not g.whole and not g.shared))


def quota_share(milli: int, mig_profile: str = "") -> Fraction:
    """What a share counts against a tenant's GPU quota: milli/1000 (a memory-only request's
    milli is already its memory over the GPU's, rounded up), or for MIG slices/7."""
    if mig_profile:
        return Fraction(parse_mig(mig_profile)[0], MIG_SLICES)
    return Fraction(milli, MILLI)


def _why_not(gpus: Sequence[SharedGpu], req: Request) -> str:
    if not any(need(g, req) is not None for g in gpus):
        if req.mig is not None:
            return f"No GPU here supports MIG profile {req.mig_profile} (MIG-capable: {', '.join(MIG_MODELS)})."
        return f"No GPU here has {req.memory_mib} MiB of memory."
    what = req.mig_profile or " and ".join(
        x for x in ((f"{req.milli}/1000 of a GPU" if req.milli else ""),
                    (f"{req.memory_mib} MiB" if req.memory_mib else "")) if x)
    return f"No GPU has {what} free now."


# -- the engine's hook (plan._Cycle.decide calls this for a fractional job) -----------------------

def decide(cycle, rank: int, job):
    """One Decision for a fractional job inside an allocation cycle. Candidates: healthy
    GPUs of its class (pool, site, models) that are wholly free or already shared; a GPU
    it breaks is taken out of the cycle's free set so no whole-GPU job gets it too.
    Against its tenant's quota it counts as its share of the GPU (quota_share)."""
    from .model import CONSTRAINTS, QUOTA, RESOURCES, Cost, Decision
    from .plan import gpus_text

    def pending(reason, message):
        cycle._drop_demand(job)
        return Decision(job_id=job.id, rank=rank, placed=False, reason=reason, message=message)

    try:
        check_request(job.gpu_milli, job.gpu_memory_mib, job.mig_profile)
    except SharingError as exc:
        return pending(CONSTRAINTS, f"{exc}.")
    if job.gpus != 1:
        return pending(CONSTRAINTS, f"A fractional job runs on one GPU; it asks for {job.gpus}.")
    fab = cycle.fab
    state = getattr(cycle, "shared_gpus", None)
    if state is None:  # GPUs partly shared when the cycle began, and those shared since
        state = cycle.shared_gpus = {}
        for g in cycle.snap.gpus:
            if (g.used_milli or g.mig_slices) and g.healthy and fab.host_healthy[fab.gpu_host[g.id]]:
                state[g.id] = SharedGpu(id=g.id, host=g.host, memory_mib=g.memory_mib, model=g.model,
                                        used_milli=g.used_milli, used_memory_mib=g.used_memory_mib,
                                        mig_slices=g.mig_slices)
    cls = cycle.class_for(job)
    candidates = []
    for ids in cls.elig.values():
        for i in ids:
            if i in state:
                candidates.append(state[i])
            elif i in cycle.free:
                g = fab.gpu[i]
                candidates.append(SharedGpu(id=i, host=g.host, memory_mib=g.memory_mib, model=g.model))
    req = Request(job.id, job.gpu_milli, job.gpu_memory_mib, job.mig_profile)
    pick = choose(candidates, req)
    if pick is None:
        if not cls.elig:
            return pending(CONSTRAINTS, f"No GPU in pool {job.pool!r} matches its request.")
        return pending(RESOURCES, _why_not(candidates, req) if candidates else
                       "No matching GPU is free or shared with room now.")
    gpu, milli, mem = pick
    fresh = gpu.id not in state
    # Quota: the share counts against the limit; beyond the guarantee it is borrowed, and a
    # borrowed share may break a free GPU only if one is left after others' unmet guarantees.
    key = (job.tenant, job.pool)
    q = cycle.quota(job.tenant, job.pool)
    used = cycle.used.get(key, 0)
    share = quota_share(milli, job.mig_profile)
    if q.limit is not None and used + share > q.limit:
        return pending(QUOTA, f"Tenant {job.tenant} would use {gpus_text(used + share)} GPUs in pool {job.pool}, "
                              f"over its limit of {q.limit} ({gpus_text(used)} in use).")
    borrowed = cycle._borrowed(job, used, share)
    if borrowed and fresh:
        others_need = cycle.pool_reserve.get(job.pool, 0) - cycle.reserve.get(key, 0)
        if cycle.pool_free.get(job.pool, 0) - others_need < 1:
            return pending(QUOTA, f"It would borrow {gpus_text(borrowed)} of a GPU beyond tenant {job.tenant}'s "
                                  f"guarantee of {q.guaranteed} in pool {job.pool}, and no free GPU is left that "
                                  "other tenants' guarantees do not need.")
    state[gpu.id] = gpu
    if fresh:
        cycle._take([gpu.id])  # broken for whole-GPU jobs from now on
    a = take(gpu, req, milli, mem)
    cycle.used[key] = used + share
    cycle._drop_demand(job)
    h = fab.gpu_host[gpu.id]
    grp = fab.host_group[h]
    what = job.mig_profile or f"{milli}/1000 of a GPU" + (f" and {mem} MiB" if mem else "")
    where = "a GPU already shared" if not fresh else "a free GPU (no shared GPU had room)"
    message = (f"Shares {fab.host_name[h]}/{fab.gpu[gpu.id].index} ({fab.group_label(grp)}): {what} on {where}; "
               f"{MILLI - gpu.used_milli}/1000 of it stay free.")
    cost = Cost(hosts=1, leaves=1, pod_crossings=0, health_penalty=fab.group_pen[grp], fragmentation_left=0)
    return Decision(job_id=job.id, rank=rank, placed=True, message=message, gpu_ids=(gpu.id,),
                    host_ids=(fab.host_ids[h],), leaves=tuple(fab.group_key[grp]), leaves_lower_bound=1, cost=cost,
                    borrowed=bool(borrowed), shares=((gpu.id, a.milli, a.memory_mib, a.mig_device),))
