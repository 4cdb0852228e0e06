"""Signals of the pool, and growing the cluster: after every fabric import, register the
hosts discovery found.

New hosts get their agent URL from AGENT_URL_TEMPLATE and are polled from the next round;
their GPUs join when their first report arrives. Hosts whose adapters vanished are flagged
(in_fabric False and a HostEvent), never deleted. Connected in PoolConfig.ready.
"""
import logging

from django.dispatch import Signal

from .services import register_hosts_from_fabric

log = logging.getLogger(__name__)

# Sent by pool.ingest after a chunk of poll results commits, with
# reports=[(host_id, host_name, [allocation dicts as agent.protocol.parse_report gives them])]
# for every host that sent a good report (its list may be empty). The scheduler listens
# (scheduler.reconcile); the pool itself knows nothing of placements.
allocations_reported = Signal()


def register_discovered_hosts(sender, fabric, result=None, **kwargs):
    registration = register_hosts_from_fabric(fabric)
    if registration.changed:
        log.info("fabric %s: %s", fabric.name, registration.summary())
    return registration
