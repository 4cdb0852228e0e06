"""`python manage.py demo_jobs`: the demo's steady stream of jobs, so that a newcomer sees the
queue move, proposals wait for a decision and GPUs fill and free.

`--setup` (run once by `make demo`, before anything else starts) puts the demo fabric's
hosts into the demo pool when they are in none, and creates three tenants with quotas and
the pool's approval policy (an operator decides proposals above --threshold GPUs). What
exists already is left as it is, so an operator's changes survive the next `make demo`.

Without --setup, jobs are submitted through scheduler.services.submit_job at --rate per
minute (Poisson arrivals) until Ctrl-C or SIGTERM (exit 0): sizes and run times drawn
from a sample of the Microsoft ITP trace (scheduler/data/itp_sizes.csv), run times
squeezed onto 1-10 minutes (on a log scale, so that their order holds), random tenants,
priorities and task classes. --seed makes the stream repeat exactly.
"""
from __future__ import annotations

import csv
import math
import random
import signal
import threading
from dataclasses import dataclass
from pathlib import Path

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, connection, transaction

from fabric.models import Fabric
from pool.models import Gpu, Host, Pool
from scheduler import services
from scheduler.models import Job, PoolPolicy, Tenant, TenantQuota

SIZES_FILE = Path(__file__).resolve().parents[2] / "data" / "itp_sizes.csv"
MIN_RUN_S, MAX_RUN_S = 60, 600
# name, description, guaranteed share of the pool's GPUs, limit share (borrowing up to it)
TENANTS = [
    ("vision", "Computer vision: detection and segmentation models", 0.30, 0.60),
    ("llm", "Language models: pre-training and fine-tuning", 0.45, 0.90),
    ("speech", "Speech recognition and synthesis", 0.20, 0.50),
]
TASK_CLASSES = [(Job.TaskClass.TRAINING, 6), (Job.TaskClass.INFERENCE, 2), (Job.TaskClass.SIMULATION, 1),
                (Job.TaskClass.SCIENCE, 1), (Job.TaskClass.RENDERING, 1)]
PRIORITIES = [(0, 6), (1, 3), (2, 1)]


def pause(stop: threading.Event, seconds: float) -> bool:
    """Wait between jobs; True when asked to stop. (Tests replace it with a fake clock.)"""
    return stop.wait(seconds)


@dataclass(frozen=True)
class JobSpec:
    tenant: str
    gpus: int
    run_s: int
    task_class: str
    priority: int


def load_sizes(path: Path = SIZES_FILE) -> list[tuple[int, int]]:
    """(GPUs, run time in seconds) rows of the trace sample; '#' lines are its notice."""
    rows = []
    with path.open(newline="") as f:
        for number, row in enumerate(csv.reader(line for line in f if not line.startswith("#")), 1):
            if number == 1:
                continue  # header
            try:
                gpus, duration = int(row[0]), int(row[1])
            except (IndexError, ValueError):
                raise CommandError(f"{path}: row {number}: expected num_gpu,duration_s, got {row!r}") from None
            if gpus < 1 or duration < 1:
                raise CommandError(f"{path}: row {number}: GPUs and duration must be positive, got {row!r}")
            rows.append((gpus, duration))
    if not rows:
        raise CommandError(f"{path}: no jobs in it")
    return rows


def squeeze(duration: int, shortest: int, longest: int) -> int:
    """A trace run time (seconds to weeks) onto MIN_RUN_S..MAX_RUN_S, on a log scale."""
    if longest <= shortest:
        return MIN_RUN_S
    where = (math.log(duration) - math.log(shortest)) / (math.log(longest) - math.log(shortest))
    return round(MIN_RUN_S + (MAX_RUN_S - MIN_RUN_S) * min(1.0, max(0.0, where)))


def _weighted(rng: random.Random, choices):
    values, weights = zip(*choices)
    return rng.choices(values, weights)[0]


def job_stream(rng: random.Random, sizes: list[tuple[int, int]], tenants: list[str], max_gpus: int):
    """Endless JobSpecs drawn from the trace sample."""
    shortest, longest = min(d for _, d in sizes), max(d for _, d in sizes)
    while True:
        gpus, duration = rng.choice(sizes)
        yield JobSpec(tenant=rng.choice(tenants), gpus=max(1, min(gpus, max_gpus)),
                      run_s=squeeze(duration, shortest, longest), task_class=_weighted(rng, TASK_CLASSES),
                      priority=_weighted(rng, PRIORITIES))


class Command(BaseCommand):
    help = ("The demo's job stream: submit jobs sized like the Microsoft ITP trace at --rate per minute until "
            "Ctrl-C. --setup first creates the demo's tenants, quotas and approval policy (and exits).")

    def add_arguments(self, parser):
        parser.add_argument("--setup", action="store_true",
                            help="create the demo pool's tenants, quotas and approval policy, then exit")
        parser.add_argument("--fabric", default="demo",
                            help="--setup: the fabric whose hosts join the pool (default: %(default)s)")
        parser.add_argument("--pool", default="demo", help="default: %(default)s")
        parser.add_argument("--threshold", type=int, default=16,
                            help="--setup: proposals above this many GPUs wait for an operator (default: %(default)s)")
        parser.add_argument("--rate", type=float, default=12.0,
                            help="jobs per minute on average (default: %(default)s)")
        parser.add_argument("--seed", type=int, default=None, help="the same seed submits the same jobs")
        parser.add_argument("--count", type=int, default=None, help="stop after this many jobs (default: never)")

    def handle(self, *args, **opts):
        if opts["setup"]:
            self.setup(opts["fabric"], opts["pool"], opts["threshold"])
            return
        if not 0 < opts["rate"] <= 6000:
            raise CommandError(f"--rate {opts['rate']}: give jobs per minute, above 0 and at most 6000")
        if opts["count"] is not None and opts["count"] < 0:
            raise CommandError(f"--count {opts['count']}: give 0 or more")
        self.stream(opts["pool"], opts["rate"], opts["seed"], opts["count"])

    # -- set-up -----------------------------------------------------------------------------------

    def setup(self, fabric_name: str, pool_name: str, threshold: int) -> None:
        if threshold < 0:
            raise CommandError(f"--threshold {threshold}: give 0 or more GPUs")
        fabric = Fabric.objects.filter(name=fabric_name).first()
        if fabric is None:
            raise CommandError(f"no fabric named {fabric_name!r}: build it first "
                               f"(manage.py build_fattree --fabric {fabric_name} ...)")
        with transaction.atomic():
            pool, made = Pool.objects.get_or_create(name=pool_name, defaults={"description": "The demo's GPU pool"})
            joined = Host.objects.filter(fabric=fabric, pool__isnull=True).update(pool=pool)
            gpus = Gpu.objects.filter(host__pool=pool, present=True).count()
            created = []
            for name, description, guaranteed, limit in TENANTS:
                tenant, new = Tenant.objects.get_or_create(name=name, defaults={"description": description})
                if new:
                    created.append(f"tenant {name}")
                _, new = TenantQuota.objects.get_or_create(tenant=tenant, pool=pool, defaults={
                    "guaranteed_gpus": int(gpus * guaranteed), "limit_gpus": int(gpus * limit)})
                if new:
                    created.append(f"quota of {name} ({int(gpus * guaranteed)} GPUs guaranteed, "
                                   f"up to {int(gpus * limit)})")
            _, new = PoolPolicy.objects.get_or_create(pool=pool, defaults={
                "mode": PoolPolicy.Mode.THRESHOLD, "threshold_gpus": threshold})
            if new:
                created.append(f"approval policy (an operator decides above {threshold} GPUs)")
        self.stdout.write(f"pool {pool.name}{' (new)' if made else ''}: {gpus} GPUs"
                          + (f", {joined} hosts of fabric {fabric.name} joined it" if joined else ""))
        self.stdout.write("created " + ", ".join(created) if created
                          else "tenants, quotas and policy were already there")

    # -- the stream ---------------------------------------------------------------------------------

    def stream(self, pool_name: str, rate: float, seed: int | None, count: int | None) -> None:
        pool = Pool.objects.filter(name=pool_name).first()
        if pool is None:
            raise CommandError(f"no pool named {pool_name!r}: run `manage.py demo_jobs --setup` first")
        tenants = list(TenantQuota.objects.filter(pool=pool).order_by("tenant__name")
                       .values_list("tenant__name", flat=True))
        if not tenants:
            raise CommandError(f"pool {pool_name!r} has no tenants with a quota: "
                               "run `manage.py demo_jobs --setup` first")
        max_gpus = Gpu.objects.filter(host__pool=pool, present=True).count()
        if not max_gpus:
            raise CommandError(f"pool {pool_name!r} has no GPUs: put hosts in it (demo_jobs --setup --fabric NAME)")
        rng = random.Random(seed)
        specs = job_stream(rng, load_sizes(), tenants, max_gpus)

        stop = threading.Event()
        previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
        self.stdout.write(f"submitting about {rate:g} jobs a minute to pool {pool_name} "
                          f"({', '.join(tenants)}); Ctrl-C stops")
        submitted = 0
        try:
            while not stop.is_set() and (count is None or submitted < count):
                spec = next(specs)
                submitted += 1
                self.submit(pool_name, spec, submitted)
                if count is not None and submitted >= count:
                    break
                if pause(stop, rng.expovariate(rate / 60.0)):
                    break
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        self.stdout.write(f"stopped after {submitted} jobs")

    def submit(self, pool: str, spec: JobSpec, number: int) -> None:
        try:
            job = services.submit_job(
                None, tenant=spec.tenant, pool=pool, gpus=spec.gpus, command=["sleep", str(spec.run_s)],
                name=f"{spec.tenant}-{spec.task_class}-{number}", task_class=spec.task_class, priority=spec.priority,
                estimated_runtime_s=spec.run_s, max_runtime_s=spec.run_s * 2)
        except (ValidationError, DatabaseError) as exc:
            # A busy SQLite file, a tenant deleted meanwhile or a cut database connection: say
            # so and go on with the next job (on a fresh connection: a cut one stays broken).
            self.stderr.write(f"job {number} not submitted: {exc}")
            if isinstance(exc, DatabaseError):
                connection.close()
            return
        minutes, seconds = divmod(spec.run_s, 60)
        self.stdout.write(f"job {job.pk}: {spec.gpus} GPU{'s' if spec.gpus != 1 else ''} for {spec.tenant}, "
                          f"{spec.task_class}, priority {spec.priority}, runs {minutes} min {seconds:02d} s")
