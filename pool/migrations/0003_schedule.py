"""The periodic poll round and rollup jobs, as django-celery-beat rows, enabled: polling
needs nothing configured (hosts without an agent URL are skipped). The poll interval is
POLL_INTERVAL at migrate time; operators change it in Django admin. Each poll message
expires after one interval, so a backlog never runs stale rounds."""
from django.conf import settings
from django.db import migrations


def jobs():
    every = max(1, round(float(getattr(settings, "POLL_INTERVAL", 10))))
    return [
        # (name, task, every, period, expire seconds)
        ("pool: poll round", "pool.tasks.poll_round", every, "seconds", every),
        ("pool: rollups and retention", "pool.tasks.prune_samples", 5, "minutes", 300),
    ]


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
        ("pool", "0002_telemetry"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(create_jobs, remove_jobs)]
