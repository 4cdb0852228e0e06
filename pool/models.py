"""The compute side: pools of hosts and their GPUs. Hosts are linked to the fabric's
adapters by host name (the adapter description without its device name)."""
from django.db import models
from django.utils import timezone

from fabric.models import ChannelAdapter, Fabric, Site


class Pool(models.Model):
    name = models.SlugField(max_length=64, unique=True)
    description = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name


class Host(models.Model):
    class State(models.TextChoices):
        UP = "up"
        STALE = "stale"
        UNREACHABLE = "unreachable"
        DRAINING = "draining"
        DOWN = "down"
        NEW = "new", "new (no report yet)"

    class AgentKind(models.TextChoices):
        FABRICPOOL = "fabricpool", "FabricPool agent"
        DCGM = "dcgm", "dcgm-exporter"
        NONE = "none", "no agent"

    name = models.CharField(max_length=200, unique=True)
    site = models.ForeignKey(Site, null=True, blank=True, on_delete=models.PROTECT, related_name="hosts")
    fabric = models.ForeignKey(Fabric, null=True, blank=True, on_delete=models.SET_NULL, related_name="hosts")
    pool = models.ForeignKey(Pool, null=True, blank=True, on_delete=models.SET_NULL, related_name="hosts")
    adapters = models.ManyToManyField(ChannelAdapter, blank=True, related_name="hosts")
    state = models.CharField(max_length=12, choices=State.choices, default=State.NEW, db_index=True)
    agent_url = models.CharField(max_length=300, blank=True)
    agent_kind = models.CharField(max_length=12, choices=AgentKind.choices, default=AgentKind.FABRICPOOL)
    labels = models.JSONField(default=dict, blank=True)
    last_report_at = models.DateTimeField(null=True, blank=True)
    agent_version = models.CharField(max_length=40, blank=True)
    in_fabric = models.BooleanField(default=True, help_text="False when discovery no longer finds its adapters.")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]
        permissions = [("drain_host", "Can drain and undrain hosts")]

    def __str__(self):
        return self.name


class Gpu(models.Model):
    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=80, blank=True, db_index=True)
    model = models.CharField(max_length=80, blank=True)
    memory_mib = models.PositiveIntegerField(default=0)
    nearest_hca = models.CharField(max_length=40, blank=True, help_text="Device name such as mlx5_0, for NCCL_IB_HCA.")
    utilization = models.FloatField(null=True, blank=True)
    memory_used_mib = models.PositiveIntegerField(null=True, blank=True)
    updated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["host", "index"]
        constraints = [models.UniqueConstraint(fields=["host", "index"], name="gpu_unique_index_per_host")]

    def __str__(self):
        return f"{self.host.name}/gpu{self.index}"
