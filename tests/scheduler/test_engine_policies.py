"""Policies on small fabrics with known answers: preemption, task classes, fabric health,
remote sites and rebalancing (scheduler.engine.policies and the class rules in plan).

Every host has 8 GPUs with ids host*8+index; `busy=[hosts]` marks all GPUs of those hosts taken
(by the `running` list, which must name them)."""
from __future__ import annotations

from scheduler.engine import (PREEMPTION, REMOTE, RESOURCES, ClassRule, Constraints, Gpu, Host, Job, Leaf, Pod,
                              Quota, Running, SiteLink, Snapshot, plan)

G = 8
RULES = {  # the settings defaults (config/settings/base.py SCHEDULER_TASK_CLASSES)
    "training": ClassRule(),
    "inference": ClassRule(prefer_healthy_leaves=True, prefer_lightly_loaded=True, preemptible=False),
    "simulation": ClassRule(prefer_healthy_leaves=True, prefer_lightly_loaded=True, preemptible=False),
    "science": ClassRule(requires_fp64="high"),
    "rendering": ClassRule(leftovers_only=True),
}


def build(pods, running=(), queue=(), quotas=None, now=1000.0, penalty=None, sites=None, fp64=None, links=None,
          idle=None, rules=RULES, pool="p"):
    """pods: [[hosts under leaf 0, hosts under leaf 1, ...], ...]. A GPU is free unless a
    running entry holds it."""
    penalty, sites, fp64 = penalty or {}, sites or {}, fp64 or {}
    held = {g for r in running for g in r.gpu_ids}
    gpus, hosts, leaves = [], [], []
    h = 0
    for p, pod in enumerate(pods):
        for count in pod:
            leaf = len(leaves)
            leaves.append(Leaf(id=leaf, name=f"L{leaf}", pod=p, health_penalty=penalty.get(leaf, 0.0)))
            for _ in range(count):
                hosts.append(Host(id=h, name=f"h{h}", leaves=(leaf,), pool=pool, site=sites.get(h, "")))
                for i in range(G):
                    gid = h * G + i
                    gpus.append(Gpu(id=gid, host=h, index=i, model="H100", memory_mib=81559,
                                    fp64=fp64.get(h, "high"), free=gid not in held))
                h += 1
    return Snapshot(gpus=gpus, hosts=hosts, leaves=leaves, pods=[Pod(id=p) for p in range(len(pods))],
                    running=list(running), queue=list(queue), quotas=quotas or {}, now=now, class_rules=rules,
                    site_links=links or {}, gpu_idle_s=idle or {}, idle_threshold_s=3600)


def on(*hosts):
    return tuple(g for h in hosts for g in range(h * G, h * G + G))


def victim(job_id, hosts, priority=0, start=0.0, tenant="other", **kw):
    kw.setdefault("preemptible", True)
    kw.setdefault("borrowed", True)
    return Running(job_id=job_id, gpu_ids=on(*hosts), tenant=tenant, pool="p", priority=priority, start=start,
                   placement=job_id * 10, **kw)


def job(id, gpus, **kw):
    kw.setdefault("tenant", "t")
    kw.setdefault("pool", "p")
    return Job(id=id, gpus=gpus, **kw)


def decision(snapshot, job_id=1):
    return plan(snapshot).by_job()[job_id]


# -- preemption ------------------------------------------------------------------------------------

def test_preemption_chooses_victims_for_the_fewest_leaves_not_just_the_youngest():
    # Leaf 0: h0 h1, leaf 1: h2 h3. All busy; h1 is not preemptible. The youngest victim is on h0,
    # but h0 + one more host would span two leaves: the job takes h2 + h3 (one leaf).
    running = [victim(100, [0], start=900), Running(job_id=103, gpu_ids=on(1), tenant="other", pool="p"),
               victim(101, [2], start=100), victim(102, [3], start=200)]
    d = decision(build([[2, 2]], running=running, queue=[job(1, 16, priority=5)]))
    assert d.placed and d.kind == PREEMPTION
    assert set(d.victims) == {101, 102}
    assert d.cost.leaves == 1 and sorted(d.gpu_ids) == list(on(2, 3))
    assert d.gains["gpus_freed"] == 16 and {v["job"] for v in d.gains["victims"]} == {101, 102}
    assert "Preempts job" in d.message and "priority 5 is above" in d.message


def test_preemption_takes_the_lowest_priority_then_the_youngest():
    running = [victim(100, [0], priority=1, start=10), victim(101, [1], priority=0, start=10),
               victim(102, [2], priority=0, start=50)]
    d = decision(build([[3]], running=running, queue=[job(1, 8, priority=5)]))
    assert d.kind == PREEMPTION and d.victims == (102,)  # priority 0, and younger than 101


def test_no_preemption_of_work_that_is_not_preemptible_borrowed_or_of_a_protected_class():
    running = [victim(100, [0], preemptible=False), victim(101, [1], borrowed=False),
               victim(102, [2], task_class="inference")]
    d = decision(build([[3]], running=running, queue=[job(1, 8, priority=5)]))
    assert not d.placed and d.reason == RESOURCES and d.kind == "place"


def test_no_preemption_for_equal_priority_unless_the_tenant_is_within_its_guarantee():
    running = [victim(100, [0], priority=0)]
    assert not decision(build([[1]], running=running, queue=[job(1, 8)])).placed
    quotas = {("t", "p"): Quota(guaranteed=8), ("other", "p"): Quota(guaranteed=0)}
    d = decision(build([[1]], running=running, queue=[job(1, 8)], quotas=quotas))
    assert d.kind == PREEMPTION and d.victims == (100,) and "within its guarantee" in d.message


def test_a_victim_is_given_to_one_job_only():
    running = [victim(100, [0])]
    result = plan(build([[1]], running=running, queue=[job(1, 8, priority=5), job(2, 8, priority=4)]))
    by = result.by_job()
    assert by[1].kind == PREEMPTION and not by[2].placed


# -- task classes and fabric health ---------------------------------------------------------------------

def test_science_gets_fp64_high_gpus():
    d = decision(build([[2]], fp64={0: "low", 1: "high"}, queue=[job(1, 4, task_class="science")]))
    assert d.placed and {g // G for g in d.gpu_ids} == {1}
    d = decision(build([[2]], fp64={0: "low", 1: "high"}, queue=[job(1, 4)]))
    assert {g // G for g in d.gpu_ids} == {0}  # training takes the first tight host


def test_inference_avoids_a_degraded_leaf_that_training_would_take():
    # h0 (leaf 0, uplinks half degraded) has 4 GPUs free: the tightest fit for a 4-GPU job.
    running = [Running(job_id=100, gpu_ids=on(0)[:4], tenant="x", pool="p")]
    snap = dict(running=running, penalty={0: 0.5})
    assert {g // G for g in decision(build([[1], [1]], queue=[job(1, 4)], **snap)).gpu_ids} == {0}
    d = decision(build([[1], [1]], queue=[job(1, 4, task_class="inference")], **snap))
    assert {g // G for g in d.gpu_ids} == {1} and "latency-sensitive" in d.message


def test_multi_leaf_jobs_prefer_leaves_with_healthy_uplinks():
    # Three leaves of two hosts; a 16-GPU job fits any one of them: the degraded ones score down.
    d = decision(build([[2, 2, 2]], penalty={0: 0.5, 2: 0.25}, queue=[job(1, 16)]))
    assert d.cost.leaves == 1 and d.cost.health_penalty == 0 and d.leaves == (1,)
    d = decision(build([[2, 2]], penalty={0: 0.5, 1: 0.25}, queue=[job(1, 32)]))
    assert d.cost.leaves == 2 and d.cost.health_penalty == 0.5  # no healthier room: still placed


def test_rendering_takes_what_is_left_even_with_a_higher_priority():
    result = plan(build([[1]], queue=[job(1, 8, task_class="rendering", priority=10), job(2, 8)]))
    by = result.by_job()
    assert by[2].placed and not by[1].placed
    assert result.reservation is None or result.reservation.job_id != 1


# -- sites ----------------------------------------------------------------------------------------------

SITES = {0: "home", 1: "far", 2: "near"}
LINKS = {frozenset(("home", "far")): SiteLink(latency_ms=40, bandwidth_gbps=100),
         frozenset(("home", "near")): SiteLink(latency_ms=2, bandwidth_gbps=400)}


def remote_job(**kw):
    return job(1, 8, constraints=Constraints(site="home"), allow_remote_site=True, remote_after_s=300,
               submit_time=0, **kw)


def test_a_job_that_waited_at_home_is_proposed_at_the_nearest_site_with_room():
    running = [Running(job_id=100, gpu_ids=on(0), tenant="x", pool="p")]
    d = decision(build([[3]], running=running, sites=SITES, links=LINKS, queue=[remote_job()], now=1000))
    assert d.placed and d.kind == REMOTE and d.site == "near"
    assert {g // G for g in d.gpu_ids} == {2}
    assert d.gains["latency_ms"] == 2 and d.gains["bandwidth_gbps"] == 400 and "2 ms" in d.message


def test_no_remote_proposal_before_its_wait_or_without_permission():
    running = [Running(job_id=100, gpu_ids=on(0), tenant="x", pool="p")]
    kw = dict(running=running, sites=SITES, links=LINKS)
    assert not decision(build([[3]], queue=[remote_job()], now=100, **kw)).placed
    stay = job(1, 8, constraints=Constraints(site="home"), submit_time=0)
    assert not decision(build([[3]], queue=[stay], now=1000, **kw)).placed


def test_a_gang_is_never_split_across_sites():
    # 16 GPUs: "far" and "near" have one free host each; together they would hold it.
    running = [Running(job_id=100, gpu_ids=on(0), tenant="x", pool="p")]
    big = job(1, 16, constraints=Constraints(site="home"), allow_remote_site=True, submit_time=0)
    d = decision(build([[3]], running=running, sites=SITES, links=LINKS, queue=[big], now=1000))
    assert not d.placed


def test_an_unhealthy_link_is_not_used():
    running = [Running(job_id=100, gpu_ids=on(0), tenant="x", pool="p")]
    links = {**LINKS, frozenset(("home", "near")): SiteLink(latency_ms=2, bandwidth_gbps=400, healthy=False)}
    d = decision(build([[3]], running=running, sites=SITES, links=links, queue=[remote_job()], now=1000))
    assert d.kind == REMOTE and d.site == "far"


# -- rebalancing ----------------------------------------------------------------------------------------

def test_a_restartable_job_on_idle_gpus_is_proposed_for_a_move():
    running = [Running(job_id=100, gpu_ids=on(0), tenant="x", pool="p", start=0, restartable=True, placement=7),
               Running(job_id=101, gpu_ids=on(1), tenant="x", pool="p", start=0, placement=8)]
    idle = {g: 7200.0 for g in on(0) + on(1)}
    result = plan(build([[2]], running=running, idle=idle, queue=[job(1, 8)]))
    assert [(m.job_id, m.why, m.placement) for m in result.moves] == [(100, "idle", 7)]
    assert result.moves[0].gains["idle_gpus"] == 8 and "idle for 2 h 00 min" in result.moves[0].message
    busy = {g: 60.0 for g in on(0)}
    assert plan(build([[2]], running=running, idle=busy)).moves == []


def test_small_restartable_jobs_fragmenting_a_host_are_moved_to_free_it_for_a_blocked_job():
    # h0: two 2-GPU restartable jobs (4 free); h1: a 4-GPU job that stays (4 free). An 8-GPU job waits.
    running = [Running(job_id=100, gpu_ids=on(0)[:2], tenant="x", pool="p", start=0, restartable=True),
               Running(job_id=101, gpu_ids=on(0)[2:4], tenant="x", pool="p", start=0, restartable=True),
               Running(job_id=102, gpu_ids=on(1)[:4], tenant="x", pool="p", start=0)]
    result = plan(build([[2]], running=running, queue=[job(1, 8)]))
    assert not result.by_job()[1].placed
    moves = result.moves
    assert sorted(m.job_id for m in moves) == [100, 101] and {m.why for m in moves} == {"fragmentation"}
    assert all(m.gains["host_freed"] == "h0" and m.gains["for_job"] == 1 for m in moves)
    targets = [g for m in moves for g in m.to_gpus]
    assert len(set(targets)) == 4 and {g // G for g in targets} == {1}
