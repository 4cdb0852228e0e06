from django.apps import AppConfig


class FabricConfig(AppConfig):
    name = "fabric"
    verbose_name = "Fabric"
