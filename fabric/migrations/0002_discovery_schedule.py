"""The periodic discovery and link-health jobs, as django-celery-beat rows. They exist
disabled: an operator enables them in Django admin once IB_DISCOVER_COMMAND and friends
point at a host with an HCA (or at a simulator)."""
from django.db import migrations

from core.periodic import PeriodicJob, creator, remover

DISABLED = "Created by FabricPool, disabled until configured: enable it here once the IB_* commands are set."
JOBS = [
    PeriodicJob("fabric: discover", "fabric.tasks.discover_fabric", 5, "minutes", enabled=False, description=DISABLED),
    PeriodicJob("fabric: link health", "fabric.tasks.check_link_health", 60, "seconds", enabled=False, description=DISABLED),
]


class Migration(migrations.Migration):
    dependencies = [
        ("fabric", "0001_initial"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(creator(JOBS), remover(JOBS))]
