"""Which proposals wait for an operator: the pool's PoolPolicy (none: approve automatically).
Load policies with select_related("pool"): the sentences name the pool."""
from __future__ import annotations

from .models import PoolPolicy


def operator_needed(policy: PoolPolicy | None, gpus: int, pod_crossings: int, *, override: bool = False,
                    preemption: bool = False) -> str | None:
    """Why this placement waits for an operator (a sentence), or None to approve it now. An
    override is itself an operator's decision: only manual_for_overrides holds it back."""
    if policy is None:
        return None
    if override:
        return "overrides in this pool wait for a second decision" if policy.manual_for_overrides else None
    if policy.mode == PoolPolicy.Mode.MANUAL:
        return f"pool {policy.pool.name} approves every proposal by hand"
    if preemption and policy.manual_for_preemptions:
        return "preemptions in this pool wait for an operator"
    if policy.mode == PoolPolicy.Mode.THRESHOLD and gpus > policy.threshold_gpus:
        return f"it takes {gpus} GPUs, above this pool's threshold of {policy.threshold_gpus}"
    if policy.manual_when_crossing_spines and pod_crossings > 0:
        return f"it spans {pod_crossings + 1} pods (crosses the core switches)"
    return None
