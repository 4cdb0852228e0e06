"""The periodic discovery and link-health jobs, as django-celery-beat rows. They exist
disabled: an operator enables them in Django admin once IB_DISCOVER_COMMAND and friends
point at a host with an HCA (or at a simulator)."""
from django.db import migrations

JOBS = [
    # (name, task, every, period)
    ("fabric: discover", "fabric.tasks.discover_fabric", 5, "minutes"),
    ("fabric: link health", "fabric.tasks.check_link_health", 60, "seconds"),
]


def create_jobs(apps, schema_editor):
    IntervalSchedule = apps.get_model("django_celery_beat", "IntervalSchedule")
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    for name, task, every, period in JOBS:
        interval = IntervalSchedule.objects.filter(every=every, period=period).first()
        if interval is None:
            interval = IntervalSchedule.objects.create(every=every, period=period)
        PeriodicTask.objects.get_or_create(
            name=name,
            defaults={
                "task": task,
                "interval": interval,
                "enabled": False,
                "description": "Created by FabricPool, disabled until configured: enable it here once the IB_* commands are set.",
            },
        )


def remove_jobs(apps, schema_editor):
    IntervalSchedule = apps.get_model("django_celery_beat", "IntervalSchedule")
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    for name, task, every, period in JOBS:
        PeriodicTask.objects.filter(name=name, task=task).delete()
        # The interval may be shared with other jobs: only remove it when nothing uses it.
        IntervalSchedule.objects.filter(every=every, period=period, periodictask__isnull=True).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("fabric", "0001_initial"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(create_jobs, remove_jobs)]
