from django.apps import AppConfig


class PoolConfig(AppConfig):
    name = "pool"
    verbose_name = "Pool"

    def ready(self):
        from fabric.signals import topology_imported

        from .signals import register_discovered_hosts

        topology_imported.connect(register_discovered_hosts, dispatch_uid="pool.register_discovered_hosts")
