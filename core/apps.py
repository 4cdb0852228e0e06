from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "core"
    verbose_name = "FabricPool core"

    def ready(self):
        from django.db.models.signals import post_migrate

        from .roles import sync_roles_after_migrate

        post_migrate.connect(sync_roles_after_migrate, sender=self)

        from . import live_receivers

        live_receivers.connect()  # live views publish after polls, cycles, decisions, imports
