"""FabricPool's placement engine: plain data in, decisions out. No Django here (the
allocation cycle snapshots the database into these dataclasses and persists the Plan).

    from scheduler.engine import plan, Snapshot, Gpu, Host, Leaf, Job
    result = plan(Snapshot(gpus=..., hosts=..., leaves=..., queue=..., now=...))

Modules: model (dataclasses), index (numbered fabric and incremental free counters),
placement (where one job goes), plan (order, quotas, backfill, explanations), validate
(cost of a GPU set chosen by hand), policies (preemption, remote sites, rebalancing;
run by plan after the plain cycle).
"""
from .model import (CONSTRAINTS, PLACE, PREEMPTION, PRIORITY, QUOTA, REASONS, REBALANCE, REMOTE, RESERVED, RESOURCES,
                    TOPOLOGY_WAIT, UNHEALTHY_HOSTS, ClassRule, Constraints, Cost, Decision, Gpu, Host, Job, Leaf, Move,
                    Plan, Pod, Quota, Reservation, Running, SiteLink, Snapshot, SnapshotError, TopologyRequirement)
from .plan import plan, prepare, queue_order
from .validate import validate_and_cost

__all__ = [
    "CONSTRAINTS", "PLACE", "PREEMPTION", "PRIORITY", "QUOTA", "REASONS", "REBALANCE", "REMOTE", "RESERVED",
    "RESOURCES", "TOPOLOGY_WAIT", "UNHEALTHY_HOSTS", "ClassRule", "Constraints", "Cost", "Decision", "Gpu", "Host",
    "Job", "Leaf", "Move", "Plan", "Pod", "Quota", "Reservation", "Running", "SiteLink", "Snapshot", "SnapshotError",
    "TopologyRequirement", "plan", "prepare", "queue_order", "validate_and_cost",
]
