"""Rollups and retention of the telemetry samples.

Raw samples (every poll) are kept SAMPLE_RETENTION_HOURS (default 24). Before they go,
each complete minute is rolled up into GpuRollup/HostRollup rows (average and maximum per
metric) at 60 s resolution, kept ROLLUP_1M_RETENTION_DAYS (default 7), and each complete
hour of those into 3600 s rows, kept ROLLUP_1H_RETENTION_DAYS (default 90).

Each rollup is one INSERT ... SELECT ... GROUP BY in the database (upsert, so running it
twice over the same minutes gives the same rows), resuming after the newest rollup row.
Only minutes that ended ROLLUP_DELAY ago are rolled up, so that a poll chunk still being
written is not cut in half.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Max, Min
from django.utils import timezone

from . import bulk
from .models import GpuRollup, GpuSample, HostRollup, HostSample, Resolution

ROLLUP_DELAY = timedelta(seconds=90)
MAX_BUCKETS_PER_RUN = {Resolution.MINUTE: 6 * 60, Resolution.HOUR: 7 * 24}  # catch up over several runs

# (sample model, rollup model, owner column, metrics)
SERIES = [
    (GpuSample, GpuRollup, "gpu_id", ["utilization", "memory_used_mib", "temperature_c", "power_w"]),
    (HostSample, HostRollup, "host_id", ["cpu_percent", "memory_used_mib", "ib_tx_bytes_per_s", "ib_rx_bytes_per_s"]),
]


@dataclass
class PruneResult:
    rolled_up: dict = field(default_factory=dict)  # "GpuRollup/60": buckets
    deleted: dict = field(default_factory=dict)  # "GpuSample": rows


def _floor(t: datetime, seconds: int) -> datetime:
    epoch = int(t.timestamp())
    return datetime.fromtimestamp(epoch - epoch % seconds, tz=t.tzinfo)


def _bucket(column: str, resolution: int) -> str:
    if connection.vendor == "postgresql":
        return f"date_trunc('{'minute' if resolution == Resolution.MINUTE else 'hour'}', {column})"
    if connection.vendor == "sqlite":
        # Django stores SQLite datetimes as 'YYYY-MM-DD HH:MM:SS[.ffffff]' (UTC)
        return f"(substr({column}, 1, 16) || ':00')" if resolution == Resolution.MINUTE else f"(substr({column}, 1, 13) || ':00:00')"
    raise NotImplementedError(f"rollups support PostgreSQL and SQLite, not {connection.vendor}")


def _rollup_sql(sample_model, rollup_model, owner: str, metrics: list[str], resolution: int) -> str:
    q = connection.ops.quote_name
    target = q(rollup_model._meta.db_table)
    columns = [owner, "resolution", "t", "samples"] + [f"{m}_{agg}" for m in metrics for agg in ("avg", "max")]
    if resolution == Resolution.MINUTE:
        source, where = q(sample_model._meta.db_table), "t >= %s AND t < %s"
        aggregates = ["COUNT(*)"] + [f"{agg}({q(m)})" for m in metrics for agg in ("AVG", "MAX")]
    else:  # hours from minutes: averages weighted by the samples behind them
        source, where = target, f"resolution = {int(Resolution.MINUTE)} AND t >= %s AND t < %s"
        aggregates = ["SUM(samples)"]
        for m in metrics:
            aggregates.append(f"SUM({q(m + '_avg')} * samples) / NULLIF(SUM(CASE WHEN {q(m + '_avg')} IS NULL THEN 0 ELSE samples END), 0)")
            aggregates.append(f"MAX({q(m + '_max')})")
    bucket = _bucket("t", resolution)
    updates = ", ".join(f"{q(c)} = excluded.{q(c)}" for c in columns[3:])
    return (
        f"INSERT INTO {target} ({', '.join(q(c) for c in columns)}) "
        f"SELECT {q(owner)}, {int(resolution)}, {bucket}, {', '.join(aggregates)} FROM {source} "
        f"WHERE {where} GROUP BY {q(owner)}, {bucket} "
        f"ON CONFLICT ({q(owner)}, {q('resolution')}, {q('t')}) DO UPDATE SET {updates}"
    )


def _window(sample_model, rollup_model, resolution: int, limit: datetime) -> tuple[datetime, datetime] | None:
    """[start, end) of the complete buckets not rolled up yet, at most MAX_BUCKETS_PER_RUN."""
    newest = rollup_model.objects.filter(resolution=resolution).aggregate(t=Max("t"))["t"]
    source = sample_model.objects if resolution == Resolution.MINUTE else rollup_model.objects.filter(resolution=Resolution.MINUTE)
    if newest is not None:
        source = source.filter(t__gte=newest + timedelta(seconds=resolution))
    # Start at the oldest data not rolled up yet: gaps (polling stopped for a day) are skipped.
    oldest = source.aggregate(t=Min("t"))["t"]
    if oldest is None:
        return None
    start = _floor(oldest, resolution)
    end = min(_floor(limit, resolution), start + timedelta(seconds=resolution * MAX_BUCKETS_PER_RUN[resolution]))
    return (start, end) if start < end else None


def rollup(now: datetime | None = None) -> dict:
    """Roll up the complete minutes, then the complete hours. Returns {"GpuRollup/60": [start, end], ...}."""
    now = now or timezone.now()
    done = {}
    for sample_model, rollup_model, owner, metrics in SERIES:
        for resolution in (Resolution.MINUTE, Resolution.HOUR):
            if resolution == Resolution.MINUTE:
                limit = now - ROLLUP_DELAY
            else:  # an hour is complete once its last minute is rolled up
                newest_minute = rollup_model.objects.filter(resolution=Resolution.MINUTE).aggregate(t=Max("t"))["t"]
                if newest_minute is None:
                    continue
                limit = newest_minute + timedelta(seconds=Resolution.MINUTE)
            window = _window(sample_model, rollup_model, resolution, limit)
            if window is None:
                continue
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(_rollup_sql(sample_model, rollup_model, owner, metrics, resolution),
                               [bulk.db_datetime(window[0]), bulk.db_datetime(window[1])])
            done[f"{rollup_model.__name__}/{int(resolution)}"] = [window[0].isoformat(), window[1].isoformat()]
    return done


def retention_cutoffs(now: datetime) -> dict:
    return {
        "samples": now - timedelta(hours=float(getattr(settings, "SAMPLE_RETENTION_HOURS", 24.0))),
        Resolution.MINUTE: now - timedelta(days=float(getattr(settings, "ROLLUP_1M_RETENTION_DAYS", 7.0))),
        Resolution.HOUR: now - timedelta(days=float(getattr(settings, "ROLLUP_1H_RETENTION_DAYS", 90.0))),
    }


def prune(now: datetime | None = None) -> PruneResult:
    """Roll up what is due, then delete what is past its retention (samples are deleted
    only once rolled up, so a stopped rollup never loses data to retention)."""
    now = now or timezone.now()
    result = PruneResult(rolled_up=rollup(now))
    cutoffs = retention_cutoffs(now)
    for sample_model, rollup_model, _, _ in SERIES:
        newest_minute = rollup_model.objects.filter(resolution=Resolution.MINUTE).aggregate(t=Max("t"))["t"]
        sample_cutoff = cutoffs["samples"]
        if newest_minute is None or newest_minute < sample_cutoff:
            # keep what has not been rolled up yet
            sample_cutoff = min(sample_cutoff, newest_minute + timedelta(seconds=60)) if newest_minute else None
        if sample_cutoff is not None:
            result.deleted[sample_model.__name__] = sample_model.objects.filter(t__lt=sample_cutoff).delete()[0]
        newest_hour = rollup_model.objects.filter(resolution=Resolution.HOUR).aggregate(t=Max("t"))["t"]
        minute_cutoff = cutoffs[Resolution.MINUTE]
        if newest_hour is None or newest_hour < minute_cutoff:
            minute_cutoff = min(minute_cutoff, newest_hour + timedelta(hours=1)) if newest_hour else None
        deleted = 0
        if minute_cutoff is not None:
            deleted += rollup_model.objects.filter(resolution=Resolution.MINUTE, t__lt=minute_cutoff).delete()[0]
        deleted += rollup_model.objects.filter(resolution=Resolution.HOUR, t__lt=cutoffs[Resolution.HOUR]).delete()[0]
        result.deleted[rollup_model.__name__] = deleted
    return result
