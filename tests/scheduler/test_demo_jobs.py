"""The demo's job stream: its set-up can run every `make demo` without undoing an operator's
changes, the stream submits trace-sized jobs that repeat with a seed, and Ctrl-C / SIGTERM
end it cleanly."""
import io
import os
import signal

import pytest
from django.core.management import CommandError, call_command

from pool.models import Host, Pool
from scheduler.management.commands import demo_jobs
from scheduler.models import Job, PoolPolicy, Tenant, TenantQuota

pytestmark = pytest.mark.django_db


@pytest.fixture
def demo_fabric(db):
    """A small "demo" fabric as build_fattree leaves it: 4 hosts x 8 GPUs, in no pool."""
    call_command("build_fattree", "--fabric", "demo", "--spines", "2", "--leaves", "2", "--hosts-per-leaf", "2",
                 "--gpus-per-host", "8", "--speed", "EDR", verbosity=0)


def run(*args) -> str:
    out = io.StringIO()
    call_command("demo_jobs", *args, stdout=out, stderr=out)
    return out.getvalue()


def test_setup_makes_the_pool_tenants_quotas_and_policy(demo_fabric):
    text = run("--setup", "--fabric", "demo")
    pool = Pool.objects.get(name="demo")
    assert Host.objects.filter(pool=pool).count() == 4
    quotas = {q.tenant.name: (q.guaranteed_gpus, q.limit_gpus) for q in TenantQuota.objects.filter(pool=pool)}
    assert quotas == {"vision": (9, 19), "llm": (14, 28), "speech": (6, 16)}  # shares of its 32 GPUs
    policy = PoolPolicy.objects.get(pool=pool)
    assert (policy.mode, policy.threshold_gpus) == (PoolPolicy.Mode.THRESHOLD, 16)
    assert "pool demo (new): 32 GPUs, 4 hosts of fabric demo joined it" in text
    assert "approval policy (an operator decides above 16 GPUs)" in text


def test_setup_again_changes_nothing_and_keeps_what_an_operator_changed(demo_fabric):
    run("--setup")
    TenantQuota.objects.filter(tenant__name="llm").update(guaranteed_gpus=20, limit_gpus=None)
    PoolPolicy.objects.update(mode=PoolPolicy.Mode.MANUAL)
    def rows():
        return (list(Tenant.objects.values_list("id", "name")),
                list(TenantQuota.objects.values_list("id", "guaranteed_gpus")))
    before = rows()
    text = run("--setup")
    assert rows() == before
    assert PoolPolicy.objects.get().mode == PoolPolicy.Mode.MANUAL
    assert "tenants, quotas and policy were already there" in text


def test_setup_without_the_fabric_says_what_to_do(db):
    with pytest.raises(CommandError, match="no fabric named 'demo': build it first"):
        run("--setup")
    assert not Pool.objects.exists()


def test_the_stream_needs_the_setup_first(demo_fabric):
    with pytest.raises(CommandError, match="run `manage.py demo_jobs --setup` first"):
        run("--count", "1")
    assert not Job.objects.exists()


def jobs():
    return list(Job.objects.order_by("id").values_list("gpus", "estimated_runtime_s", "tenant__name", "task_class",
                                                       "priority", "command"))


def test_the_stream_submits_trace_sized_jobs_that_repeat_with_the_seed(demo_fabric, monkeypatch):
    run("--setup")
    waits = []
    monkeypatch.setattr(demo_jobs, "pause", lambda stop, seconds: waits.append(seconds) or False)
    text = run("--count", "30", "--seed", "7", "--rate", "12")
    first = jobs()
    assert len(first) == 30 and len(waits) == 29
    sizes = {gpus for gpus, _ in demo_jobs.load_sizes()}
    for gpus, runtime, tenant, task_class, priority, command in first:
        assert gpus in sizes and gpus <= 32  # capped at the pool's GPUs
        assert 60 <= runtime <= 600 and command == ["sleep", str(runtime)]
        assert tenant in {"vision", "llm", "speech"} and task_class in Job.TaskClass.values and priority in (0, 1, 2)
    assert len({row[0] for row in first}) > 1 and len({row[2] for row in first}) == 3
    assert 1 < sum(waits) / len(waits) < 20  # about 5 s apart at 12 a minute
    assert "stopped after 30 jobs" in text

    Job.objects.all().delete()
    run("--count", "30", "--seed", "7", "--rate", "12")
    assert jobs() == first


def test_sigterm_ends_the_stream_cleanly(demo_fabric, monkeypatch):
    run("--setup")
    calls = []
    real_pause = demo_jobs.pause

    def pause(stop, seconds):
        calls.append(seconds)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # as the supervisor does at Ctrl-C
        return real_pause(stop, 5 if len(calls) == 3 else 0)  # the signal cuts the wait short

    monkeypatch.setattr(demo_jobs, "pause", pause)
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    text = run("--rate", "60")  # no --count: until stopped
    assert Job.objects.count() == 3
    assert "stopped after 3 jobs" in text
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_bad_options_are_refused(demo_fabric):
    with pytest.raises(CommandError, match="--rate 0.0: give jobs per minute"):
        run("--rate", "0")
    with pytest.raises(CommandError, match="--count -1"):
        run("--count", "-1")


def test_the_trace_sample_is_small_and_keeps_its_notice():
    path = demo_jobs.SIZES_FILE
    assert path.stat().st_size < 50_000
    text = path.read_text()
    assert text.startswith("# NOTICE:") and "Copyright (c) Microsoft Corporation." in text
    sizes = demo_jobs.load_sizes()
    assert len(sizes) > 1000 and {gpus for gpus, _ in sizes} == {1, 2, 4, 8, 16, 32, 64}
    shortest, longest = min(d for _, d in sizes), max(d for _, d in sizes)
    squeezed = [demo_jobs.squeeze(d, shortest, longest) for d in (shortest, 3600, 86400, longest)]
    assert squeezed[0] == 60 and squeezed[-1] == 600 and squeezed == sorted(squeezed)
