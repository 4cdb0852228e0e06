"""The periodic allocation cycle as a django-celery-beat row, enabled. The interval is
CYCLE_INTERVAL at migrate time; operators change it in Django admin. Each message expires
after one interval, so a backlog never runs stale cycles (the next tick does the work)."""
from django.conf import settings
from django.db import migrations

from core.periodic import PeriodicJob, creator, remover


def jobs():
    every = max(1, round(float(getattr(settings, "CYCLE_INTERVAL", 5))))
    return [PeriodicJob("scheduler: allocation cycle", "scheduler.tasks.allocation_cycle", every, "seconds", expire_seconds=every)]


class Migration(migrations.Migration):
    dependencies = [
        ("scheduler", "0001_initial"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(creator(jobs), remover(jobs))]
