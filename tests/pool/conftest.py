"""Fixtures for the pool tests: a small registered fat tree, the agent simulator
(agent/simulate.py) serving its hosts on a free port in a background thread, and short
poll timeouts so that fault tests take a second, not ten."""
import uuid

import pytest

from agent.simulate import Simulator, load_fabric_hosts, parse_hosts
from fabric import fattree
from fabric.importer import import_topology
from pool import tasks
from pool.models import Host
from pool.services import register_hosts_from_fabric
from pool.tokens import agent_secret
from tests.servers import RunningServer


class RunningSimulator(RunningServer):
    def __init__(self, sim: Simulator):
        self.sim = sim
        super().__init__(sim.app())

    def url(self, host: str) -> str:
        return f"{self.base}/h/{host}"

    def fault(self, host, fault: str, **params):
        names = self.sim.select_hosts(host)
        return self.call(self.sim.apply_fault, names, fault, params)


@pytest.fixture
def poll_settings(settings):
    settings.POLL_CONNECT_TIMEOUT = 0.5
    settings.POLL_READ_TIMEOUT = 0.5
    settings.POLL_INTERVAL = 10.0
    settings.STALE_AFTER = 2
    settings.UNREACHABLE_AFTER = 4
    settings.AGENT_TOKEN_SECRET = "test-agent-secret"
    return settings


def build_cluster(name="t", *, leaves=2, hosts_per_leaf=2, gpus_per_host=8, hcas_per_host=1):
    tree = fattree.build(spines=2, leaves=leaves, hosts_per_leaf=hosts_per_leaf, gpus_per_host=gpus_per_host,
                         hcas_per_host=hcas_per_host)
    result = import_topology(tree.topology, name, source_name="test")
    register_hosts_from_fabric(result.fabric, gpus_per_host=gpus_per_host)
    return result.fabric


@pytest.fixture
def cluster(db, poll_settings):
    """4 hosts (gpu0001..gpu0004) x 8 placeholder GPUs, as build_fattree registers them."""
    return build_cluster()


@pytest.fixture
def simulator(cluster, poll_settings):
    """The simulator serving the cluster's hosts with the server's token secret; the hosts'
    agent URLs point at it."""
    running = RunningSimulator(Simulator(load_fabric_hosts(cluster.name), secret=agent_secret(), seed=1))
    for host in Host.objects.filter(fabric=cluster):
        host.agent_url = running.url(host.name)
        host.save(update_fields=["agent_url"])
    yield running
    running.stop()


@pytest.fixture
def hosts_simulator(poll_settings):
    """A simulator from a hosts file (no database): start(text, secret=...)."""
    started = []

    def start(text, secret=None, **kwargs):
        running = RunningSimulator(Simulator(parse_hosts(text), secret=secret or agent_secret(), **kwargs))
        started.append(running)
        return running
    yield start
    for running in started:
        running.stop()


@pytest.fixture
def round_lock(monkeypatch):
    """Lock keys of this test's own (the real ones may be held by a running beat or worker)."""
    key = f"fabricpool:test:poll-round:{uuid.uuid4().hex[:8]}"
    monkeypatch.setattr(tasks, "ROUND_LOCK", key)
    monkeypatch.setattr(tasks, "PRUNE_LOCK", key + ":prune")
    yield key
    tasks._redis().delete(key, key + ":prune")
