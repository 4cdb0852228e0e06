"""Check and cost a GPU set someone chose by hand (an operator's override)."""
from __future__ import annotations

from .index import Fabric, model_matches
from .model import Cost, Job, Snapshot
from .placement import describe
from .plan import NO_QUOTA, gpus_text


def validate_and_cost(job: Job, gpu_ids, snapshot: Snapshot) -> Cost | list[str]:
    """The Cost of giving `gpu_ids` to `job` now, or the list of rules it breaks (sentences).

    The job's own active placement in `snapshot.running` (same job id) is ignored, so an
    override may reuse GPUs of the proposal it replaces. Host and leaf counts are costs, not
    rules: an operator may spread a job on purpose; a hard (or not yet relaxed soft) leaf
    limit, the constraints, health, pool and the tenant's quota limit are rules.
    Raises SnapshotError if the snapshot contradicts itself.
    """
    fab = Fabric(snapshot)
    problems: list[str] = []
    ids = list(gpu_ids)
    seen = set()
    for i in ids:
        if i in seen:
            problems.append(f"GPU {i} is listed twice.")
        seen.add(i)
    unknown = [i for i in seen if i not in fab.gpu]
    problems += [f"GPU {i} does not exist." for i in unknown]
    known = [i for i in dict.fromkeys(ids) if i in fab.gpu]
    count = len(seen)
    if job.gang and count != job.gpus:
        problems.append(f"The job needs exactly {job.gpus} GPUs (gang); {count} were chosen.")
    elif not job.gang and not 1 <= count <= job.gpus:
        problems.append(f"The job takes between 1 and {job.gpus} GPUs; {count} were chosen.")

    busy = {}
    used = 0
    for r in snapshot.running:
        if r.job_id == job.id:
            continue
        for i in r.gpu_ids:
            busy[i] = r.job_id
        if (r.tenant, r.pool) == (job.tenant, job.pool):
            used += r.quota_gpus  # sharing: a share counts as its fraction
    c = job.constraints
    for i in known:
        g = fab.gpu[i]
        h = fab.gpu_host[i]
        name = f"GPU {fab.host_name[h]}/{g.index}"
        if i in busy:
            problems.append(f"{name} is in use by job {busy[i]}.")
        elif not g.free and not any(r.job_id == job.id and i in r.gpu_ids for r in snapshot.running):
            problems.append(f"{name} is not free.")
        if not g.healthy:
            problems.append(f"{name} is marked unhealthy.")
        if not fab.host_healthy[h]:
            problems.append(f"{name} is on unhealthy host {fab.host_name[h]}.")
        if fab.host_pool[h] != job.pool:
            problems.append(f"{name} is in pool {fab.host_pool[h]}, not {job.pool}.")
        if c.models and not any(model_matches(m, g.model) for m in c.models):
            problems.append(f"{name} is a {g.model or 'GPU of unknown model'}, not {' or '.join(sorted(c.models))}.")
        if g.memory_mib < c.min_memory_mib:
            problems.append(f"{name} has {g.memory_mib} MiB, less than {c.min_memory_mib} MiB.")
        if c.fp64 is not None and g.fp64 != c.fp64:
            problems.append(f"{name} has FP64 class {g.fp64}, not {c.fp64}.")
        if c.site is not None and fab.host_site[h] != c.site:
            problems.append(f"{name} is at site {fab.host_site[h] or 'unknown'}, not {c.site}.")

    chosen = set(known)
    usable = {g.id for g in snapshot.gpus if g.free and g.healthy and g.id not in busy}
    info = describe(fab, known, lambda h: sum(1 for g in fab.host_gpus[h]
                                               if g.id in usable and g.id not in chosen and fab.host_healthy[h]))
    topo = job.topology
    if topo is not None and (topo.hard or snapshot.now < job.submit_time + topo.max_wait_s):
        if len(info["groups"]) > topo.max_leaves:
            kind = "hard" if topo.hard else "soft (not yet relaxed)"
            problems.append(f"It uses {len(info['groups'])} leaf switches; the job's {kind} limit is "
                            f"{topo.max_leaves}.")
    q = snapshot.quotas.get((job.tenant, job.pool), NO_QUOTA)
    if q.limit is not None and used + count > q.limit:
        problems.append(f"Tenant {job.tenant} would use {gpus_text(used + count)} GPUs in pool {job.pool}, "
                        f"over its limit of {q.limit}.")
    if problems:
        return problems
    return Cost(hosts=len(info["hosts"]), leaves=len(info["groups"]), pod_crossings=len(info["pods"]) - 1,
                health_penalty=info["health_penalty"], fragmentation_left=info["fragmentation_left"])
