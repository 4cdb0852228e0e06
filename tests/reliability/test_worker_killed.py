"""A Celery worker killed with SIGKILL in the middle of an allocation cycle, of a poll round
and of a dispatch: no GPU in two active placements, no half-written cycle or round visible,
no job lost or stuck - each job ends in a defined state within two cycles once a worker runs
again. The fault points are core.faults.pause_point calls inside the transactions."""
import re
import time

import pytest

from bench.stack import dump, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.reliability]


def finished_cycles(stack, after_id=0):
    return [r[0] for r in stack.sql(
        "SELECT id FROM scheduler_allocationcycle WHERE finished_at IS NOT NULL AND error = '' AND id > %s ORDER BY id",
        (after_id,))]


def test_killed_mid_cycle_nothing_half_written_and_the_jobs_placed_within_two_cycles(stack):
    stack.submit(4, gpus=8)
    stack.start_worker(fault="cycle.persist")
    stack.start_beat()
    wait_for(lambda: stack.fault_reached("cycle.persist"), 90, "a cycle reaching its persist step")
    # The cycle has written its AllocationCycle row and its placements, uncommitted.
    stack.kill("worker")
    assert stack.violations() == [], dump(stack)
    assert stack.sql("SELECT count(*) FROM scheduler_placement")[0][0] == 0, "a killed cycle's placements are visible"
    assert stack.job_states() == {"pending": 4}
    last_before = max(finished_cycles(stack) or [0])

    stack.start_worker()
    wait_for(lambda: stack.job_states().get("pending", 0) == 0, 90, "the four jobs placed after the restart")
    cycles_used = sorted({r[0] for r in stack.sql("SELECT DISTINCT cycle_id FROM scheduler_placement")})
    after = finished_cycles(stack, last_before)
    assert cycles_used and set(cycles_used) <= set(after[:2]), (cycles_used, after, dump(stack))
    assert stack.violations() == [], dump(stack)


def test_pool_process_killed_mid_cycle_its_message_is_delivered_again(stack):
    """No beat here: only the message itself comes back (acks_late and reject_on_worker_lost:
    the main process puts it back when its pool process dies). The redelivered cycle may find
    the dead one's lock still held and skip; the lock expires by itself (CYCLE_LOCK_TTL) and
    the next cycle places the jobs."""
    stack.submit(3, gpus=8)
    stack.start_worker(fault="cycle.persist")
    stack.send_task("scheduler.tasks.allocation_cycle")
    wait_for(lambda: stack.fault_reached("cycle.persist"), 90, "the cycle reaching its persist step")
    task_id = re.search(r"Task scheduler\.tasks\.allocation_cycle\[([0-9a-f-]+)\] received",
                        stack.log_of("worker")).group(1)
    stack.clear_fault("cycle.persist")
    stack.kill_worker_child()  # the OOM killer's way: the main process survives
    wait_for(lambda: stack.log_of("worker").count(f"allocation_cycle[{task_id}] received") >= 2
             or stack.fault_reached("cycle.persist"), 60, "the same cycle message delivered again")
    assert stack.sql("SELECT count(*) FROM scheduler_placement")[0][0] == 0
    # Now let it through: a clean worker, and beat for the cycles that follow.
    stack.kill("worker")
    stack.start_worker()
    stack.start_beat()
    wait_for(lambda: stack.job_states().get("pending", 0) == 0, 90, "the three jobs placed")
    placements = stack.sql("SELECT job_id, count(*) FROM scheduler_placement GROUP BY job_id")
    assert len(placements) == 3 and all(count == 1 for _, count in placements), placements
    assert stack.violations() == [], dump(stack)


def test_killed_mid_poll_round_no_partial_samples_and_the_next_round_succeeds(stack):
    stack.start_worker(fault="poll.ingest")
    stack.start_beat()
    wait_for(lambda: stack.fault_reached("poll.ingest"), 90, "a poll chunk reaching its ingest")
    samples_before = stack.sql("SELECT count(*) FROM pool_gpusample")[0][0]
    stack.kill("worker")
    assert stack.sql("SELECT count(*) FROM pool_gpusample")[0][0] == samples_before
    killed_round = stack.sql("SELECT max(id) FROM pool_pollround")[0][0]
    assert stack.sql("SELECT finished_at FROM pool_pollround WHERE id = %s", (killed_round,))[0][0] is None

    restarted = time.time()
    stack.start_worker()
    wait_for(lambda: stack.sql("SELECT count(*) FROM pool_pollround WHERE id > %s AND finished_at IS NOT NULL "
                               "AND hosts_ok = hosts", (killed_round,))[0][0], 60,
             "a complete poll round after the restart")
    assert time.time() - restarted < 60
    hosts, up = stack.sql("SELECT count(*), count(*) FILTER (WHERE state = 'up') FROM pool_host")[0]
    assert up == hosts, f"{hosts - up} hosts not up after the restart"
    assert stack.sql("SELECT count(*) FROM pool_gpusample")[0][0] > samples_before
    assert stack.violations() == [], dump(stack)


def test_killed_mid_dispatch_the_job_starts_once(stack):
    stack.submit(1, gpus=16)
    stack.start_worker(fault="dispatch.sent")
    stack.start_beat()
    wait_for(lambda: stack.fault_reached("dispatch.sent"), 90, "a dispatch that reached its agents")
    stack.kill("worker")  # the agents have the work; the database does not know they took it
    placement_id, hosts = stack.sql(
        "SELECT p.id, array_agg(DISTINCT h.name) FROM scheduler_placement p "
        "JOIN scheduler_placementgpu pg ON pg.placement_id = p.id JOIN pool_gpu g ON g.id = pg.gpu_id "
        "JOIN pool_host h ON h.id = g.host_id WHERE p.state = 'dispatching' GROUP BY p.id")[0]

    stack.start_worker()
    wait_for(lambda: stack.job_states() == {"running": 1}, 90, "the job running after the restart")
    for host in hosts:
        report = stack.agent_report(host)
        ids = [a["id"] for a in report["allocations"]]
        assert ids.count(f"p{placement_id}") == 1, (host, ids)
    assert stack.sql("SELECT count(*) FROM scheduler_placement")[0][0] == 1
    assert stack.violations() == [], dump(stack)
