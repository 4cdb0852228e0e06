"""Where one job goes: the cost order of DESIGN.md applied to one FreeIndex.

Modes
  single  N <= the largest host of its class: one host, the tightest that fits (the host
          with the fewest free GPUs that still has N), so whole hosts stay whole.
  whole   N > host size, `whole_hosts` (the default): ceil(N / host size) wholly free hosts.
  loose   N > host size, whole_hosts=False: free GPUs of any hosts, fullest hosts first.
  partial a non-gang job that cannot have all N now: up to N GPUs on the most fragmented
          hosts (it does not care where they are).

For whole/loose jobs the leaf set is chosen in this order:
  1. fewest placement leaves: k = the smallest k whose k largest leaf capacities (GPUs on
     free whole hosts, or free GPUs) reach N; that k is also the lower bound, so k is exact;
  2. fewest pods among leaf sets of size k (the fewest pods whose k largest leaves reach N);
     a job never takes more leaves to stay inside one pod (leaves first, as DESIGN.md says);
  3. lowest worst health penalty among the leaves used;
  4. least leftover: from the leaves allowed, repeatedly take the smallest leaf that still
     lets the remaining slots cover what is left (best fit), so large free leaves stay whole.
     The GPUs are taken whole from the smaller leaves and the remainder from the largest.
Leaves cut off from the spines (penalty 1) only take jobs that fit inside one leaf.
"""
from __future__ import annotations

from bisect import bisect_left
from itertools import combinations, islice
from math import comb

from .index import ISOLATED, Fabric, FreeIndex, Leaves

SINGLE, WHOLE, LOOSE, PARTIAL = "single", "whole", "loose", "partial"
MAX_POD_SETS = 256  # pod sets tried per size when a job must cross pods


def choose(idx: FreeIndex, mode: str, n: int, max_leaves: int | None, latency: bool = False):
    """(gpu ids, None) or (None, fewest leaves it would need now, or None if it cannot fit).
    `latency`: a latency-sensitive job (task class rule) goes to leaves whose uplinks are all
    healthy when any can hold it (within its leaf limit), the least loaded first."""
    fab = idx.fab
    if latency and mode in (SINGLE, WHOLE, LOOSE):
        gpus = _healthy_only(idx, mode, n, max_leaves)
        if gpus is not None:
            return gpus, None
    if mode == SINGLE:
        h = idx.tightest_host(n)
        if h is None:
            return None, None
        return tuple(idx.free[h][:n]), None
    if mode == PARTIAL:
        return _partial(idx, n, max_leaves), None
    whole = mode == WHOLE
    caps = idx.gwhole if whole else idx.gfree
    k = Leaves(caps, fab.group_pen).min_leaves(n)
    if k is None or (max_leaves is not None and k > max_leaves):
        return None, k
    amounts = _leaf_set(idx, caps, n, k)
    gpus = []
    for g, amount in amounts:
        gpus.extend(_from_group(idx, g, amount, whole))
    return tuple(gpus), None


def _healthy_only(idx: FreeIndex, mode: str, n: int, max_leaves: int | None):
    fab = idx.fab
    pen = fab.group_pen
    if mode == SINGLE:
        # The healthy leaf with the most free GPUs (lightly loaded), then the tightest host there.
        hosts = [h for h in idx.hosts if idx.hfree[h] >= n and pen[fab.host_group[h]] == 0]
        if not hosts:
            return None
        h = min(hosts, key=lambda h: (-idx.gfree[fab.host_group[h]], idx.hfree[h], h))
        return tuple(idx.free[h][:n])
    whole = mode == WHOLE
    caps = [c if pen[g] == 0 else 0 for g, c in enumerate(idx.gwhole if whole else idx.gfree)]
    k = Leaves(caps, pen).min_leaves(n)
    if k is None or (max_leaves is not None and k > max_leaves):
        return None
    gpus = []
    for g, amount in _leaf_set(idx, caps, n, k):
        gpus.extend(_from_group(idx, g, amount, whole))
    return tuple(gpus)


def _leaf_set(idx: FreeIndex, caps: list[int], n: int, k: int) -> list[tuple[int, int]]:
    fab = idx.fab
    pen, gfree = fab.group_pen, idx.gfree
    if k == 1:
        # Best fit: the smallest leaf that holds it; then the healthiest; then the fullest.
        g = min((g for g in range(fab.ngroups) if caps[g] >= n), key=lambda g: (caps[g], pen[g], gfree[g], g))
        return [(g, n)]
    by_pod: dict[int, list[int]] = {}
    for g in range(fab.ngroups):
        if caps[g] and pen[g] < ISOLATED:
            by_pod.setdefault(fab.group_pod[g], []).append(g)

    def top(gs):
        return sum(sorted((caps[g] for g in gs), reverse=True)[:k])

    # Fewest pods: every set of 1, 2, ... pods whose k largest leaves hold the job (up to
    # MAX_POD_SETS sets per size; past that, the pods that bring the most, greedily).
    pods = sorted(by_pod, key=lambda p: (-top(by_pod[p]), p))
    pod_sets = []
    for size in range(1, len(pods) + 1):
        for combo in islice(combinations(pods, size), MAX_POD_SETS):
            if top([g for p in combo for g in by_pod[p]]) >= n:
                pod_sets.append(list(combo))
        if pod_sets:
            break
        if comb(len(pods), size) > MAX_POD_SETS and top([g for p in pods[:size] for g in by_pod[p]]) >= n:
            pod_sets.append(pods[:size])
            break
    best = None
    for pods in pod_sets:
        gs = [g for p in pods for g in by_pod[p]]
        chosen = _best_fit_leaves(gs, caps, pen, gfree, n, k)
        key = (max(pen[g] for g in chosen), sum(caps[g] for g in chosen) - n,
               sum(gfree[g] for g in gs), pods)
        if best is None or key < best[0]:
            best = (key, chosen)
    chosen = sorted(best[1], key=lambda g: (caps[g], g))
    amounts = [(g, caps[g]) for g in chosen[:-1]]
    amounts.append((chosen[-1], n - sum(a for _, a in amounts)))
    return amounts


def _best_fit_leaves(gs, caps, pen, gfree, n, k) -> list[int]:
    # The lowest penalty ceiling under which k leaves can still hold the job...
    for ceiling in sorted({pen[g] for g in gs}):
        allowed = [g for g in gs if pen[g] <= ceiling]
        if sum(sorted((caps[g] for g in allowed), reverse=True)[:k]) >= n:
            break
    # ...then, slot by slot, the smallest leaf that leaves the rest coverable.
    asc = sorted(allowed, key=lambda g: (caps[g], gfree[g], g))
    chosen, need = [], n
    for slots in range(k, 0, -1):
        values = [caps[g] for g in asc]
        rest = sum(values[len(values) - (slots - 1):]) if slots > 1 else 0
        j = bisect_left(values, need - rest, 0, len(values) - (slots - 1))
        g = asc.pop(j)
        chosen.append(g)
        need -= caps[g]
        if need <= 0:
            break
    return chosen


def _from_group(idx: FreeIndex, g: int, amount: int, whole: bool) -> list:
    hosts = idx.fab.group_hosts[g]
    if whole:
        cands = sorted((h for h in hosts if idx.hfree[h] and idx.hfree[h] == idx.cap[h]),
                       key=lambda h: (-idx.cap[h], h))
    else:
        cands = sorted((h for h in hosts if idx.hfree[h]), key=lambda h: (-idx.hfree[h], h))
    out = []
    while amount > 0:
        h = cands[0]
        if not whole and idx.hfree[h] > amount:
            # The last host: the smallest one that still covers the rest (best fit).
            h = min((x for x in cands if idx.hfree[x] >= amount), key=lambda x: (idx.hfree[x], x))
        cands.remove(h)
        take = min(amount, idx.hfree[h])
        out.extend(idx.free[h][:take])
        amount -= take
    return out


def _partial(idx: FreeIndex, n: int, max_leaves: int | None) -> tuple:
    fab = idx.fab
    allowed = None
    if max_leaves is not None:  # a leaf limit still holds: the leaves with the most free
        allowed = set(sorted(range(fab.ngroups), key=lambda g: (-idx.gfree[g], g))[:max_leaves])
    hosts = sorted((h for h in idx.hosts if idx.hfree[h] and (allowed is None or fab.host_group[h] in allowed)),
                   key=lambda h: (idx.hfree[h], fab.group_pen[fab.host_group[h]], h))
    out = []
    for h in hosts:
        out.extend(idx.free[h][:n - len(out)])
        if len(out) >= n:
            break
    return tuple(out)


def describe(fab: Fabric, gpu_ids, free_after) -> dict:
    """Hosts, leaves, pods and the Cost fields of a GPU set. `free_after(h)` = GPUs still
    free and usable on host index h once this set is taken."""
    hosts, groups, pods = [], set(), set()
    seen = set()
    for i in gpu_ids:
        h = fab.gpu_host[i]
        if h not in seen:
            seen.add(h)
            hosts.append(h)
            g = fab.host_group[h]
            groups.add(g)
            pods.add(fab.group_pod[g])
    leaves = sorted({l for g in groups for l in fab.group_key[g]}, key=repr)
    pod_ids = sorted({x for p in pods for x in fab.pod_key[p] if x is not None}, key=repr)
    return {
        "hosts": hosts, "groups": sorted(groups), "pods": sorted(pods), "leaf_ids": tuple(leaves),
        "pod_ids": tuple(pod_ids),
        "health_penalty": max((fab.group_pen[g] for g in groups), default=0.0),
        "fragmentation_left": sum(free_after(h) for h in hosts),
    }
