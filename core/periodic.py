"""Periodic jobs as django-celery-beat rows, made by each app's data migration so that
operators change intervals in Django admin. Stable on purpose: migrations import it."""
from dataclasses import dataclass

CREATED_BY = "Created by FabricPool."


@dataclass(frozen=True)
class PeriodicJob:
    name: str
    task: str
    every: int
    period: str  # "seconds" | "minutes" | ...
    enabled: bool = True
    expire_seconds: int | None = None  # a message older than this is dropped, not run late
    description: str = CREATED_BY


def creator(jobs):
    """RunPython forward function creating `jobs` (a list, or a callable returning one,
    for intervals read from settings at migrate time); existing rows are left alone."""

    def create(apps, schema_editor):
        interval_model = apps.get_model("django_celery_beat", "IntervalSchedule")
        task_model = apps.get_model("django_celery_beat", "PeriodicTask")
        for job in jobs() if callable(jobs) else jobs:
            interval = interval_model.objects.filter(every=job.every, period=job.period).first()
            if interval is None:
                interval = interval_model.objects.create(every=job.every, period=job.period)
            task_model.objects.get_or_create(
                name=job.name,
                defaults={"task": job.task, "interval": interval, "enabled": job.enabled,
                          "expire_seconds": job.expire_seconds, "description": job.description},
            )

    return create


def remover(jobs):
    """RunPython reverse function: removes the rows, and intervals nothing else uses."""

    def remove(apps, schema_editor):
        interval_model = apps.get_model("django_celery_beat", "IntervalSchedule")
        task_model = apps.get_model("django_celery_beat", "PeriodicTask")
        for job in jobs() if callable(jobs) else jobs:
            task_model.objects.filter(name=job.name, task=job.task).delete()
            interval_model.objects.filter(every=job.every, period=job.period, periodictask__isnull=True).delete()

    return remove
