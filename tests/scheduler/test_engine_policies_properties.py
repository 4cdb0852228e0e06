"""Properties of the engine with preemption, task classes, sites and rebalancing in play
(hypothesis): no GPU is given twice; a preemption takes only free GPUs and its own victims'
GPUs, victims are preemptible borrowed work of a preemptible class, each given once; remote
placements keep a gang at one site; quota limits hold, a fractional job (GPU sharing)
counting as its share of a GPU; no GPU is over-committed (shares at most 1000/1000, MIG at
most 7 slices, never a share beside a whole job); moves target free GPUs nobody got."""
from __future__ import annotations

from fractions import Fraction

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.engine.sharing import quota_share
from scheduler.engine import (PREEMPTION, REMOTE, ClassRule, Constraints, Gpu, Host, Job, Leaf, Pod, Quota, Running,
                              SiteLink, Snapshot, plan)

TENANTS = ("a", "b")
SITES = ("x", "y", "z")
CLASSES = ("training", "inference", "science", "rendering")
RULES = {"training": ClassRule(), "inference": ClassRule(prefer_healthy_leaves=True, preemptible=False),
         "science": ClassRule(requires_fp64="high"), "rendering": ClassRule(leftovers_only=True)}


@st.composite
def snapshots(draw):
    now = 10_000.0
    leaves, hosts, gpus = [], [], []
    for lid in range(draw(st.integers(1, 4))):
        leaves.append(Leaf(id=lid, name=f"L{lid}", pod=0, health_penalty=draw(st.sampled_from((0.0, 0.0, 0.5)))))
        for _ in range(draw(st.integers(1, 3))):
            h = len(hosts)
            hosts.append(Host(id=h, name=f"h{h}", leaves=(lid,), pool="p", site=draw(st.sampled_from(SITES))))
            fp64 = draw(st.sampled_from(("high", "low")))
            for i in range(draw(st.sampled_from((4, 8)))):
                gpus.append(Gpu(id=len(gpus), host=h, index=i, model="H100", memory_mib=80000, fp64=fp64,
                                free=draw(st.integers(0, 9)) > 0))
    ids = list(range(len(gpus)))
    taken = draw(st.lists(st.sampled_from(ids), unique=True, min_size=len(ids) // 3, max_size=len(ids) * 3 // 4)) \
        if ids else []
    running, k = [], 0
    while k < len(taken):
        size = draw(st.sampled_from((1, 2, 4, 8)))
        chunk = tuple(taken[k:k + size])
        k += size
        running.append(Running(
            job_id=f"r{len(running)}", gpu_ids=chunk, tenant=draw(st.sampled_from(TENANTS)), pool="p",
            preemptible=draw(st.sampled_from((True, True, False))), borrowed=draw(st.sampled_from((True, True, False))), priority=draw(st.integers(0, 3)),
            start=draw(st.one_of(st.floats(0, now), st.floats(0, now), st.none())), task_class=draw(st.sampled_from(CLASSES)),
            restartable=draw(st.booleans()), placement=len(running)))
    queue = []
    for j in range(draw(st.integers(1, 10))):
        home = draw(st.sampled_from((None, "x", "y")))
        queue.append(Job(id=j, tenant=draw(st.sampled_from(TENANTS)), pool="p",
                         gpus=draw(st.sampled_from((1, 2, 4, 8, 12, 16))), constraints=Constraints(site=home),
                         task_class=draw(st.sampled_from(CLASSES)), priority=draw(st.integers(0, 4)),
                         submit_time=draw(st.floats(0, now)), allow_remote_site=draw(st.booleans()),
                         remote_after_s=draw(st.sampled_from((0.0, 5000.0, 20000.0))),
                         whole_hosts=draw(st.booleans())))
    quotas = {}
    for t in TENANTS:
        if draw(st.booleans()):
            g = draw(st.integers(0, 16))
            quotas[(t, "p")] = Quota(guaranteed=g, limit=draw(st.one_of(st.none(), st.integers(g, 48))))
    links = {frozenset((a, b)): SiteLink(latency_ms=draw(st.floats(1, 80)), bandwidth_gbps=100,
                                         healthy=draw(st.integers(0, 4)) > 0)
             for a, b in (("x", "y"), ("x", "z"), ("y", "z")) if draw(st.booleans())}
    # sharing: some GPUs nobody holds whole are already partly shared by running fractional jobs.
    rest = [i for i in ids if i not in set(taken)]
    for i in draw(st.lists(st.sampled_from(rest), unique=True, max_size=3)) if rest else []:
        milli = draw(st.sampled_from((300, 500, 900)))
        gpus[i] = Gpu(id=i, host=gpus[i].host, index=gpus[i].index, model="H100", memory_mib=80000,
                      fp64=gpus[i].fp64, free=False, used_milli=milli, used_memory_mib=milli * 40)
        running.append(Running(job_id=f"s{i}", gpu_ids=(), tenant=draw(st.sampled_from(TENANTS)), pool="p",
                               share=Fraction(milli, 1000), placement=len(running)))
    for j in range(len(queue), len(queue) + draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(("milli", "memory", "mig")))
        queue.append(Job(id=j, tenant=draw(st.sampled_from(TENANTS)), pool="p", gpus=1,
                         priority=draw(st.integers(0, 4)), submit_time=draw(st.floats(0, now)),
                         gpu_milli=draw(st.sampled_from((100, 250, 500, 800))) if kind == "milli" else 0,
                         gpu_memory_mib=draw(st.sampled_from((10000, 40000))) if kind == "memory" else 0,
                         mig_profile=draw(st.sampled_from(("1g.10gb", "3g.40gb"))) if kind == "mig" else ""))
    for t in TENANTS:  # small limits, so shares decide whether a job fits under them
        if (t, "p") in quotas and draw(st.booleans()):
            quotas[(t, "p")] = Quota(guaranteed=0, limit=draw(st.integers(0, 3)))
    idle = {g: draw(st.sampled_from((0.0, 7200.0))) for g in taken}
    return Snapshot(gpus=gpus, hosts=hosts, leaves=leaves, pods=[Pod(id=0)], running=running, queue=queue,
                    quotas=quotas, now=now, class_rules=RULES, site_links=links, gpu_idle_s=idle,
                    idle_threshold_s=3600)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots())
def test_policies_keep_the_invariants(snap):
    result = plan(snap)
    jobs = {j.id: j for j in snap.queue}
    gpu = {g.id: g for g in snap.gpus}
    site_of = {h.id: h.site for h in snap.hosts}
    running = {r.job_id: r for r in snap.running}
    busy = {i for r in snap.running for i in r.gpu_ids}
    free = {g.id for g in snap.gpus if g.free and g.id not in busy}

    given_out, victims_used = set(), set()
    used = {}
    for r in snap.running:
        used[(r.tenant, r.pool)] = used.get((r.tenant, r.pool), 0) + (r.share or len(r.gpu_ids))
    placed_for = set()
    milli = {g.id: g.used_milli for g in snap.gpus if g.used_milli}  # sharing: per GPU
    slices = {}
    for d in result.placed:
        job = jobs[d.job_id]
        if d.shares:
            ((gid, m, _, mig),) = d.shares
            assert gid in free or gid in milli, "a share on a GPU held whole"
            assert gid not in given_out, "a share beside a whole job"
            milli[gid] = milli.get(gid, 0) + m
            assert milli[gid] <= 1000, f"GPU {gid} over-committed"
            if mig:
                slices[gid] = slices.get(gid, 0) + int(mig[0])
                assert slices[gid] <= 7
            placed_for.add((job.tenant, job.pool))
            share = quota_share(m, job.mig_profile)
            assert 0 < share < 1
            used[(job.tenant, job.pool)] = used.get((job.tenant, job.pool), 0) + share
            continue
        ids = set(d.gpu_ids)
        assert len(ids) == len(d.gpu_ids) and not ids & given_out, "a GPU given twice"
        assert not ids & set(milli), "a whole job on a shared GPU"
        given_out |= ids
        placed_for.add((job.tenant, job.pool))
        used[(job.tenant, job.pool)] = used.get((job.tenant, job.pool), 0) + len(ids)
        if d.kind == PREEMPTION:
            assert d.victims and not set(d.victims) & victims_used, "a victim given to two jobs"
            victims_used |= set(d.victims)
            victim_gpus = set()
            for v in d.victims:
                r = running[v]
                assert r.preemptible and r.borrowed and r.start is not None and r.pool == job.pool
                assert RULES[r.task_class].preemptible
                assert r.priority < job.priority or r.tenant != job.tenant
                victim_gpus |= set(r.gpu_ids)
                used[(r.tenant, r.pool)] -= len(r.gpu_ids)
            assert ids <= free | victim_gpus and ids & victim_gpus
        else:
            assert ids <= free, "a busy GPU given without preemption"
        sites = {site_of[gpu[i].host] for i in ids}
        if d.kind == REMOTE:
            assert job.allow_remote_site and sites == {d.site} and d.site != job.constraints.site
            assert len(ids) == job.gpus  # the whole gang at one site
        elif job.constraints.site is not None:
            assert sites == {job.constraints.site}
        if job.task_class == "science":
            assert all(gpu[i].fp64 == "high" for i in ids)
    for key in placed_for:
        q = snap.quotas.get(key)
        if q is not None and q.limit is not None:
            assert used[key] <= q.limit, f"{key} over its limit"

    targets = [g for m in result.moves for g in m.to_gpus]
    assert len(targets) == len(set(targets)) and not set(targets) & given_out and set(targets) <= free
    for m in result.moves:
        r = running[m.job_id]
        assert r.restartable and m.from_gpus == r.gpu_ids and m.message
    assert len({m.job_id for m in result.moves}) == len(result.moves)
