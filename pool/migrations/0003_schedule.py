"""The periodic poll round and rollup jobs, as django-celery-beat rows, enabled: polling
needs nothing configured (hosts without an agent URL are skipped). The poll interval is
POLL_INTERVAL at migrate time; operators change it in Django admin. Each poll message
expires after one interval, so a backlog never runs stale rounds."""
from django.conf import settings
from django.db import migrations

from core.periodic import PeriodicJob, creator, remover


def jobs():
    every = max(1, round(float(getattr(settings, "POLL_INTERVAL", 10))))
    return [
        PeriodicJob("pool: poll round", "pool.tasks.poll_round", every, "seconds", expire_seconds=every),
        PeriodicJob("pool: rollups and retention", "pool.tasks.prune_samples", 5, "minutes", expire_seconds=300),
    ]


class Migration(migrations.Migration):
    dependencies = [
        ("pool", "0002_telemetry"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(creator(jobs), remover(jobs))]
