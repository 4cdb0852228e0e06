"""Poll rounds (lock in the real Redis, fan-out, closing the round), rollups and retention,
and the beat schedule. Tasks are called directly, as a worker calls them; the group that
poll_round sends is captured instead of going to the broker."""
from datetime import timedelta

import pytest
from django.utils import timezone
from django_celery_beat.models import PeriodicTask

from pool import rollups, tasks
from pool.models import (
    Gpu,
    GpuRollup,
    GpuSample,
    Host,
    HostRollup,
    HostSample,
    PollRound,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def sent(monkeypatch):
    """The chunk signatures poll_round hands to Celery, with the options it sends them with."""
    calls = []

    class FakeGroup:
        def __init__(self, signatures):
            self.signatures = list(signatures)

        def apply_async(self, **options):
            calls.append((self.signatures, options))

    monkeypatch.setattr(tasks, "group", FakeGroup)
    return calls


def run_chunks(calls):
    for signatures, _ in calls:
        for signature in signatures:
            tasks.poll_chunk(*signature.args)


def test_a_round_fans_out_in_chunks_and_the_last_chunk_closes_it(cluster, simulator, sent, round_lock, settings):
    settings.POLL_CHUNK_SIZE = 3
    Host.objects.create(name="no-agent", agent_kind=Host.AgentKind.NONE, agent_url="http://x:9400")
    Host.objects.create(name="no-url", agent_url="")
    result = tasks.poll_round()
    assert result["ok"] and (result["hosts"], result["chunks"]) == (4, 2)
    [(signatures, options)] = sent
    assert [len(sig.args[1]) for sig in signatures] == [3, 1]
    assert options["expires"] == tasks.round_lock_ttl()
    assert tasks._redis().get(round_lock) is not None  # held while the chunks run

    run_chunks(sent)
    round_ = PollRound.objects.get(pk=result["round"])
    assert (round_.chunks_done, round_.hosts_ok, round_.hosts_error, round_.gpu_samples) == (2, 4, 0, 32)
    assert round_.finished_at is not None and 0 < round_.duration_s < 10 and not round_.overran
    assert tasks._redis().get(round_lock) is None  # released by the last chunk
    assert set(Host.objects.filter(name__startswith="gpu").values_list("state", flat=True)) == {"up"}
    assert Host.objects.get(name="no-agent").state == "new"


def test_a_round_is_skipped_while_the_previous_one_holds_the_lock(cluster, sent, round_lock, caplog):
    first = tasks.poll_round()
    assert first["ok"]
    with caplog.at_level("WARNING", logger="pool.tasks"):
        second = tasks.poll_round()
    assert second == {"ok": False, "skipped": "previous round still running"}
    assert "poll round skipped: previous round still running" in caplog.text
    assert PollRound.objects.count() == 1 and len(sent) == 1


def test_the_lock_expires_if_a_worker_dies_mid_round(cluster, sent, round_lock, settings):
    settings.POLL_INTERVAL = 10
    tasks.poll_round()
    ttl_ms = tasks._redis().pttl(round_lock)
    assert 30_000 < ttl_ms <= 35_000  # three intervals and a little: then the next round may start
    # the worker died: nobody releases it; once it has expired, a round runs and marks the old one
    tasks._redis().delete(round_lock)
    PollRound.objects.update(started_at=timezone.now() - timedelta(seconds=60))
    assert tasks.poll_round()["ok"]
    old, new = PollRound.objects.order_by("id")
    assert old.abandoned and old.finished_at is None and not new.abandoned


def test_a_slow_round_is_flagged_as_overrun(cluster, simulator, sent, round_lock, settings, caplog):
    result = tasks.poll_round()
    PollRound.objects.filter(pk=result["round"]).update(started_at=timezone.now() - timedelta(seconds=25))
    with caplog.at_level("WARNING", logger="pool.tasks"):
        run_chunks(sent)
    round_ = PollRound.objects.get(pk=result["round"])
    assert round_.overran and round_.duration_s >= 25
    assert f"poll round {round_.pk} overran" in caplog.text


def test_a_round_with_nothing_to_poll_finishes_at_once(db, sent, round_lock):
    result = tasks.poll_round()
    assert result["hosts"] == 0 and not sent
    assert PollRound.objects.get().finished_at is not None
    assert tasks._redis().get(round_lock) is None


def test_a_chunk_of_a_round_that_was_closed_does_not_reopen_it(cluster, simulator, sent, round_lock):
    result = tasks.poll_round()
    run_chunks(sent)
    finished = PollRound.objects.get(pk=result["round"]).finished_at
    run_chunks(sent)  # a redelivered message (acks_late)
    assert PollRound.objects.get(pk=result["round"]).finished_at == finished


def test_the_beat_schedule_exists_and_is_enabled():
    poll = PeriodicTask.objects.get(name="pool: poll round")
    assert (poll.task, poll.enabled, poll.interval.period) == ("pool.tasks.poll_round", True, "seconds")
    assert poll.expire_seconds == poll.interval.every
    prune = PeriodicTask.objects.get(name="pool: rollups and retention")
    assert (prune.task, prune.enabled, prune.interval.every, prune.interval.period) == ("pool.tasks.prune_samples", True, 5, "minutes")


# --- rollups and retention ---------------------------------------------------------------


def add_samples(gpu, host, start, count, step_s=10, utilization=lambda i: float(i)):
    GpuSample.objects.bulk_create([
        GpuSample(gpu=gpu, t=start + timedelta(seconds=i * step_s), utilization=utilization(i), memory_used_mib=100.0,
                  temperature_c=50.0 + i, power_w=None) for i in range(count)])
    HostSample.objects.bulk_create([
        HostSample(host=host, t=start + timedelta(seconds=i * step_s), cpu_percent=10.0, memory_used_mib=5.0,
                   ib_tx_bytes_per_s=1000.0 * i, ib_rx_bytes_per_s=None) for i in range(count)])


def test_rollups_average_and_max_per_minute_then_per_hour(cluster):
    gpu = Gpu.objects.filter(host__name="gpu0001").first()
    host = gpu.host
    hour = timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=9)
    add_samples(gpu, host, hour, 360)  # one sample per 10 s for an hour: utilization 0..359
    done = rollups.rollup()
    assert set(done) == {"GpuRollup/60", "GpuRollup/3600", "HostRollup/60", "HostRollup/3600"}
    minutes = GpuRollup.objects.filter(gpu=gpu, resolution=60).order_by("t")
    assert minutes.count() == 60
    first = minutes[0]
    assert (first.t, first.samples, first.utilization_avg, first.utilization_max, first.temperature_c_max, first.power_w_avg) == (
        hour, 6, 2.5, 5.0, 55.0, None)
    [whole] = GpuRollup.objects.filter(gpu=gpu, resolution=3600)
    assert (whole.t, whole.samples, whole.utilization_avg, whole.utilization_max) == (hour, 360, 179.5, 359.0)
    [host_hour] = HostRollup.objects.filter(host=host, resolution=3600)
    assert (host_hour.ib_tx_bytes_per_s_avg, host_hour.ib_tx_bytes_per_s_max, host_hour.ib_rx_bytes_per_s_avg) == (179500.0, 359000.0, None)
    # running again changes nothing
    assert rollups.rollup() == {}
    assert GpuRollup.objects.count() == 61
    # polling stopped for a while: the next samples are rolled up, the gap is skipped
    add_samples(gpu, host, hour + timedelta(hours=2, minutes=30), 6)
    assert rollups.rollup()
    assert GpuRollup.objects.filter(resolution=60, t=hour + timedelta(hours=2, minutes=30)).get().samples == 6


def test_the_current_minute_is_not_rolled_up_yet(cluster):
    gpu = Gpu.objects.filter(host__name="gpu0001").first()
    add_samples(gpu, gpu.host, timezone.now() - timedelta(seconds=30), 3, step_s=5)
    rollups.rollup()
    assert not GpuRollup.objects.exists()


def test_retention_deletes_old_samples_only_once_rolled_up(cluster, settings, round_lock):
    settings.SAMPLE_RETENTION_HOURS = 1
    gpu = Gpu.objects.filter(host__name="gpu0001").first()
    now = timezone.now()
    add_samples(gpu, gpu.host, now - timedelta(hours=3), 6, step_s=60)  # old
    add_samples(gpu, gpu.host, now - timedelta(minutes=10), 3, step_s=60)  # recent
    result = tasks.prune_samples()
    assert result["ok"] and result["deleted"]["GpuSample"] == 6 and result["deleted"]["HostSample"] == 6
    assert GpuSample.objects.count() == 3
    # the old hours live on in the rollups
    assert GpuRollup.objects.filter(resolution=60, t__lt=now - timedelta(hours=2)).count() == 6


def test_rollups_are_kept_for_their_own_retention(cluster, settings):
    settings.ROLLUP_1M_RETENTION_DAYS = 1
    settings.ROLLUP_1H_RETENTION_DAYS = 2
    gpu = Gpu.objects.filter(host__name="gpu0001").first()
    now = timezone.now().replace(minute=0, second=0, microsecond=0)
    for days in (0.5, 1.5, 3):
        t = now - timedelta(days=days)
        GpuRollup.objects.create(gpu=gpu, resolution=60, t=t, samples=6)
        GpuRollup.objects.create(gpu=gpu, resolution=3600, t=t, samples=360)
    rollups.prune()
    assert sorted(GpuRollup.objects.values_list("resolution", "t")) == [
        (60, now - timedelta(days=0.5)), (3600, now - timedelta(days=1.5)), (3600, now - timedelta(days=0.5))]


def test_prune_is_skipped_while_another_run_holds_its_lock(db, round_lock):
    tasks._redis().set(tasks.PRUNE_LOCK, "someone", ex=30)
    assert tasks.prune_samples() == {"ok": False, "skipped": "another rollup run is in progress"}
