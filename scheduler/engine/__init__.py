"""FabricPool's placement engine: plain data in, decisions out. No Django here (the
allocation cycle snapshots the database into these dataclasses and persists the Plan).

    from scheduler.engine import plan, Snapshot, Gpu, Host, Leaf, Job
    result = plan(Snapshot(gpus=..., hosts=..., leaves=..., queue=..., now=...))

Modules: model (dataclasses), index (numbered fabric and incremental free counters),
placement (where one job goes), plan (order, quotas, backfill, explanations), validate
(cost of a GPU set chosen by hand).
"""
from .model import (CONSTRAINTS, PRIORITY, QUOTA, REASONS, RESERVED, RESOURCES, TOPOLOGY_WAIT, UNHEALTHY_HOSTS,
                    Constraints, Cost, Decision, Gpu, Host, Job, Leaf, Plan, Pod, Quota, Reservation, Running,
                    Snapshot, SnapshotError, TopologyRequirement)
from .plan import plan, queue_order
from .validate import validate_and_cost

__all__ = [
    "CONSTRAINTS", "PRIORITY", "QUOTA", "REASONS", "RESERVED", "RESOURCES", "TOPOLOGY_WAIT", "UNHEALTHY_HOSTS",
    "Constraints", "Cost", "Decision", "Gpu", "Host", "Job", "Leaf", "Plan", "Pod", "Quota", "Reservation",
    "Running", "Snapshot", "SnapshotError", "TopologyRequirement", "plan", "queue_order", "validate_and_cost",
]
