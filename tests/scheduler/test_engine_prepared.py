"""The engine with a prepared fabric (plan(..., fabric=prepare(...)), as trace replay uses it)
decides exactly as without one, refuses a fabric built from other hardware, and the
"short_first" queue order puts short jobs first without starving old ones."""
from __future__ import annotations

import random

import pytest

from scheduler.engine import Running, SnapshotError, plan, prepare, queue_order

from .test_engine import G, build, job


def _decisions(result):
    return [(d.job_id, d.placed, d.gpu_ids, d.reason, d.message, d.expected_start) for d in result.decisions]


@pytest.mark.parametrize("seed", range(6))
def test_a_prepared_fabric_gives_the_same_plans_as_a_fresh_one_cycle_after_cycle(seed):
    rng = random.Random(seed)
    base = build([[3, 2], [4]], unhealthy_hosts={rng.randrange(9)}, unhealthy_gpus={rng.randrange(72)},
                 penalty={1: 0.5})
    fabric = prepare(base)
    running, now, n = [], 0.0, 0
    for _ in range(8):
        queue = [job(f"j{n + k}", rng.choice([1, 2, 4, 8, 12, 16, 24]), submit_time=now - rng.randrange(100),
                     estimated_runtime=rng.choice([None, 50.0, 500.0])) for k in range(rng.randrange(1, 7))]
        n += len(queue)
        base.running, base.queue, base.now = list(running), queue, now
        fresh = plan(base)
        reused = plan(base, fabric=fabric)
        assert _decisions(reused) == _decisions(fresh)
        assert reused.reservation == fresh.reservation
        running += [Running(job_id=d.job_id, gpu_ids=d.gpu_ids, tenant="t", pool="p", expected_end=now + 100)
                    for d in fresh.decisions if d.placed]
        running = [r for r in running if r.expected_end > now or rng.random() < 0.5]
        now += 60


def test_a_fabric_prepared_from_other_hardware_is_refused():
    snap = build([[2]], queue=[job("a", 1)])
    fabric = prepare(build([[2]]))  # equal contents, but other sequences
    with pytest.raises(SnapshotError, match="prepare"):
        plan(snap, fabric=fabric)
    fabric = prepare(snap)
    snap.gpus.pop()  # changed in place after preparing
    with pytest.raises(SnapshotError, match="prepare"):
        plan(snap, fabric=fabric)


def test_running_jobs_are_still_checked_with_a_prepared_fabric():
    snap = build([[2]], queue=[job("a", 1)])
    fabric = prepare(snap)
    snap.running = [Running(job_id="x", gpu_ids=(0, 1)), Running(job_id="y", gpu_ids=(1,))]
    with pytest.raises(SnapshotError, match="GPU 1 is held by both job 'x' and job 'y'"):
        plan(snap, fabric=fabric)
    snap.running = [Running(job_id="x", gpu_ids=(0, 999))]
    with pytest.raises(SnapshotError, match="running job 'x' holds unknown GPU 999"):
        plan(snap, fabric=fabric)
    snap.running = [Running(job_id="x", gpu_ids=tuple(range(G)))]
    result = plan(snap, fabric=fabric)
    assert result.decisions[0].placed and all(g >= G for g in result.decisions[0].gpu_ids)


def test_short_first_orders_by_estimated_gpu_seconds_but_old_jobs_keep_their_turn():
    jobs = [job("long-old", 8, submit_time=0, estimated_runtime=10_000.0),
            job("wide-short", 8, submit_time=100, estimated_runtime=100.0),   # 800 GPU-s
            job("narrow-long", 1, submit_time=200, estimated_runtime=1_000.0),  # 1,000 GPU-s
            job("no-estimate", 1, submit_time=50),
            job("urgent", 16, submit_time=300, priority=1, estimated_runtime=50_000.0)]
    snap = build([[1]], queue=jobs, now=1_000.0)
    assert [j.id for j in queue_order(snap)] == ["urgent", "long-old", "no-estimate", "wide-short", "narrow-long"]
    snap.order = "short_first"
    assert [j.id for j in queue_order(snap)] == ["urgent", "wide-short", "narrow-long", "long-old", "no-estimate"]
    # Waited order_max_wait_s or more: ahead of the short ones, oldest first.
    snap.now = snap.order_max_wait_s + 60
    assert [j.id for j in queue_order(snap)] == ["urgent", "long-old", "no-estimate", "wide-short", "narrow-long"]


def test_short_first_lets_the_short_job_take_the_free_host_and_reserves_for_the_long_one():
    jobs = [job("long", 8, submit_time=0, estimated_runtime=10_000.0),
            job("short", 8, submit_time=10, estimated_runtime=100.0)]
    snap = build([[1]], queue=jobs, now=20.0)
    assert plan(snap).by_job()["long"].placed
    snap.order = "short_first"
    result = plan(snap).by_job()
    assert result["short"].placed and not result["long"].placed
    assert result["long"].expected_start == 120.0


def test_an_unknown_order_is_refused_naming_it():
    snap = build([[1]], queue=[job("a", 1)])
    snap.order = "random"
    with pytest.raises(SnapshotError, match="unknown queue order 'random'"):
        plan(snap)
