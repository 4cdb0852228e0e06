"""Read-only helpers for picking an override on the GPU heatmap: what the page embeds for one
proposal (its GPUs, the pool's GPUs by leaf and host, the GPU id of every heatmap cell), and
the dry run of a pick. The dry run is selectors.preview_override, the same checks
services.override makes (engine.validate_and_cost plus the GPUs other placements hold), so
a pick the panel accepts is one the override accepts, and it writes nothing."""
from __future__ import annotations

from django.db.models import Count

from pool.models import Gpu

from . import selectors
from .models import Placement, PlacementGpu

MAX_PICK = 4096  # more GPU ids than any pick needs: refused before anything is looked up


class BadPick(ValueError):
    """The request itself is malformed (not the pick breaking a rule); str() says what."""


def parse_pick(payload) -> tuple[list[int], int]:
    """{"gpus": [ids], "version": n} -> (ids without repeats, version). BadPick otherwise."""
    if not isinstance(payload, dict):
        raise BadPick('Send a JSON object {"gpus": [GPU ids], "version": the placement version you saw}.')
    gpus, version = payload.get("gpus"), payload.get("version")
    if not isinstance(gpus, list) or not all(isinstance(g, int) and not isinstance(g, bool) for g in gpus):
        raise BadPick('"gpus" must be a list of GPU ids (whole numbers).')
    if len(gpus) > MAX_PICK:
        raise BadPick(f'"gpus" lists {len(gpus)} ids: at most {MAX_PICK}.')
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise BadPick('"version" must be the placement version you saw (a whole number from 1).')
    return list(dict.fromkeys(gpus)), version


def proposal_gpu_ids(placement: Placement) -> list[int]:
    return sorted(PlacementGpu.objects.filter(placement=placement, active=True).values_list("gpu_id", flat=True))


def whole_host_notes(placement: Placement, gpu_ids) -> list[str]:
    """Hosts a whole-host job would share with other work. Shown, not enforced: the override
    service (engine.validate_and_cost) treats host counts as costs an operator may choose."""
    job = placement.job
    if not job.whole_hosts or not gpu_ids:
        return []
    rows = list(Gpu.objects.filter(pk__in=list(gpu_ids)).values_list("host_id", "host__name"))
    hosts = {host_id: name for host_id, name in rows}
    sizes = {h: n for h, n in Gpu.objects.filter(host_id__in=list(hosts), present=True)
             .values_list("host_id").annotate(n=Count("id")).order_by()}
    size = max(sizes.values(), default=0)
    if job.gpus <= size:
        return []  # fits in one host: the whole-host rule does not apply
    picked: dict[int, int] = {}
    for host_id, _name in rows:
        picked[host_id] = picked.get(host_id, 0) + 1
    partial = sorted(hosts[h] for h, n in picked.items() if n < sizes.get(h, 0))
    if not partial:
        return []
    return [f"The job asks for whole hosts; this pick uses only part of {', '.join(partial)}. "
            "The override allows it (an operator's choice), but the rest of those hosts stays free for others."]


def check(placement: Placement, gpu_ids: list[int]) -> dict:
    """The dry run: {"ok", "problems", "notes", "cost", "proposal_cost", "table"}. Nothing is written."""
    proposal_cost = placement.cost_dict()  # what the pick would replace
    result = {"ok": False, "problems": [], "notes": [], "cost": None, "proposal_cost": proposal_cost,
              "count": len(gpu_ids), "version": placement.version, "state": placement.state}
    if not gpu_ids:
        result["problems"] = ["Pick at least one GPU."]
        return result
    outcome = selectors.preview_override(placement, gpu_ids)
    if isinstance(outcome, list):
        result["problems"] = outcome
        return result
    result.update(ok=True, cost=outcome.as_dict(), notes=whole_host_notes(placement, gpu_ids))
    return result


def cost_rows(proposal_cost: dict, pick_cost: dict | None) -> list[dict]:
    """The cost table as plain rows for the page's script: label, proposal, pick, differs."""
    table = selectors.cost_table([("proposal", proposal_cost or {}), ("your pick", pick_cost or {})])
    return [{"key": row["key"], "label": row["label"], "proposal": row["values"][0], "pick": row["values"][1],
             "differs": pick_cost is not None and row["differs"]} for row in table["rows"]]


def cell_ids(host_names: list[str], rows: int) -> list[list[int | None]]:
    """The GPU id of every heatmap cell (rows: GPU index, columns: hosts in the page's order)."""
    column = {name: i for i, name in enumerate(host_names)}
    grid: list[list[int | None]] = [[None] * len(host_names) for _ in range(rows)]
    for gpu_id, name, index in Gpu.objects.filter(host__name__in=host_names, present=True).values_list(
            "id", "host__name", "index"):
        if index < rows:
            grid[index][column[name]] = gpu_id
    return grid


def pick_context(placement: Placement, *, can_decide: bool) -> dict:
    """What the heatmap embeds in pick mode (json_script) and renders as the GPU list."""
    job = placement.job
    proposal = proposal_gpu_ids(placement)
    decidable = placement.state in Placement.DECIDABLE_STATES
    # The pool's GPUs by leaf and host, compact ([id, index, status]): the page's script builds
    # the keyboard list from it when it is opened (thousands of server-rendered boxes are slow).
    groups = [{"leaf": group["leaf"],
               "hosts": [{"name": host["name"], "gpus": [[g["id"], g["index"], g["status"]] for g in host["gpus"]]}
                         for host in group["hosts"]]}
              for group in selectors.pool_gpu_choices(placement)]
    proposal_cost = placement.cost_dict()
    return {
        "placement": placement.pk, "version": placement.version, "state": placement.state,
        "decidable": decidable, "can_pick": can_decide and decidable,
        "job": {"id": job.pk, "name": job.name or f"job {job.pk}", "gpus": job.gpus, "gang": job.gang,
                "whole_hosts": job.whole_hosts, "pool": job.pool.name},
        "proposal": proposal, "proposal_cost": proposal_cost, "table": cost_rows(proposal_cost, None),
        "groups": groups,
    }
