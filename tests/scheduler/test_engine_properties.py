"""Properties of the engine on random small clusters (hypothesis): whatever the snapshot,
no GPU is given twice or while busy, every placement meets its constraints, quotas hold,
gang jobs get all or nothing, hard leaf limits hold, held GPUs only go to jobs that end in
time, and every job gets exactly one decision that a person can read."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.engine import (REASONS, Constraints, Cost, Gpu, Host, Job, Leaf, Pod, Quota, Running, Snapshot,
                              TopologyRequirement, plan, validate_and_cost)
from scheduler.engine.index import model_matches

MODELS = ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB", "Tesla T4")
MEMORY = {"NVIDIA H100 80GB HBM3": 81559, "NVIDIA A100-SXM4-40GB": 40960, "Tesla T4": 15360}
FP64 = {"NVIDIA H100 80GB HBM3": "high", "NVIDIA A100-SXM4-40GB": "high", "Tesla T4": "low"}
TENANTS = ("a", "b", "c")
POOLS = ("p", "q")


@st.composite
def snapshots(draw):
    now = 1000.0
    npods = draw(st.integers(1, 2))
    pods = [Pod(id=p, name=f"P{p}") for p in range(npods)]
    leaves, hosts, gpus = [], [], []
    for p in range(npods):
        for _ in range(draw(st.integers(1, 3))):
            lid = len(leaves)
            pen = draw(st.sampled_from((0.0,) * 6 + (0.5, 1.0)))
            leaves.append(Leaf(id=lid, name=f"L{lid}", pod=p, health_penalty=pen))
            for _ in range(draw(st.integers(1, 4))):
                h = len(hosts)
                model = draw(st.sampled_from(MODELS))
                hosts.append(Host(id=h, name=f"h{h}", leaves=(lid,), pool=draw(st.sampled_from(POOLS + ("p",) * 4)),
                                  site=draw(st.sampled_from(("x", "y"))), healthy=draw(st.integers(0, 9)) > 0))
                for i in range(draw(st.sampled_from((4, 8)))):
                    gpus.append(Gpu(id=len(gpus), host=h, index=i, model=model, memory_mib=MEMORY[model],
                                    fp64=FP64[model], free=draw(st.integers(0, 9)) > 0,
                                    healthy=draw(st.integers(0, 49)) > 0))
    # Running placements on disjoint random GPUs.
    ids = list(range(len(gpus)))
    taken = draw(st.lists(st.sampled_from(ids), unique=True, max_size=len(ids) // 2)) if ids else []
    running, k = [], 0
    ends = st.floats(now, now + 5000)
    while k < len(taken):
        size = draw(st.integers(1, 8))
        chunk = tuple(taken[k:k + size])
        k += size
        running.append(Running(job_id=f"r{len(running)}", gpu_ids=chunk, tenant=draw(st.sampled_from(TENANTS)),
                               pool=draw(st.sampled_from(POOLS)),
                               expected_end=draw(st.one_of(st.none(), ends, ends))))
    queue = []
    for j in range(draw(st.integers(1, 16))):
        topo = draw(st.one_of(st.none(), st.builds(TopologyRequirement, max_leaves=st.integers(1, 3),
                                                    hard=st.booleans(), max_wait_s=st.sampled_from((0, 500, 5000)))))
        constraints = Constraints(
            models=draw(st.sampled_from((frozenset(),) * 4 + (frozenset({"H100"}), frozenset({"T4", "A100"})))),
            min_memory_mib=draw(st.sampled_from((0,) * 4 + (40000,))),
            fp64=draw(st.sampled_from((None,) * 4 + ("high",))),
            site=draw(st.sampled_from((None,) * 4 + ("x",))))
        queue.append(Job(id=j, tenant=draw(st.sampled_from(TENANTS)), pool=draw(st.sampled_from(POOLS + ("p",) * 4)),
                         gpus=draw(st.sampled_from((1, 1, 2, 3, 4, 8, 12, 16, 24, 32))), constraints=constraints,
                         priority=draw(st.integers(0, 2)), submit_time=draw(st.floats(0, now)),
                         gang=draw(st.integers(0, 4)) > 0, whole_hosts=draw(st.integers(0, 3)) > 0,
                         estimated_runtime=draw(st.one_of(st.none(), st.floats(1, 3000))), topology=topo))
    quotas = {}
    for t in TENANTS:
        for p in POOLS:
            if draw(st.booleans()):
                g = draw(st.integers(0, 16))
                quotas[(t, p)] = Quota(guaranteed=g, limit=draw(st.one_of(st.none(), st.integers(g, 40))),
                                       usage=draw(st.floats(0, 100)))
    return Snapshot(gpus=gpus, hosts=hosts, leaves=leaves, pods=pods, running=running, queue=queue,
                    quotas=quotas, now=now)


def _runtime(job):
    return job.estimated_runtime if job.estimated_runtime is not None else job.max_runtime


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots())
def test_plan_invariants(snap):
    result = plan(snap)
    jobs = {j.id: j for j in snap.queue}
    gpu = {g.id: g for g in snap.gpus}
    host = {h.id: h for h in snap.hosts}
    leaf_of = {h.id: h.leaves[0] for h in snap.hosts}
    busy = {i for r in snap.running for i in r.gpu_ids}

    # One decision per job, readable, with a known reason when pending.
    assert sorted(d.job_id for d in result.decisions) == sorted(jobs)
    for d in result.decisions:
        assert d.message
        assert d.placed or (d.reason in REASONS and not d.gpu_ids)

    given_out = set()
    used = {}
    for r in snap.running:
        used[(r.tenant, r.pool)] = used.get((r.tenant, r.pool), 0) + len(r.gpu_ids)
    used_before = dict(used)
    for d in result.placed:
        job = jobs[d.job_id]
        ids = d.gpu_ids
        # No GPU twice, none busy, all usable.
        assert len(set(ids)) == len(ids) and not (set(ids) & given_out) and not (set(ids) & busy)
        given_out |= set(ids)
        # Gang: exactly N; otherwise 1..N, and "partial" says which.
        if job.gang:
            assert len(ids) == job.gpus and not d.partial
        else:
            assert 1 <= len(ids) <= job.gpus and d.partial == (len(ids) < job.gpus)
        c = job.constraints
        for i in ids:
            g, h = gpu[i], host[gpu[i].host]
            assert g.free and g.healthy and h.healthy and h.pool == job.pool
            assert not c.models or any(model_matches(m, g.model) for m in c.models)
            assert g.memory_mib >= c.min_memory_mib and (c.fp64 is None or g.fp64 == c.fp64)
            assert c.site is None or h.site == c.site
        # Hard (or not yet relaxed) leaf limits hold; multi-leaf jobs avoid cut-off leaves.
        leaves_used = {leaf_of[gpu[i].host] for i in ids}
        topo = job.topology
        if topo is not None and (topo.hard or snap.now < job.submit_time + topo.max_wait_s):
            assert len(leaves_used) <= topo.max_leaves
        if len(leaves_used) > 1 and job.gang:  # non-gang GPUs need not talk to each other
            assert all(snap.leaves[l].health_penalty < 1 for l in leaves_used)
        assert d.cost.leaves == len(leaves_used) and d.leaves_lower_bound <= d.cost.leaves
        # The override checker agrees this set is allowed, and on its shape.
        checked = validate_and_cost(job, ids, snap)
        assert isinstance(checked, Cost), checked
        assert (checked.hosts, checked.leaves, checked.pod_crossings) == (d.cost.hosts, d.cost.leaves,
                                                                         d.cost.pod_crossings)
        key = (job.tenant, job.pool)
        used[key] = used.get(key, 0) + len(ids)

    # Quotas: nobody placed past its limit.
    for key, q in snap.quotas.items():
        if q.limit is not None and used.get(key, 0) > used_before.get(key, 0):
            assert used[key] <= q.limit
    # Held GPUs only go to jobs that end before the reservation starts.
    r = result.reservation
    if r is not None:
        held = set(r.gpu_ids)
        assert r.start >= snap.now and jobs[r.job_id] and not result.by_job()[r.job_id].placed
        assert result.by_job()[r.job_id].expected_start == r.start
        for d in result.placed:
            if set(d.gpu_ids) & held:
                rt = _runtime(jobs[d.job_id])
                assert rt is not None and snap.now + rt <= r.start
