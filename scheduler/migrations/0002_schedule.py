"""The periodic allocation cycle as a django-celery-beat row, enabled. The interval is
CYCLE_INTERVAL at migrate time; operators change it in Django admin. Each message expires
after one interval, so a backlog never runs stale cycles (the next tick does the work)."""
from django.conf import settings
from django.db import migrations


def jobs():
    every = max(1, round(float(getattr(settings, "CYCLE_INTERVAL", 5))))
    return [("scheduler: allocation cycle", "scheduler.tasks.allocation_cycle", every, "seconds", every)]


def create_jobs(apps, schema_editor):
    IntervalSchedule = apps.get_model("django_celery_beat", "IntervalSchedule")
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    for name, task, every, period, expire in jobs():
        interval = IntervalSchedule.objects.filter(every=every, period=period).first()
        if interval is None:
            interval = IntervalSchedule.objects.create(every=every, period=period)
        PeriodicTask.objects.get_or_create(
            name=name,
            defaults={"task": task, "interval": interval, "enabled": True, "expire_seconds": expire,
                      "description": "Created by FabricPool."},
        )


def remove_jobs(apps, schema_editor):
    IntervalSchedule = apps.get_model("django_celery_beat", "IntervalSchedule")
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    for name, task, every, period, _ in jobs():
        PeriodicTask.objects.filter(name=name, task=task).delete()
        IntervalSchedule.objects.filter(every=every, period=period, periodictask__isnull=True).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("scheduler", "0001_initial"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(create_jobs, remove_jobs)]
