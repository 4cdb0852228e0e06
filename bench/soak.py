"""`python -m bench.soak --minutes 10`: the demo stack (bench.stack: private Redis, a fresh
PostgreSQL database, simulated agents, two Celery workers, beat, the ASGI server) on a
1,024-host fat tree with a steady job stream and random faults, then JSON on stdout.

Faults, one every --fault-every seconds, chosen at random (seeded):
  worker_child_killed   SIGKILL a worker's pool process mid-whatever (the OOM killer's way)
  worker_killed         SIGKILL a whole worker, started again 5 s later
  redis_restarted       SIGKILL redis-server (no persistence), started again 3 s later
  postgres_cut          pg_terminate_backend on every connection of the database, 5 s long
  agents_misbehave      8 random hosts hang / answer garbage / 50 MB / trickle / drop for 30 s

The invariants (bench.stack.Stack.violations: no GPU in two active placements, no half-written
cycle, every placed job with exactly one active placement...) are checked every 5 s; any
violation seen is counted and listed. Memory: resident set of each program (with its children)
after warm-up and at the end.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from .stack import Stack, StackUnavailable, _admin_connection, wait_for

FAULTS = ("worker_child_killed", "worker_killed", "redis_restarted", "postgres_cut", "agents_misbehave")
AGENT_FAULTS = (("hang", {}), ("garbage", {"body": "binary"}), ("oversized", {"mb": 50}), ("trickle", {}),
                ("down", {}))


def progress(message: str) -> None:
    print(f"soak: {message}", file=sys.stderr, flush=True)


class Soak:
    def __init__(self, stack: Stack, seed: int):
        self.stack = stack
        self.rng = random.Random(seed)
        self.faults: list[dict] = []
        self.violations: list[str] = []
        self.exited: list[dict] = []
        self.checks = 0
        self.jobs_argv: list[str] = []

    # -- faults ----------------------------------------------------------------------------------

    def inject(self, fault: str) -> None:
        s, started = self.stack, time.time()
        if fault == "worker_child_killed":
            self.check_programs()
            s.kill_worker_child(self.rng.choice(["worker", "worker2"]))
        elif fault == "worker_killed":
            name = self.rng.choice(["worker", "worker2"])
            s.kill(name)
            time.sleep(5)
            s.start_worker(name, concurrency=2)
        elif fault == "redis_restarted":
            s.kill("redis")
            time.sleep(3)
            s.start_redis()
        elif fault == "postgres_cut":
            deadline = time.monotonic() + 5
            with _admin_connection() as conn:
                while time.monotonic() < deadline:
                    conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                                 "AND pid <> pg_backend_pid()", (s.dbname,))
                    time.sleep(0.25)
        elif fault == "agents_misbehave":
            hosts = [r[0] for r in s.sql("SELECT name FROM pool_host ORDER BY random() LIMIT 8")]
            for host in hosts:
                kind, params = self.rng.choice(AGENT_FAULTS)
                self.control({"host": host, "fault": kind, "params": params})
            threading.Timer(30, lambda: self.control({"host": hosts, "fault": "clear"})).start()
        self.faults.append({"fault": fault, "at_s": round(started - self.t0, 1)})
        progress(f"{fault} at {started - self.t0:.0f} s")

    def control(self, body: dict) -> None:
        from agent.protocol import derive_token

        token = derive_token(self.stack.env["AGENT_TOKEN_SECRET"], "simulator control")
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.stack.sim_port}/control/faults", data=json.dumps(body).encode(), method="POST",
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        try:
            urllib.request.urlopen(request, timeout=5).close()
        except OSError as exc:
            progress(f"could not set agent fault {body}: {exc}")

    # -- checks ----------------------------------------------------------------------------------

    def restart(self, name: str) -> None:
        s = self.stack
        if name.startswith("worker"):
            s.start_worker(name, concurrency=2)
        elif name == "beat":
            s.start_beat()
        elif name == "redis":
            s.start_redis()
        elif name == "web":
            s.start_web()
        elif name == "agents":
            s.start_agents()
        elif name == "jobs":
            s.start("jobs", self.jobs_argv)

    def check_programs(self) -> None:
        """A program that exited by itself is an error of the soak (a supervisor would restart
        it, and so does this loop): counted, with the end of its log."""
        for name, proc in list(self.stack.procs.items()):
            code = proc.poll()
            if code is None:
                continue
            tail = self.stack.log_of(name).strip().splitlines()[-3:]
            self.exited.append({"program": name, "exit_code": code, "at_s": round(time.time() - self.t0, 1),
                                "log_tail": tail})
            progress(f"{name} exited with {code}: {tail[-1:]}; starting it again")
            self.stack.procs.pop(name)
            self.restart(name)

    def check(self) -> None:
        try:
            found = self.stack.violations()
        except Exception as exc:  # noqa: BLE001 - the database may be cut right now: not a violation
            progress(f"check skipped: {exc}")
            return
        self.checks += 1
        for v in found:
            if v not in self.violations:
                progress(f"VIOLATION: {v}")
                self.violations.append(v)

    def run(self, minutes: float, fault_every: float) -> None:
        self.t0 = time.time()
        end = self.t0 + minutes * 60
        next_fault = self.t0 + fault_every
        while time.time() < end:
            if time.time() >= next_fault:
                fault = self.rng.choice(FAULTS)
                try:
                    self.inject(fault)
                except Exception as exc:  # noqa: BLE001 - e.g. a worker still starting has no pool process
                    progress(f"{fault} not injected: {exc}")
                    self.faults.append({"fault": fault, "at_s": round(time.time() - self.t0, 1),
                                        "not_injected": str(exc)})
                next_fault = time.time() + fault_every
            self.check_programs()
            self.check()
            time.sleep(5)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--hosts", type=int, default=1024, help="hosts (32 per leaf; default: %(default)s)")
    parser.add_argument("--rate", type=float, default=30.0, help="jobs per minute (default: %(default)s)")
    parser.add_argument("--fault-every", type=float, default=45.0, help="seconds between faults (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    per_leaf = 32 if args.hosts >= 32 else args.hosts
    leaves = max(1, args.hosts // per_leaf)
    spines = max(2, min(16, leaves // 2))
    with tempfile.TemporaryDirectory(prefix="fabricpool-soak-") as tmp:
        try:
            stack = Stack(Path(tmp), spines=spines, leaves=leaves, hosts_per_leaf=per_leaf, log=progress,
                          env={"POLL_INTERVAL": "10", "CYCLE_INTERVAL": "5", "CYCLE_LOCK_TTL": "30",
                               "POLL_READ_TIMEOUT": "3", "LOG_LEVEL": "WARNING"})
        except StackUnavailable as exc:
            progress(str(exc))
            return 2
        with stack:
            progress(f"setting up {leaves * per_leaf} hosts ({leaves * per_leaf * 8} GPUs)")
            stack.setup()
            for name in ("worker", "worker2"):
                stack.start_worker(name, concurrency=2)
            stack.start_beat()
            stack.start_web()
            jobs_argv = [sys.executable, "manage.py", "demo_jobs", "--pool", "rel", "--rate", str(args.rate),
                         "--seed", str(args.seed)]
            stack.start("jobs", jobs_argv)
            wait_for(lambda: stack.sql("SELECT count(*) FROM pool_pollround WHERE finished_at IS NOT NULL")[0][0] >= 2,
                     180, "two poll rounds (warm-up)")
            programs = ("worker", "worker2", "beat", "web", "agents", "redis")
            memory_start = {name: round(stack.rss_mib(name), 1) for name in programs}
            counts_start = stack.summary()
            soak = Soak(stack, args.seed)
            soak.jobs_argv = jobs_argv
            soak.run(args.minutes, args.fault_every)
            time.sleep(15)  # let the last fault heal before the final check
            soak.check()
            memory_end = {name: round(stack.rss_mib(name), 1) for name in programs if name in stack.procs}
            errors = {
                "failed_cycles": stack.sql("SELECT count(*) FROM scheduler_allocationcycle WHERE error <> ''")[0][0],
                "abandoned_rounds": stack.sql("SELECT count(*) FROM pool_pollround WHERE abandoned")[0][0],
                "failed_placements": stack.sql("SELECT count(*) FROM scheduler_placement WHERE state = 'failed'")[0][0],
                "programs_exited": len(soak.exited),
            }
            cycles = stack.sql("SELECT count(*) FROM scheduler_allocationcycle WHERE error = '' "
                               "AND finished_at IS NOT NULL")[0][0]
            rounds = stack.sql("SELECT count(*) FROM pool_pollround WHERE finished_at IS NOT NULL")[0][0]
            result = {
                "minutes": args.minutes, "hosts": leaves * per_leaf, "gpus": leaves * per_leaf * 8,
                "cycles_completed": cycles, "rounds_completed": rounds,
                "cycles_during_soak": cycles - counts_start["cycles"], "rounds_during_soak": rounds - counts_start["rounds"],
                "jobs": stack.job_states(), "faults": soak.faults, "errors": errors,
                "invariant_checks": soak.checks, "invariant_violations": len(soak.violations),
                "violations": soak.violations, "exited": soak.exited,
                "memory_mib": {name: {"start": memory_start[name], "end": memory_end.get(name),
                                      "growth": None if memory_end.get(name) is None else
                                      round(memory_end[name] - memory_start[name], 1)} for name in memory_start},
            }
    print(json.dumps(result, indent=2))
    return 0 if not result["violations"] else 1


if __name__ == "__main__":
    sys.exit(main())
