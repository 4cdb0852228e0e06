"""Dense, incremental views of the hardware for fast placement.

`Fabric` numbers hosts, placement leaves ("groups") and pods 0..n-1 once per cycle, or once
for many cycles when the caller passes the same one to `plan(snapshot, fabric=...)` (the
hardware of every snapshot then must be the very sequences it was built from: a trace replay).
`FreeIndex` keeps, for one class of jobs (one set of eligible GPUs), the free GPUs per host
and the counters placement needs: free GPUs per group, GPUs on wholly free hosts per group,
hosts bucketed by their free count, and per bucket a heap of groups ordered by
(health penalty, free GPUs, group). Taking or giving back GPUs updates them in
O(hosts touched); finding the tightest host for a job is O(host size · log).
"""
from __future__ import annotations

import re
from bisect import bisect_left
from heapq import heappop, heappush
from itertools import accumulate

from .model import Constraints, SnapshotError, Snapshot

ISOLATED = 1.0  # a leaf at this penalty has no working uplink: only jobs inside it go there


def _tokens(text: str) -> tuple:
    return tuple(t for t in re.split(r"[^A-Z0-9]+", text.upper()) if t)


def model_matches(wanted: str, model: str) -> bool:
    """Whole-word, case-insensitive: "H100" matches "NVIDIA H100 80GB HBM3", "H20" not "H200"."""
    want, have = _tokens(wanted), _tokens(model)
    if not want:
        return False
    n = len(want)
    return any(have[i:i + n] == want for i in range(len(have) - n + 1))


class Fabric:
    """The snapshot's hardware, numbered. Raises SnapshotError on inconsistent input."""

    def __init__(self, snap: Snapshot):
        leaves = {}
        for leaf in snap.leaves:
            if leaf.id in leaves:
                raise SnapshotError(f"leaf {leaf.id!r} appears twice")
            if not 0 <= leaf.health_penalty <= 1:
                raise SnapshotError(f"leaf {leaf.name or leaf.id!r}: health_penalty must be between 0 and 1, "
                                    f"not {leaf.health_penalty!r}")
            leaves[leaf.id] = leaf
        self.leaf = leaves
        self.pod_name = {p.id: p.name or str(p.id) for p in snap.pods}
        for leaf in leaves.values():
            if leaf.pod is not None and snap.pods and leaf.pod not in self.pod_name:
                raise SnapshotError(f"leaf {leaf.name or leaf.id!r} names unknown pod {leaf.pod!r}")

        self.host_ids: list = []
        self.hidx: dict = {}
        self.host_name: list[str] = []
        self.host_pool: list = []
        self.host_site: list[str] = []
        self.host_healthy: list[bool] = []
        self.host_group: list[int] = []
        group_of_key: dict = {}
        self.group_key: list[tuple] = []  # leaf ids of each group
        self.group_pen: list[float] = []
        self.group_pod: list[int] = []
        self.group_hosts: list[list[int]] = []
        pod_of_key: dict = {}
        self.pod_key: list[tuple] = []
        for host in snap.hosts:
            if host.id in self.hidx:
                raise SnapshotError(f"host {host.id!r} appears twice")
            for lid in host.leaves:
                if lid not in leaves:
                    raise SnapshotError(f"host {host.name or host.id!r} names unknown leaf {lid!r}")
            key = tuple(sorted(set(host.leaves), key=repr))
            # A host cabled to no known leaf is a leaf of its own (it cannot share one).
            gkey = key if key else ("host", host.id)
            g = group_of_key.get(gkey)
            if g is None:
                g = group_of_key[gkey] = len(self.group_key)
                self.group_key.append(key)
                self.group_pen.append(max((leaves[l].health_penalty for l in key), default=0.0))
                pkey = tuple(sorted({leaves[l].pod for l in key}, key=repr)) if key else ("host", host.id)
                p = pod_of_key.get(pkey)
                if p is None:
                    p = pod_of_key[pkey] = len(self.pod_key)
                    self.pod_key.append(pkey)
                self.group_pod.append(p)
                self.group_hosts.append([])
            h = len(self.host_ids)
            self.hidx[host.id] = h
            self.host_ids.append(host.id)
            self.host_name.append(host.name or str(host.id))
            self.host_pool.append(host.pool)
            self.host_site.append(host.site)
            self.host_healthy.append(bool(host.healthy))
            self.host_group.append(g)
            self.group_hosts[g].append(h)
        self.ngroups = len(self.group_key)
        self.npods = len(self.pod_key)

        self.gpu = {}
        self.gpu_host: dict = {}  # gpu id -> host index
        self.host_gpus: list[list] = [[] for _ in self.host_ids]
        for gpu in snap.gpus:
            if gpu.id in self.gpu:
                raise SnapshotError(f"GPU {gpu.id!r} appears twice")
            h = self.hidx.get(gpu.host)
            if h is None:
                raise SnapshotError(f"GPU {gpu.id!r} is on unknown host {gpu.host!r}")
            self.gpu[gpu.id] = gpu
            self.gpu_host[gpu.id] = h
            self.host_gpus[h].append(gpu)
        for gpus in self.host_gpus:
            gpus.sort(key=lambda g: g.index)
        self.host_size = [len(g) for g in self.host_gpus]
        self.pool_hosts: dict = {}
        for h, pool in enumerate(self.host_pool):
            self.pool_hosts.setdefault(pool, []).append(h)
        self.kinds = {(g.model, g.memory_mib, g.fp64) for g in snap.gpus}
        self._kind_cache: dict = {}
        self._elig_cache: dict = {}
        self.class_cache: dict = {}  # engine.plan: what never changes about a class of jobs
        # Usable unless a running job holds it: free, healthy, on a healthy host.
        self.usable = frozenset(g.id for g in snap.gpus
                                if g.free and g.healthy and self.host_healthy[self.gpu_host[g.id]])
        self.source = (snap.gpus, snap.hosts, snap.leaves, snap.pods)
        self._sizes = tuple(len(s) for s in self.source)

    def matches(self, snap: Snapshot) -> bool:
        """Built from this snapshot's hardware: the same sequence objects, still the same length."""
        seqs = (snap.gpus, snap.hosts, snap.leaves, snap.pods)
        return all(a is b for a, b in zip(self.source, seqs)) and tuple(len(s) for s in seqs) == self._sizes

    def group_label(self, g: int) -> str:
        key = self.group_key[g]
        if not key:
            return f"{self.host_name[self.group_hosts[g][0]]} (no leaf)"
        return "+".join(self.leaf[l].name or str(self.leaf[l].id) for l in key)

    def pod_label(self, p: int) -> str:
        key = self.pod_key[p]
        return "+".join(self.pod_name.get(x, str(x)) for x in key if x is not None) or "the fabric"

    def eligible_kinds(self, c: Constraints) -> frozenset:
        kinds = self._kind_cache.get(c)
        if kinds is None:
            kinds = frozenset(
                k for k in self.kinds
                if (not c.models or any(model_matches(m, k[0]) for m in c.models))
                and k[1] >= c.min_memory_mib and (c.fp64 is None or k[2] == c.fp64))
            self._kind_cache[c] = kinds
        return kinds

    def eligible(self, pool, site, kinds, healthy_only: bool) -> dict[int, list]:
        """host index -> its GPU ids a job of this class may use (sorted by GPU index).
        Cached: callers must not change what it returns."""
        key = (pool, site, kinds, healthy_only)
        out = self._elig_cache.get(key)
        if out is not None:
            return out
        out = self._elig_cache[key] = {}
        for h in self.pool_hosts.get(pool, ()):
            if site is not None and self.host_site[h] != site:
                continue
            if healthy_only and not self.host_healthy[h]:
                continue
            ids = [g.id for g in self.host_gpus[h]
                   if (g.model, g.memory_mib, g.fp64) in kinds and (g.healthy or not healthy_only)]
            if ids:
                out[h] = ids
        return out


class Capacity:
    """Per-group capacities frozen at one moment, for "could it ever / could it have" checks."""

    def __init__(self, fab: Fabric, elig: dict[int, list], free, ignore_health: bool = False):
        self.max_host = 0
        whole = [0] * fab.ngroups
        loose = [0] * fab.ngroups
        for h, ids in elig.items():
            n = sum(1 for i in ids if i in free) if free is not None else len(ids)
            if n > self.max_host:
                self.max_host = n
            g = fab.host_group[h]
            loose[g] += n
            if n == len(ids):
                whole[g] += n
        pens = [0.0] * fab.ngroups if ignore_health else fab.group_pen
        self._caps = {True: Leaves(whole, pens), False: Leaves(loose, pens)}

    @classmethod
    def of(cls, idx: "FreeIndex") -> "Capacity":
        """The capacities of a FreeIndex as it is now (the same as Capacity(fab, elig, free))."""
        cap = cls.__new__(cls)
        cap.max_host = idx.max_host_free()
        pens = idx.fab.group_pen
        cap._caps = {True: Leaves(idx.gwhole, pens), False: Leaves(idx.gfree, pens)}
        return cap

    def leaves(self, whole: bool) -> "Leaves":
        return self._caps[whole]


class Leaves:
    """Capacity per group with the fewest-leaves answer: min k with the k largest >= N."""

    def __init__(self, caps: list[int], pens: list[float]):
        self.max_one = max(caps, default=0)
        usable = sorted((c for c, p in zip(caps, pens) if c and p < ISOLATED), reverse=True)
        self.prefix = list(accumulate(usable))
        self.total = self.prefix[-1] if self.prefix else 0

    def min_leaves(self, n: int) -> int | None:
        if n <= self.max_one:
            return 1
        if n > self.total:
            return None
        return bisect_left(self.prefix, n) + 1


class FreeIndex:
    """Free eligible GPUs of one job class, with incremental counters (see module doc)."""

    def __init__(self, fab: Fabric, elig: dict[int, list], free: set, members=None):
        self.fab = fab
        self.elig = elig
        # members: every GPU id in elig, when the caller has it already.
        self.members = members if members is not None else {i for ids in elig.values() for i in ids}
        self.hosts = sorted(elig)
        H, G = len(fab.host_ids), fab.ngroups
        self.cap = [0] * H
        self.free: list[list] = [[] for _ in range(H)]
        self.hfree = [0] * H
        self.maxc = max((len(ids) for ids in elig.values()), default=0)
        self.gfree = [0] * G
        self.gwhole = [0] * G
        self.gver = [0] * G
        self.by_c = [[set() for _ in range(self.maxc + 1)] for _ in range(G)]
        self.ncnt = [0] * (self.maxc + 1)
        self.heaps: list[list] = [[] for _ in range(self.maxc + 1)]
        self.total_free = 0
        self.dirty: set[int] = set()
        host_group = fab.host_group
        for h, ids in elig.items():
            self.cap[h] = len(ids)
            f = [i for i in ids if i in free]
            self.free[h] = f
            n = len(f)
            if n:
                g = host_group[h]
                self.hfree[h] = n
                self.by_c[g][n].add(h)
                self.ncnt[n] += 1
                self.gfree[g] += n
                self.total_free += n
                if n == len(ids):
                    self.gwhole[g] += n
                self.dirty.add(g)
        self.refresh()

    # -- updates ---------------------------------------------------------------------------
    def _host_changed(self, h: int, old: int) -> None:
        new = len(self.free[h])
        if new == old:
            return
        g = self.fab.host_group[h]
        cap = self.cap[h]
        if old:
            self.by_c[g][old].discard(h)
            self.ncnt[old] -= 1
        if new:
            self.by_c[g][new].add(h)
            self.ncnt[new] += 1
        self.hfree[h] = new
        self.gfree[g] += new - old
        self.total_free += new - old
        self.gwhole[g] += (new if new == cap else 0) - (old if old == cap else 0)
        self.dirty.add(g)

    def take(self, gpu_ids) -> None:
        """These GPUs are no longer free (ids outside this class are ignored)."""
        by_host: dict[int, list] = {}
        for i in gpu_ids:
            if i in self.members:
                by_host.setdefault(self.fab.gpu_host[i], []).append(i)
        for h, ids in by_host.items():
            old = self.hfree[h]
            gone = set(ids)
            self.free[h] = [i for i in self.free[h] if i not in gone]
            self._host_changed(h, old)
        self.refresh()

    def give(self, gpu_ids) -> None:
        """These GPUs are free again (ids outside this class are ignored)."""
        by_host: dict[int, list] = {}
        for i in gpu_ids:
            if i in self.members:
                by_host.setdefault(self.fab.gpu_host[i], []).append(i)
        for h, ids in by_host.items():
            old = self.hfree[h]
            now = set(self.free[h]) | set(ids)
            self.free[h] = [i for i in self.elig[h] if i in now]
            self._host_changed(h, old)
        self.refresh()

    def refresh(self) -> None:
        """Push the current key of every changed group into the heap of each bucket it is in."""
        for g in self.dirty:
            self.gver[g] += 1
            entry_key = (self.fab.group_pen[g], self.gfree[g], g, self.gver[g])
            for c, hosts in enumerate(self.by_c[g]):
                if hosts:
                    heappush(self.heaps[c], entry_key)
        self.dirty.clear()

    # -- queries ---------------------------------------------------------------------------
    def max_host_free(self) -> int:
        for c in range(self.maxc, 0, -1):
            if self.ncnt[c]:
                return c
        return 0

    def tightest_host(self, n: int) -> int | None:
        """The host with the fewest free GPUs that still has n; among equals the one in the
        healthiest, then fullest group (so emptier leaves stay whole), then the lowest."""
        for c in range(max(n, 1), self.maxc + 1):
            if not self.ncnt[c]:
                continue
            heap = self.heaps[c]
            while heap:
                pen, gf, g, ver = heap[0]
                if ver == self.gver[g] and self.by_c[g][c]:
                    return min(self.by_c[g][c])
                heappop(heap)
        return None

    def leaves(self, whole: bool) -> Leaves:
        return Leaves(self.gwhole if whole else self.gfree, self.fab.group_pen)
