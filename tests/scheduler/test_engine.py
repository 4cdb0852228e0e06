"""The placement engine on small fabrics where the right answer is known by hand.

Fabrics are drawn as pods of leaves of hosts; every host has 8 GPUs with ids host*8+index
(host h3 has GPUs 24..31), and `free={host: n}` marks all but the last n GPUs of a host busy.
"""
from __future__ import annotations

import itertools
import subprocess
import sys

import pytest

from scheduler.engine import (CONSTRAINTS, PRIORITY, QUOTA, REASONS, RESERVED, RESOURCES, TOPOLOGY_WAIT,
                              UNHEALTHY_HOSTS, Constraints, Cost, Gpu, Host, Job, Leaf, Pod, Quota, Running,
                              Snapshot, SnapshotError, TopologyRequirement, plan, queue_order, validate_and_cost)

G = 8


def build(pods, free=None, running=(), queue=(), quotas=None, now=0.0, penalty=None, unhealthy_hosts=(),
          unhealthy_gpus=(), model="NVIDIA H100 80GB HBM3", models=None, pool="p"):
    """pods: [[hosts under leaf 0, hosts under leaf 1, ...], [...]] -> Snapshot."""
    free = free or {}
    penalty = penalty or {}
    models = models or {}
    gpus, hosts, leaves = [], [], []
    h = 0
    for p, pod in enumerate(pods):
        for count in pod:
            leaf = len(leaves)
            leaves.append(Leaf(id=leaf, name=f"L{leaf}", pod=p, health_penalty=penalty.get(leaf, 0.0)))
            for _ in range(count):
                hosts.append(Host(id=h, name=f"h{h}", leaves=(leaf,), pool=pool, healthy=h not in unhealthy_hosts))
                n_free = free.get(h, G)
                for i in range(G):
                    gid = h * G + i
                    gpus.append(Gpu(id=gid, host=h, index=i, model=models.get(h, model), memory_mib=81559,
                                    fp64="high", free=i >= G - n_free, healthy=gid not in unhealthy_gpus))
                h += 1
    return Snapshot(gpus=gpus, hosts=hosts, leaves=leaves, pods=[Pod(id=p, name=f"P{p}") for p in range(len(pods))],
                    running=list(running), queue=list(queue), quotas=quotas or {}, now=now)


def job(id, gpus, **kw):
    kw.setdefault("tenant", "t")
    kw.setdefault("pool", "p")
    return Job(id=id, gpus=gpus, **kw)


def hosts_of(decision):
    return sorted({g // G for g in decision.gpu_ids})


def leaves_of(decision):
    return sorted(decision.leaves)


def one(snapshot):
    result = plan(snapshot)
    assert len(result.decisions) == 1
    return result.decisions[0]


# -- hosts -----------------------------------------------------------------------------------

def test_a_job_that_fits_one_host_gets_one_host():
    d = one(build([[2, 2]], queue=[job(1, 6)]))
    assert d.placed and len(d.gpu_ids) == 6 and len(hosts_of(d)) == 1
    assert d.cost == Cost(hosts=1, leaves=1, pod_crossings=0, health_penalty=0.0, fragmentation_left=2)
    assert d.leaves_lower_bound == 1


def test_a_job_that_fits_one_host_waits_rather_than_spread_over_hosts():
    # 4 + 4 + 3 free GPUs, but no host has 5: a 5-GPU job waits for one host.
    d = one(build([[3]], free={0: 4, 1: 4, 2: 3}, queue=[job(1, 5)]))
    assert not d.placed and d.reason == RESOURCES
    assert "one host" in d.message and "the most free on any matching host is 4" in d.message


def test_tightest_host_wins_so_whole_hosts_stay_whole():
    # h0 8 free, h1 5 free, h2 3 free, h3 2 free.
    snap = build([[4]], free={1: 5, 2: 3, 3: 2}, queue=[job(1, 3)])
    assert hosts_of(one(snap)) == [2]  # exact fit
    snap = build([[4]], free={1: 5, 2: 3, 3: 2}, queue=[job(1, 4)])
    assert hosts_of(one(snap)) == [1]  # the 5-free host, not the whole one
    snap = build([[4]], free={1: 5, 2: 3, 3: 2}, queue=[job(1, 1)])
    d = one(snap)
    assert hosts_of(d) == [3] and d.cost.fragmentation_left == 1
    assert "tightest host" in d.message


def test_single_host_jobs_pack_into_the_fuller_leaf():
    # Both leaves have a host with 4 free; L1 is otherwise full, L0 has a whole free host.
    snap = build([[2, 2]], free={0: 4, 2: 4, 3: 0}, queue=[job(1, 4)])
    assert hosts_of(one(snap)) == [2]


# -- leaves and pods ---------------------------------------------------------------------------

def test_a_multi_host_job_takes_whole_hosts_in_the_smallest_leaf_that_holds_it():
    # L0: 3 hosts, L1: 2 hosts, L2: 4 hosts, all free. 16 GPUs fit L1 exactly.
    d = one(build([[3, 2, 4]], queue=[job(1, 16)]))
    assert d.placed and leaves_of(d) == [1] and hosts_of(d) == [3, 4]
    assert d.cost.hosts == 2 and d.cost.leaves == 1 and d.cost.fragmentation_left == 0


def test_multi_host_jobs_skip_partly_used_hosts_by_default():
    # L0 has 16 free GPUs but on four half-used hosts; L1 has two whole hosts.
    d = one(build([[4, 3]], free={0: 4, 1: 4, 2: 4, 3: 4, 6: 0}, queue=[job(1, 16)]))
    assert leaves_of(d) == [1] and hosts_of(d) == [4, 5]
    loose = one(build([[4, 3]], free={0: 4, 1: 4, 2: 4, 3: 4, 4: 0, 5: 0, 6: 0},
                      queue=[job(1, 16, whole_hosts=False)]))
    assert loose.placed and loose.cost.hosts == 4
    strict = one(build([[4, 3]], free={0: 4, 1: 4, 2: 4, 3: 4, 4: 0, 5: 0, 6: 0}, queue=[job(1, 16)]))
    assert not strict.placed and "wholly free hosts" in strict.message


def test_fewest_leaves_then_least_leftover():
    # L0 3 hosts (24), L1 2 hosts (16), L2 4 hosts (32): 40 GPUs need 2 leaves. L1+L0 hold
    # exactly 40 and leave the 32-GPU leaf whole; L2+L1 or L2+L0 would leave a hole.
    d = one(build([[3, 2, 4]], queue=[job(1, 40)]))
    assert d.cost.leaves == 2 and leaves_of(d) == [0, 1]
    assert d.leaves_lower_bound == 2 and d.cost.fragmentation_left == 0
    assert "2 leaf switches" in d.message and "lower bound 2" in d.message
    # 32 GPUs: one leaf (L2), although L0 + L1 would also be "tight".
    assert leaves_of(one(build([[3, 2, 4]], queue=[job(1, 32)]))) == [2]


def test_stays_inside_one_pod_when_the_same_number_of_leaves_can():
    # Pod 0: leaves of 2 and 1 free hosts; pod 1: leaves of 2 and 2. 32 GPUs need 2 leaves:
    # only pod 1 holds them with 2 leaves, so no pod crossing.
    d = one(build([[2, 2], [2, 2]], free={2: 0}, queue=[job(1, 32)]))
    assert d.cost.leaves == 2 and d.cost.pod_crossings == 0 and leaves_of(d) == [2, 3] and d.pods == (1,)
    # Both pods hold it in 2 leaves: the one it fills exactly (16 + 16), not the 24 + 24 one.
    d = one(build([[2, 2], [3, 3]], queue=[job(1, 32)]))
    assert leaves_of(d) == [0, 1] and d.cost.pod_crossings == 0


def test_fewer_leaves_beat_staying_in_one_pod():
    # Pod 0: four leaves with one free host each (L3's other hosts are busy); pod 1: one leaf
    # with two free hosts. 32 GPUs: 4 leaves inside pod 0, or 3 leaves (L4 + two of pod 0).
    d = one(build([[1, 1, 1, 3], [2]], free={3: 0, 4: 0}, queue=[job(1, 32)]))
    assert d.cost.leaves == 3 and d.cost.pod_crossings == 1 and 4 in d.leaves


def test_a_job_bigger_than_a_pod_crosses_pods_with_fewest_leaves():
    d = one(build([[2, 2], [2, 2]], queue=[job(1, 48)]))
    assert d.cost.leaves == 3 and d.cost.pod_crossings == 1


# -- health ------------------------------------------------------------------------------------

def test_degraded_leaf_avoided_when_a_healthy_one_is_as_good():
    d = one(build([[2, 2]], penalty={0: 0.5}, queue=[job(1, 16)]))
    assert leaves_of(d) == [1] and d.cost.health_penalty == 0
    d = one(build([[2, 2, 2]], penalty={1: 0.3}, queue=[job(1, 32)]))
    assert leaves_of(d) == [0, 2]
    # No healthy choice with as few leaves: the degraded leaf is used and the cost says so.
    d = one(build([[2, 2]], penalty={0: 0.3}, queue=[job(1, 32)]))
    assert d.cost.leaves == 2 and d.cost.health_penalty == 0.3 and "health penalty" in d.message


def test_single_host_jobs_also_prefer_healthy_leaves_when_equally_tight():
    d = one(build([[1, 1]], penalty={0: 0.2}, queue=[job(1, 2)]))
    assert hosts_of(d) == [1]


def test_leaf_cut_off_from_spines_only_takes_jobs_that_fit_inside_it():
    # L0 (16 GPUs) has no working uplink; L1 and L2 have 8 each.
    d = one(build([[2, 1, 1]], penalty={0: 1.0}, queue=[job(1, 24)]))
    assert not d.placed and d.reason == UNHEALTHY_HOSTS
    assert one(build([[2, 1, 1]], penalty={0: 1.0}, queue=[job(1, 16)])).leaves == (0,)


def test_unhealthy_hosts_and_gpus_are_never_used():
    snap = build([[2]], unhealthy_hosts={0}, unhealthy_gpus={8}, queue=[job(1, 7), job(2, 1)])
    a, b = plan(snap).decisions
    assert a.placed and hosts_of(a) == [1] and 8 not in a.gpu_ids
    assert not b.placed  # the one left (GPU 8... is unhealthy, h0 is unhealthy)
    d = one(build([[2]], unhealthy_hosts={0}, queue=[job(1, 16)]))
    assert d.reason == UNHEALTHY_HOSTS and "healthy" in d.message


# -- gang, topology ----------------------------------------------------------------------------

def test_gang_jobs_are_all_or_nothing_and_non_gang_jobs_start_partly():
    snap = build([[2]], free={0: 3, 1: 2}, queue=[job(1, 4)])
    d = one(snap)
    assert not d.placed and d.gpu_ids == ()
    snap = build([[2]], free={0: 3, 1: 2}, queue=[job(1, 8, gang=False, whole_hosts=False)])
    d = one(snap)
    assert d.placed and d.partial and len(d.gpu_ids) == 5 and "5 of its 8" in d.message


def test_hard_topology_limit_waits_with_the_reason():
    # Two leaves of three hosts, one busy in each: 24 GPUs need 2 leaves now; the job allows 1.
    topo = TopologyRequirement(max_leaves=1, hard=True)
    d = one(build([[3, 3]], free={0: 0, 3: 0}, queue=[job(1, 24, topology=topo)]))
    assert not d.placed and d.reason == TOPOLOGY_WAIT
    assert "topology: needs ≤ 1 leaves, best now 2" in d.message
    # It can never fit one leaf: that is a constraint, not a wait.
    d = one(build([[2, 2]], queue=[job(1, 32, topology=topo)]))
    assert d.reason == CONSTRAINTS and "topology" in d.message


def test_soft_topology_limit_is_dropped_after_its_wait():
    topo = TopologyRequirement(max_leaves=1, hard=False, max_wait_s=600)
    waiting = one(build([[2, 2]], free={1: 0, 3: 0}, now=500, queue=[job(1, 16, topology=topo, submit_time=0)]))
    assert waiting.reason == TOPOLOGY_WAIT and "dropped in 1 min" in waiting.message
    assert waiting.expected_start == 600
    d = one(build([[2, 2]], free={1: 0, 3: 0}, now=700, queue=[job(1, 16, topology=topo, submit_time=0)]))
    assert d.placed and d.cost.leaves == 2 and "soft limit" in d.message


# -- quotas ------------------------------------------------------------------------------------

def test_quota_limit_blocks_and_guarantee_is_not_borrowed():
    quotas = {("a", "p"): Quota(guaranteed=8, limit=16)}
    over = one(build([[4]], queue=[job(1, 24, tenant="a")], quotas=quotas))
    assert over.reason == QUOTA and "limit of 16" in over.message
    within = one(build([[4]], queue=[job(1, 8, tenant="a")], quotas=quotas))
    assert within.placed and not within.borrowed


def test_borrowing_idle_gpus_is_marked_reclaimable():
    quotas = {("a", "p"): Quota(guaranteed=8, limit=32), ("b", "p"): Quota(guaranteed=8, limit=32)}
    d = one(build([[4]], queue=[job(1, 16, tenant="a")], quotas=quotas))
    assert d.placed and d.borrowed and d.borrowed_gpus == 8 and "reclaimed" in d.message


def test_borrowing_stops_where_another_tenants_guarantee_is_needed():
    # 16 GPUs; b is guaranteed 8 and has an 8-GPU job waiting (behind a in the queue).
    quotas = {("a", "p"): Quota(guaranteed=8, limit=16), ("b", "p"): Quota(guaranteed=8, limit=16)}
    snap = build([[2]], quotas=quotas, queue=[job(1, 16, tenant="a", priority=5), job(2, 8, tenant="b")])
    a, b = plan(snap).decisions
    assert not a.placed and a.reason == QUOTA and "other tenants' guarantees" in a.message
    assert b.placed and not b.borrowed


def test_tenants_without_quota_borrow_only_in_pools_with_guarantees():
    plain = one(build([[1]], queue=[job(1, 4)]))
    assert plain.placed and not plain.borrowed
    d = one(build([[1]], queue=[job(1, 4, tenant="x")], quotas={("a", "p"): Quota(guaranteed=4)}))
    assert d.placed and d.borrowed


# -- backfill ----------------------------------------------------------------------------------

def backfill_snapshot(queue):
    # h0 busy until t=100; h1 has 4 GPUs busy until t=50 and 4 free.
    running = [Running(job_id="r0", gpu_ids=tuple(range(0, 8)), tenant="t", pool="p", expected_end=100),
               Running(job_id="r1", gpu_ids=tuple(range(8, 12)), tenant="t", pool="p", expected_end=50)]
    return build([[2]], running=running, queue=queue, now=0)


def test_backfill_reserves_for_the_head_job_and_lets_short_jobs_run():
    snap = backfill_snapshot([job("big", 16, priority=10), job("long", 4, estimated_runtime=500, submit_time=1),
                              job("unknown", 4, submit_time=2), job("short", 4, estimated_runtime=30, submit_time=3)])
    result = plan(snap)
    d = result.by_job()
    assert result.reservation.job_id == "big" and result.reservation.start == 100
    assert sorted(result.reservation.gpu_ids) == list(range(16))
    assert not d["big"].placed and d["big"].expected_start == 100 and "Expected to start in 1 min" in d["big"].message
    assert d["short"].placed and set(d["short"].gpu_ids) <= set(range(12, 16))
    assert d["long"].reason == RESERVED and "past that" in d["long"].message
    assert d["unknown"].reason == RESERVED and "no estimated run time" in d["unknown"].message


def test_backfill_lets_jobs_use_gpus_the_reservation_does_not_need():
    # h0 and h1 busy until 100 and 200; h2 free. The 16-GPU job needs two whole hosts: at
    # t=100 (h0 + h2). A long 8-GPU job may not take h2... but a 4-GPU job on h3 (free) may.
    running = [Running("r0", tuple(range(0, 8)), "t", "p", 100), Running("r1", tuple(range(8, 16)), "t", "p", 200),
               Running("r3", tuple(range(24, 28)), "t", "p", None)]
    snap = build([[4]], running=running, queue=[job("big", 16, priority=1), job("x", 4, estimated_runtime=9999),
                                                   job("y", 8, estimated_runtime=9999)])
    result = plan(snap)
    d = result.by_job()
    assert d["big"].expected_start == 100 and set(result.reservation.gpu_ids) == set(range(0, 8)) | set(range(16, 24))
    assert d["x"].placed and hosts_of(d["x"]) == [3]
    assert d["y"].reason == RESERVED


def test_no_reservation_when_nothing_is_known_to_end():
    running = [Running("r0", tuple(range(0, 8)), "t", "p", None)]
    result = plan(build([[1]], running=running, queue=[job("big", 8)]))
    assert result.reservation is None
    d = result.decisions[0]
    assert d.reason == RESOURCES and d.expected_start is None


# -- order and reasons -------------------------------------------------------------------------

def test_queue_order_priority_then_fair_share_then_age_then_id():
    quotas = {("light", "p"): Quota(guaranteed=8, usage=10), ("heavy", "p"): Quota(guaranteed=8, usage=100)}
    jobs = [job("old-heavy", 8, tenant="heavy", submit_time=0), job("new-light", 8, tenant="light", submit_time=50),
            job("old-light", 8, tenant="light", submit_time=10), job("urgent", 8, tenant="heavy", priority=5,
                                                                     submit_time=90),
            job("b", 8, tenant="nobody", submit_time=5), job("a", 8, tenant="nobody", submit_time=5)]
    snap = build([[1]], queue=jobs, quotas=quotas)
    assert [j.id for j in queue_order(snap)] == ["urgent", "old-light", "new-light", "old-heavy", "a", "b"]
    result = plan(snap)
    assert [d.job_id for d in result.decisions][0] == "urgent"
    assert result.decisions[0].placed and not any(d.placed for d in result.decisions[1:])
    assert [d.rank for d in result.decisions] == list(range(6))


def test_every_job_gets_a_decision_and_a_sentence():
    snap = build([[2]], free={1: 0}, queue=[
        job("fits", 4), job("too-big", 64), job("model", 1, constraints=Constraints(models=frozenset({"B200"}))),
        job("later", 8), job("bad", 0)])
    d = plan(snap).by_job()
    assert d["fits"].placed and d["fits"].message.startswith("Placed on h0")
    assert d["too-big"].reason == CONSTRAINTS and "only 16 GPUs" in d["too-big"].message
    assert d["model"].reason == CONSTRAINTS and "B200" in d["model"].message
    assert d["later"].reason == PRIORITY and "ahead of it" in d["later"].message
    assert d["bad"].reason == CONSTRAINTS and "at least 1" in d["bad"].message
    assert all(x.message and (x.placed or x.reason in REASONS) for x in d.values())


def test_model_memory_fp64_site_constraints():
    snap = build([[2]], models={0: "Tesla T4"}, queue=[
        job("h100", 8, constraints=Constraints(models=frozenset({"H100"}))),
        job("t4", 8, constraints=Constraints(models=frozenset({"T4"}))),
        job("h20", 1, constraints=Constraints(models=frozenset({"H20"}))),
        job("mem", 1, constraints=Constraints(min_memory_mib=100_000)),
        job("site", 1, constraints=Constraints(site="elsewhere"))])
    d = plan(snap).by_job()
    assert hosts_of(d["h100"]) == [1] and hosts_of(d["t4"]) == [0]
    assert d["h20"].reason == d["mem"].reason == d["site"].reason == CONSTRAINTS


def test_inconsistent_snapshot_is_refused_with_what_is_wrong():
    snap = build([[1]])
    snap.gpus = list(snap.gpus) + [Gpu(id=999, host="nowhere")]
    with pytest.raises(SnapshotError, match="unknown host 'nowhere'"):
        plan(snap)
    snap = build([[1]], running=[Running("a", (0, 1)), Running("b", (1,))])
    with pytest.raises(SnapshotError, match="GPU 1 is held by both"):
        plan(snap)
    snap = build([[1]])
    snap.hosts = [Host(id=0, name="h0", leaves=("L9",), pool="p")]
    with pytest.raises(SnapshotError, match="unknown leaf 'L9'"):
        plan(snap)


def test_rail_optimized_hosts_count_their_rail_group_as_one_leaf():
    # Four hosts, each cabled to both rail leaves R0 and R1 of one group: one placement leaf.
    leaves = [Leaf(id=f"R{i}", name=f"R{i}", pod=0) for i in range(4)]
    hosts = [Host(id=h, name=f"h{h}", leaves=("R0", "R1") if h < 2 else ("R2", "R3"), pool="p") for h in range(4)]
    gpus = [Gpu(id=h * 8 + i, host=h, index=i) for h in range(4) for i in range(8)]
    d = one(Snapshot(gpus=gpus, hosts=hosts, leaves=leaves, queue=[job(1, 16)]))
    assert d.cost.leaves == 1 and set(d.leaves) in ({"R0", "R1"}, {"R2", "R3"})


# -- validate_and_cost -------------------------------------------------------------------------

def test_validate_and_cost_of_a_chosen_set():
    running = [Running("other", tuple(range(16, 24)), "t", "p", None), Running("me", (0, 1, 2, 3), "t", "p", None)]
    snap = build([[2, 2]], running=running, unhealthy_gpus={31})
    me = job("me", 16)
    cost = validate_and_cost(me, list(range(0, 8)) + list(range(24, 32)), snap)
    assert isinstance(cost, list) and any("unhealthy" in p for p in cost)
    cost = validate_and_cost(me, list(range(0, 16)), snap)  # its own proposal's GPUs may be reused
    assert cost == Cost(hosts=2, leaves=1, pod_crossings=0, health_penalty=0.0, fragmentation_left=0)
    spread = validate_and_cost(me, list(range(0, 8)) + list(range(24, 30)) + [8, 9], snap)
    assert spread == Cost(hosts=3, leaves=2, pod_crossings=0, health_penalty=0.0, fragmentation_left=6 + 1)
    problems = validate_and_cost(me, list(range(8, 24)) + [99], snap)
    assert any("in use by job other" in p for p in problems)
    assert any("does not exist" in p for p in problems)
    assert any("exactly 16" in p for p in problems)
    hard = job("me", 16, topology=TopologyRequirement(max_leaves=1))
    assert any("hard limit is 1" in p for p in validate_and_cost(hard, list(range(0, 8)) + list(range(24, 32)), snap))
    t4 = job("me", 8, constraints=Constraints(models=frozenset({"T4"})))
    assert any("not T4" in p for p in validate_and_cost(t4, list(range(0, 8)), snap))


# -- exact optimum on tiny cases ---------------------------------------------------------------

def brute_force_min_leaves(snap, n):
    """The fewest leaves of any set of ceil(n/8) wholly free hosts (None: no such set)."""
    busy = {i for r in snap.running for i in r.gpu_ids}
    free_hosts = [h.id for h in snap.hosts
                  if all(g.free and g.id not in busy for g in snap.gpus if g.host == h.id)]
    leaf = {h.id: h.leaves for h in snap.hosts}
    need = -(-n // G)
    best = None
    for combo in itertools.combinations(free_hosts, need):
        k = len({leaf[h] for h in combo})
        best = k if best is None else min(best, k)
    return best


@pytest.mark.parametrize("seed", range(40))
def test_leaf_count_equals_the_brute_force_optimum(seed):
    import random
    rng = random.Random(seed)
    pods = [[rng.randint(1, 4) for _ in range(rng.randint(1, 3))] for _ in range(rng.randint(1, 2))]
    hosts = sum(map(sum, pods))
    free = {h: rng.choice((0, 8, 8, 3)) for h in range(hosts)}
    n = rng.choice((16, 24, 32, 40))
    snap = build(pods, free=free, queue=[job(1, n)])
    best = brute_force_min_leaves(snap, n)
    d = one(snap)
    if best is None:
        assert not d.placed
    else:
        assert d.placed and d.cost.leaves == best and d.cost.hosts == -(-n // G)


def test_engine_imports_no_django():
    code = "import sys, scheduler.engine; print(any(m.split('.')[0] == 'django' for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_partial_placement_on_a_cut_off_leaf_reports_a_true_lower_bound():
    # Found by the hypothesis test: a non-gang job with a hard 2-leaf limit starts on the
    # cut-off leaf (8 free) plus one other leaf (4 free); its lower bound must count the
    # cut-off leaf too, so it never claims that more leaves than it uses were needed.
    snapshot = build([[1, 1, 1, 1]], free={0: 8, 1: 4, 2: 4, 3: 4}, penalty={0: 1.0},
                     queue=[job(1, 12, gang=False, whole_hosts=False, topology=TopologyRequirement(max_leaves=2))])
    d = one(snapshot)
    assert d.placed
    assert len(d.leaves) <= 2
    assert d.leaves_lower_bound <= d.cost.leaves
    assert "3 could" not in d.message
