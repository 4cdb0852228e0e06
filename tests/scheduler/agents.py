"""Agents for the dispatch and reconciliation tests: the real simulator (agent/simulate.py) on a
free port with a clock the test moves, tiny aiohttp agents that misbehave on purpose, Celery
tasks run in-process, and helpers to propose, approve and poll.

Import the fixtures by name into a test module (pytest then finds them there)."""

import pytest
from celery.signals import task_failure

from agent.simulate import Simulator, load_fabric_hosts
from config.celery import app as celery_app
from pool import tasks as pool_tasks
from pool.models import Gpu, Host
from pool.tokens import agent_secret
from scheduler import services
from scheduler.models import Job, Placement, PlacementGpu

from tests.servers import RunningServer

from .conftest import build_cluster


class Clock:
    """The simulator's time: it moves only when the test says."""

    def __init__(self, start: float = 1_800_000_000.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class RunningSimulator(RunningServer):
    def __init__(self, sim: Simulator, clock: Clock):
        self.sim, self.clock = sim, clock
        super().__init__(sim.app())

    def url(self, host: str) -> str:
        return f"{self.base}/h/{host}"

    def allocation(self, host: str, alloc_id: str):
        return self.call(lambda: self.sim.hosts[host].allocations.get(alloc_id))

    def acknowledged(self, host: str, alloc_id: str) -> bool:
        return self.call(lambda: alloc_id in self.sim.hosts[host].acknowledged)

    def occupy(self, host: str, gpu_index: int, alloc_id: str = "someone-else") -> None:
        """Work the scheduler does not know about, on one GPU of a host."""
        sim_host = self.sim.hosts[host]
        request = {"id": alloc_id, "command": ["sleep", "1000"], "env": {},
                   "gpus": [sim_host.gpus[gpu_index].spec.uuid], "duration_s": 1000, "workload": "training",
                   "distributed": {}}
        self.call(lambda: sim_host.start(request, self.clock(), 1000))


@pytest.fixture
def eager_tasks():
    """Celery tasks run in this process as they are sent (no broker, no worker), retries
    included (at once). A task that fails fails the test."""
    failures = []

    def failed(sender=None, exception=None, **kwargs):
        failures.append((sender.name, exception))
    task_failure.connect(failed)
    saved = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = True
    yield
    celery_app.conf.task_always_eager = saved
    task_failure.disconnect(failed)
    assert not failures


@pytest.fixture
def agent_settings(settings):
    settings.AGENT_TOKEN_SECRET = "test-agent-secret"
    settings.POLL_CONNECT_TIMEOUT = 0.5
    settings.POLL_READ_TIMEOUT = 0.5
    settings.DISPATCH_TIMEOUT = 0.5
    settings.DISPATCH_RETRIES = 2
    settings.DISPATCH_BACKOFF_S = 0.01
    return settings


@pytest.fixture
def small_cluster(db, agent_settings):
    """4 hosts (gpu0001..gpu0004) of 4 GPUs under 2 leaves, pool "main", all up."""
    return build_cluster(fabric="disp", leaves=2, hosts_per_leaf=2, gpus=4)


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def simulator(small_cluster, clock):
    """The simulator serving the cluster's hosts; their agent URLs point at it. Work starts
    1 s after the POST and a stop takes 1 s (simulated seconds: clock.advance)."""
    running = RunningSimulator(Simulator(load_fabric_hosts(small_cluster.fabric), secret=agent_secret(), seed=1,
                                         clock=clock, startup_s=1.0, stop_grace_s=1.0), clock)
    for host in Host.objects.filter(fabric__name=small_cluster.fabric):
        host.agent_url = running.url(host.name)
        host.save(update_fields=["agent_url"])
    yield running
    running.stop()


def submit(cluster, tenant, gpus, **kwargs) -> Job:
    kwargs.setdefault("estimated_runtime_s", 60)
    return services.submit_job(None, tenant=tenant, pool=cluster.pool, gpus=gpus, command=["python", "train.py"],
                               **kwargs)


def propose(job: Job, hosts: list[str]) -> Placement:
    """A proposal of every GPU of these hosts (as a cycle would write it)."""
    gpus = list(Gpu.objects.filter(host__name__in=hosts).order_by("host__name", "index").values_list("id", flat=True))
    placement = Placement.objects.create(job=job, state=Placement.State.PROPOSED, hosts=len(hosts))
    PlacementGpu.objects.bulk_create([PlacementGpu(placement=placement, gpu_id=g) for g in gpus[:job.gpus]])
    Job.objects.filter(pk=job.pk).update(state=Job.State.PROPOSED)
    return placement


def approve(placement: Placement, operator, capture) -> Placement:
    """The operator approves; what follows the commit (dispatch) runs now."""
    with capture(execute=True):
        services.approve(placement, operator, placement.version)
    placement.refresh_from_db()
    return placement


def poll(cluster, capture) -> None:
    """One poll of every host of the cluster, with what follows its commit (reconciliation)."""
    with capture(execute=True):
        pool_tasks.poll_hosts(Host.objects.filter(fabric__name=cluster.fabric).values_list("id", flat=True))


def active_gpus(placement: Placement) -> int:
    return PlacementGpu.objects.filter(placement=placement, active=True).count()
