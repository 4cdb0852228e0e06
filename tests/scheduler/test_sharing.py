"""GPU sharing (scheduler.engine.sharing): known-answer packings and, on random inputs, no
GPU over-committed (share or memory), whole GPUs never shared, MIG kept apart."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.engine import sharing
from scheduler.engine.sharing import Request, SharedGpu, SharingError

H100 = "NVIDIA H100 80GB HBM3"


def gpus(n, memory=81559, model=H100, **kw):
    return [SharedGpu(id=i, host=0, memory_mib=memory, model=model, **kw) for i in range(n)]


def test_fractions_fill_a_shared_gpu_before_breaking_a_whole_one():
    g = gpus(3)
    result = sharing.pack(g, [Request("a", milli=500), Request("b", milli=300), Request("c", milli=200)])
    assert {a.gpu_id for a in result.assigned.values()} == {0}
    assert g[0].used_milli == 1000
    assert result.whole_free == 2


def test_tightest_and_least_fragmenting_gpu_wins():
    g = gpus(2)
    g[0].used_milli, g[1].used_milli = 700, 400  # 300 and 600 free
    pick = sharing.choose(g, Request("x", milli=300))
    assert pick[0].id == 0  # fills GPU 0 exactly; GPU 1 keeps 600 for a 470 or 590 request
    pick = sharing.choose(g, Request("y", milli=500))
    assert pick[0].id == 1


def test_memory_is_never_over_committed_and_memory_only_requests_take_a_share():
    g = gpus(1, memory=40000)
    result = sharing.pack(g, [Request("a", memory_mib=30000), Request("b", memory_mib=20000)])
    assert list(result.assigned) == ["a"]
    assert result.assigned["a"].milli == 750  # 30000 of 40000 MiB
    assert "20000 MiB" in result.refused["b"]


def test_a_gpu_held_whole_takes_no_share_and_too_big_memory_is_explained():
    g = gpus(1, memory=16000, whole=True)
    result = sharing.pack(g, [Request("a", milli=100), Request("b", memory_mib=20000)])
    assert not result.assigned
    assert result.refused["a"] == "No GPU has 100/1000 of a GPU free now."
    assert result.refused["b"] == "No GPU here has 20000 MiB of memory."


def test_mig_profiles_use_slices_of_mig_capable_gpus_only():
    g = [SharedGpu(id="t4", memory_mib=15360, model="Tesla T4"), SharedGpu(id="h", memory_mib=81559, model=H100)]
    result = sharing.pack(g, [Request("a", mig_profile="3g.40gb"), Request("b", mig_profile="3g.40gb"),
                              Request("c", mig_profile="1g.10gb"), Request("d", milli=100)])
    assert result.assigned["a"].gpu_id == "h" and result.assigned["a"].mig_device == "3g.40gb@0"
    assert "b" in result.refused  # 3 + 3 slices fit, but 80 GiB of memory do not
    assert result.assigned["c"].mig_device == "1g.10gb@3"
    assert result.assigned["d"].gpu_id == "t4"  # a GPU in MIG use takes no plain share
    assert "MIG" in sharing.pack([SharedGpu(id=0, model="Tesla T4")], [Request("e", mig_profile="1g.5gb")]).refused["e"]


@pytest.mark.parametrize("kwargs, field", [
    ({"milli": 1000}, "gpu_milli"), ({"milli": -1}, "gpu_milli"), ({"memory_mib": -5}, "gpu_memory_mib"),
    ({"mig_profile": "5g.40gb"}, "MIG profile"), ({"mig_profile": "big"}, "MIG profile"),
    ({}, "needs gpu_milli"), ({"milli": 10, "mig_profile": "1g.10gb"}, "MIG profile fixes"),
])
def test_bad_requests_are_refused_naming_the_field(kwargs, field):
    with pytest.raises(SharingError, match=field):
        sharing.check_request(**kwargs)


def test_fragmentation_counts_free_share_typical_requests_cannot_use():
    workload = [(1000, 0.5), (500, 0.5)]
    assert sharing.gpu_fragmentation(1000, workload) == 0
    assert sharing.gpu_fragmentation(600, workload) == 300  # only the whole-GPU half is lost
    assert sharing.gpu_fragmentation(400, workload) == 400


requests = st.lists(st.one_of(
    st.builds(Request, job_id=st.uuids(), milli=st.integers(1, 999)),
    st.builds(Request, job_id=st.uuids(), memory_mib=st.integers(1, 90000)),
    st.builds(Request, job_id=st.uuids(), milli=st.integers(1, 999), memory_mib=st.integers(1, 50000)),
    st.builds(Request, job_id=st.uuids(), mig_profile=st.sampled_from(["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"])),
), max_size=40)
pools = st.lists(st.tuples(st.sampled_from([H100, "Tesla T4"]), st.integers(8000, 81559), st.booleans()),
                 min_size=1, max_size=6)


@settings(max_examples=150, deadline=None)
@given(pools, requests)
def test_no_gpu_is_over_committed_and_whole_gpus_are_never_shared(spec, reqs):
    g = [SharedGpu(id=i, memory_mib=mem, model=model, whole=whole) for i, (model, mem, whole) in enumerate(spec)]
    result = sharing.pack(g, reqs)
    assert set(result.assigned) | set(result.refused) == {r.job_id for r in reqs}
    by_gpu: dict = {}
    for a in result.assigned.values():
        by_gpu.setdefault(a.gpu_id, []).append(a)
    for gpu in g:
        mine = by_gpu.get(gpu.id, [])
        if gpu.whole:
            assert not mine
        assert sum(a.milli for a in mine) <= 1000
        assert sum(a.memory_mib for a in mine) <= gpu.memory_mib
        assert all(a.milli >= 1 for a in mine)
        kinds = {bool(a.mig_device) for a in mine}
        assert len(kinds) <= 1  # MIG and plain shares never mix on one GPU
        if True in kinds:
            assert gpu.mig_capable and gpu.mig_slices <= 7
    # Nothing was refused that an untouched GPU could have taken... unless no GPU is untouched.
    untouched = [x for x in g if not x.shared and not x.whole]
    for job_id, why in result.refused.items():
        req = next(r for r in reqs if r.job_id == job_id)
        assert not any(sharing.fits(x, req) for x in untouched), why


# -- through the engine's plan: fractions and whole-GPU jobs in one cycle --------------------------

from scheduler.engine import Gpu, Host, Job, Leaf, Snapshot, plan  # noqa: E402

job_specs = st.lists(st.one_of(st.tuples(st.just("whole"), st.integers(1, 4)),
                               st.tuples(st.just("milli"), st.integers(1, 999)),
                               st.tuples(st.just("mig"), st.sampled_from(["1g.10gb", "3g.40gb", "7g.80gb"]))),
                     max_size=25)


@settings(max_examples=100, deadline=None)
@given(job_specs, st.lists(st.tuples(st.integers(0, 999), st.booleans()), min_size=4, max_size=4))
def test_plan_never_gives_a_shared_gpu_to_a_whole_job_nor_over_commits_one(specs, used):
    # 2 hosts x 4 GPUs; some GPUs start partly shared (used milli), some hosts' GPUs whole-busy.
    gpus = []
    for h in range(2):
        for i in range(4):
            gid = h * 4 + i
            u, busy = used[i] if h == 0 else (0, False)
            gpus.append(Gpu(id=gid, host=h, index=i, model=H100, memory_mib=81559, free=not (u or busy),
                            used_milli=u))
    jobs = []
    for k, (kind, value) in enumerate(specs):
        extra = {"gpu_milli": value} if kind == "milli" else {"mig_profile": value} if kind == "mig" else {}
        jobs.append(Job(id=k, tenant="t", pool="p", gpus=value if kind == "whole" else 1, submit_time=k, **extra))
    snap = Snapshot(gpus=gpus, hosts=[Host(id=h, name=f"h{h}", leaves=("L",), pool="p") for h in range(2)],
                    leaves=[Leaf(id="L")], queue=jobs)
    result = plan(snap)
    start = {g.id: g.used_milli for g in gpus}
    whole, shares = set(), {}
    for d in result.placed:
        if d.shares:
            for gid, milli, _, _ in d.shares:
                shares[gid] = shares.get(gid, 0) + milli
        else:
            assert not whole & set(d.gpu_ids)
            whole.update(d.gpu_ids)
    for gid, total in shares.items():
        assert gid not in whole
        assert start[gid] + total <= 1000
    for gid in whole:
        assert start[gid] == 0 and gpus[gid].free
