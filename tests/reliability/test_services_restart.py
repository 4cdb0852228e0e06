"""Redis restarted and PostgreSQL connections cut while everything runs: poll rounds and
cycles resume by themselves within 30 s, and nothing is lost from the database."""
import threading
import time

import pytest

from bench.stack import _admin_connection, dump, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.reliability]


def latest(stack):
    return (stack.sql("SELECT coalesce(max(id), 0) FROM pool_pollround WHERE finished_at IS NOT NULL")[0][0],
            stack.sql("SELECT coalesce(max(id), 0) FROM scheduler_allocationcycle "
                      "WHERE finished_at IS NOT NULL AND error = ''")[0][0])


def resumed(stack, rounds_after, cycles_after):
    # kombu's Redis transport can make a worker exit ("Unrecoverable error") when Redis goes
    # away with messages unacknowledged; like systemd or `make demo`, start it again.
    stack.restart_exited()
    rounds, cycles = latest(stack)
    return rounds > rounds_after and cycles > cycles_after


def test_redis_restart_rounds_and_cycles_resume_within_30s_and_nothing_is_lost(stack):
    stack.start_worker(concurrency=2)
    stack.start_beat()
    stack.submit(3, gpus=8, name="before")
    wait_for(lambda: stack.job_states().get("pending", 0) == 0 and all(latest(stack)), 90, "the stack running")
    jobs_before = stack.sql("SELECT id, state FROM scheduler_job ORDER BY id")

    stack.kill("redis")  # SIGKILL, no persistence: every broker message, lock and live key is gone
    time.sleep(3)
    stack.submit(2, gpus=8, name="during")  # accepted while Redis is away: the database is the record
    rounds_at, cycles_at = latest(stack)
    stack.start_redis()
    back = time.monotonic()
    wait_for(lambda: resumed(stack, rounds_at, cycles_at), 30, "a poll round and a cycle after Redis came back")
    elapsed = time.monotonic() - back
    wait_for(lambda: stack.job_states().get("pending", 0) == 0, 30, "the jobs submitted during the outage placed")

    after = dict(stack.sql("SELECT id, state FROM scheduler_job"))
    assert all(job_id in after for job_id, _ in jobs_before), "a job was lost"
    assert all(after[job_id] in ("approved", "dispatching", "running") for job_id, _ in jobs_before)
    assert len(after) == 5
    assert stack.violations() == [], dump(stack)
    print(f"rounds and cycles resumed {elapsed:.1f} s after Redis came back")


def test_postgres_connections_cut_under_load_the_next_round_succeeds_without_partial_writes(stack):
    stack.start_worker(concurrency=2)
    stack.start_beat()
    stack.submit(6, gpus=4, name="load")
    wait_for(lambda: all(latest(stack)), 90, "the stack running")
    stop = threading.Event()
    terminated = []

    def cut():
        with _admin_connection() as conn:
            while not stop.is_set():
                rows = conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                    "AND pid <> pg_backend_pid()", (stack.dbname,)).fetchall()
                terminated.append(len(rows))
                time.sleep(0.2)

    cutter = threading.Thread(target=cut)
    cutter.start()
    try:
        time.sleep(12)
    finally:
        stop.set()
        cutter.join(10)
    assert sum(terminated) > 0, "no connection was cut: the test did not test anything"
    rounds_at, cycles_at = latest(stack)
    wait_for(lambda: resumed(stack, rounds_at, cycles_at), 30, "a poll round and a cycle after the cuts")
    wait_for(lambda: stack.job_states().get("pending", 0) == 0, 30, "every job placed")
    # No partial writes: every round either finished with all its chunks or is open/abandoned
    # with counts that match what its chunks wrote; every cycle is complete.
    broken = stack.sql("SELECT id FROM pool_pollround WHERE finished_at IS NOT NULL AND chunks_done <> chunks")
    assert broken == [], broken
    assert stack.violations() == [], dump(stack)
    print(f"{sum(terminated)} backends terminated")
