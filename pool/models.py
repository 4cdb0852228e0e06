"""The compute side: pools of hosts and their GPUs, what the hosts report over time, and
why their states changed. Hosts are linked to the fabric's adapters by host name (the
adapter description without its device name); agent reports confirm or repair the link.

Current values live on Host and Gpu rows (one UPDATE per poll round); history lives in
GpuSample/HostSample (raw, SAMPLE_RETENTION_HOURS) and GpuRollup/HostRollup (1 min and
1 h averages and maxima, kept for days) so that a week of charts stays cheap.
"""
import re

from django.conf import settings
from django.db import models
from django.utils import timezone

from fabric.models import ChannelAdapter, Fabric, Site

# FP64 throughput class by model token (the word of the GPU name that names the chip).
# Settings.GPU_FP64_CLASSES adds to or overrides this table: {"A6000": "low", ...}.
FP64_CLASSES = {
    **dict.fromkeys(
        ["P100", "V100", "A100", "A800", "A30", "H100", "H800", "H200", "GH200", "B100", "B200", "GB200",
         "GB300", "B300", "MI50", "MI60", "MI100", "MI210", "MI250", "MI250X", "MI300", "MI300A", "MI300X",
         "MI325X", "MI355X"],
        "high",
    ),
    **dict.fromkeys(
        ["T4", "L4", "L40", "L40S", "L20", "A2", "A10", "A10G", "A16", "A40", "A4000", "A5000", "A6000", "H20",
         "P4", "P40", "RTX", "GEFORCE", "QUADRO"],
        "low",
    ),
}


def fp64_class_for(model_name: str) -> str:
    """"high", "low" or "unknown" for a GPU model name such as "NVIDIA H100 80GB HBM3",
    "NVIDIA A100-SXM4-80GB", "Tesla T4" or "AMD Instinct MI300X"."""
    table = {**FP64_CLASSES, **{k.upper(): v for k, v in getattr(settings, "GPU_FP64_CLASSES", {}).items()}}
    for token in re.split(r"[^A-Za-z0-9]+", model_name.upper()):
        if token in table:
            return table[token]
    return "unknown"


class Pool(models.Model):
    name = models.SlugField(max_length=64, unique=True)
    description = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name

    # Computed, not stored: a pool's GPU models and sites follow its hosts.
    @property
    def gpu_models(self) -> list[str]:
        return sorted(set(Gpu.objects.filter(host__pool=self, present=True).exclude(model="").values_list("model", flat=True)))

    @property
    def sites(self) -> list[str]:
        return sorted(set(Site.objects.filter(hosts__pool=self).values_list("name", flat=True)))

    @property
    def gpu_count(self) -> int:
        return Gpu.objects.filter(host__pool=self, present=True).count()


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
        NODE_EXPORTER = "node_exporter", "node_exporter"
        NONE = "none", "no agent"

    # States an operator sets; polling never changes them (it still records telemetry).
    OPERATOR_STATES = (State.DRAINING, State.DOWN)

    name = models.CharField(max_length=200, unique=True)
    site = models.ForeignKey(Site, null=True, blank=True, on_delete=models.PROTECT, related_name="hosts")
    fabric = models.ForeignKey(Fabric, null=True, blank=True, on_delete=models.SET_NULL, related_name="hosts")
    pool = models.ForeignKey(Pool, null=True, blank=True, on_delete=models.SET_NULL, related_name="hosts")
    adapters = models.ManyToManyField(ChannelAdapter, blank=True, related_name="hosts")
    state = models.CharField(max_length=12, choices=State.choices, default=State.NEW, db_index=True)
    state_changed_at = models.DateTimeField(null=True, blank=True, editable=False)
    agent_url = models.CharField(
        max_length=300, blank=True,
        help_text="FabricPool agent: its base URL (the report is at /v1/report). dcgm-exporter or "
                  "node_exporter: the full metrics URL, e.g. http://host:9400/metrics.",
    )
    agent_kind = models.CharField(max_length=16, choices=AgentKind.choices, default=AgentKind.FABRICPOOL)
    ib_metrics_url = models.CharField(
        "IB metrics URL", max_length=300, blank=True,
        help_text="Optional node_exporter metrics URL read for InfiniBand ports when the agent is dcgm-exporter.",
    )
    labels = models.JSONField(default=dict, blank=True)
    last_report_at = models.DateTimeField(null=True, blank=True)
    agent_version = models.CharField(max_length=40, blank=True)
    in_fabric = models.BooleanField(default=True, help_text="False when discovery no longer finds its adapters.")
    created_at = models.DateTimeField(default=timezone.now)

    # Written by polling, not by people (editable=False keeps them out of forms).
    # Poll bookkeeping: consecutive rounds without a good report, and the last reason.
    missed_rounds = models.PositiveIntegerField(default=0, editable=False)
    last_error = models.TextField(blank=True, editable=False)
    last_error_at = models.DateTimeField(null=True, blank=True, editable=False)

    # Current values from the latest report.
    cpu_percent = models.FloatField(null=True, blank=True, editable=False)
    cpu_count = models.PositiveIntegerField(null=True, blank=True, editable=False)
    load1 = models.FloatField(null=True, blank=True, editable=False)
    memory_total_mib = models.FloatField(null=True, blank=True, editable=False)
    memory_used_mib = models.FloatField(null=True, blank=True, editable=False)
    ib_tx_bytes_per_s = models.FloatField(null=True, blank=True, editable=False)
    ib_rx_bytes_per_s = models.FloatField(null=True, blank=True, editable=False)
    # [{device, port, node_guid, state, phys_state, rate_gbps, link_layer, lid, tx_bytes_per_s, rx_bytes_per_s}]
    ib_ports = models.JSONField(default=list, blank=True, editable=False)
    # {"mlx5_0/1": [agent time, xmit bytes, rcv bytes]}: the previous reading, for throughput.
    ib_counters = models.JSONField(default=dict, blank=True, editable=False)

    class Meta:
        ordering = ["name"]
        permissions = [("drain_host", "Can drain and undrain hosts")]

    def __str__(self):
        return self.name

    @property
    def can_run_work(self) -> bool:
        """Only the FabricPool agent starts work; exporters only report telemetry."""
        return self.agent_kind == self.AgentKind.FABRICPOOL

    @property
    def offers_gpus(self) -> bool:
        """Whether its free GPUs may be offered to new work now."""
        return self.can_run_work and self.state == self.State.UP


class Gpu(models.Model):
    class Fp64(models.TextChoices):
        HIGH = "high"
        LOW = "low"
        UNKNOWN = "unknown"

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=80, blank=True, db_index=True)
    model = models.CharField(max_length=80, blank=True)
    memory_mib = models.PositiveIntegerField(default=0, help_text="Total memory.")
    nearest_hca = models.CharField(max_length=40, blank=True, help_text="Device name such as mlx5_0, for NCCL_IB_HCA.")
    compute_capability = models.CharField(max_length=10, blank=True)
    fp64_class = models.CharField("FP64 class", max_length=8, choices=Fp64.choices, default=Fp64.UNKNOWN)
    mig_mode = models.BooleanField(default=False)
    mig_instances = models.JSONField(default=list, blank=True)
    numa_node = models.IntegerField(null=True, blank=True)
    pci_bus_id = models.CharField(max_length=40, blank=True)
    present = models.BooleanField(default=True, help_text="False when the host's latest report did not list it.")
    # Work the scheduler does not know (started by hand, another scheduler) was reported on
    # it: the scheduler offers it to no job until then (scheduler.reconcile sets it on each report).
    foreign_busy_until = models.DateTimeField(null=True, blank=True, editable=False)

    # Current values from the latest report.
    utilization = models.FloatField(null=True, blank=True)
    memory_used_mib = models.PositiveIntegerField(null=True, blank=True)
    temperature_c = models.FloatField(null=True, blank=True, editable=False)
    power_w = models.FloatField(null=True, blank=True, editable=False)
    power_limit_w = models.FloatField(null=True, blank=True, editable=False)
    ecc_corrected = models.BigIntegerField(null=True, blank=True, editable=False)
    ecc_uncorrected = models.BigIntegerField(null=True, blank=True, editable=False)
    updated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["host", "index"]
        constraints = [models.UniqueConstraint(fields=["host", "index"], name="gpu_unique_index_per_host")]

    def __str__(self):
        return f"{self.host.name}/gpu{self.index}"

    def save(self, *args, **kwargs):
        # Derived from the model name (the table is the override); bulk writers set it too.
        self.fp64_class = fp64_class_for(self.model)
        super().save(*args, **kwargs)


class GpuSample(models.Model):
    """One GPU's numbers at one poll. Written in bulk, read by time range."""

    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="samples", db_index=False)
    t = models.DateTimeField()
    utilization = models.FloatField(null=True)
    memory_used_mib = models.FloatField(null=True)
    temperature_c = models.FloatField(null=True)
    power_w = models.FloatField(null=True)

    class Meta:
        indexes = [models.Index(fields=["gpu", "t"], name="gpusample_gpu_t"), models.Index(fields=["t"], name="gpusample_t")]


class HostSample(models.Model):
    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="samples", db_index=False)
    t = models.DateTimeField()
    cpu_percent = models.FloatField(null=True)
    memory_used_mib = models.FloatField(null=True)
    ib_tx_bytes_per_s = models.FloatField(null=True)
    ib_rx_bytes_per_s = models.FloatField(null=True)

    class Meta:
        indexes = [models.Index(fields=["host", "t"], name="hostsample_host_t"), models.Index(fields=["t"], name="hostsample_t")]


class Resolution(models.IntegerChoices):
    MINUTE = 60, "1 min"
    HOUR = 3600, "1 h"


class GpuRollup(models.Model):
    """Average and maximum of a GPU's samples over [t, t + resolution)."""

    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="rollups", db_index=False)
    resolution = models.PositiveIntegerField(choices=Resolution.choices)
    t = models.DateTimeField()
    samples = models.PositiveIntegerField()
    utilization_avg = models.FloatField(null=True)
    utilization_max = models.FloatField(null=True)
    memory_used_mib_avg = models.FloatField(null=True)
    memory_used_mib_max = models.FloatField(null=True)
    temperature_c_avg = models.FloatField(null=True)
    temperature_c_max = models.FloatField(null=True)
    power_w_avg = models.FloatField(null=True)
    power_w_max = models.FloatField(null=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["gpu", "resolution", "t"], name="gpurollup_unique_bucket")]
        indexes = [models.Index(fields=["resolution", "t"], name="gpurollup_resolution_t")]


class HostRollup(models.Model):
    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="rollups", db_index=False)
    resolution = models.PositiveIntegerField(choices=Resolution.choices)
    t = models.DateTimeField()
    samples = models.PositiveIntegerField()
    cpu_percent_avg = models.FloatField(null=True)
    cpu_percent_max = models.FloatField(null=True)
    memory_used_mib_avg = models.FloatField(null=True)
    memory_used_mib_max = models.FloatField(null=True)
    ib_tx_bytes_per_s_avg = models.FloatField(null=True)
    ib_tx_bytes_per_s_max = models.FloatField(null=True)
    ib_rx_bytes_per_s_avg = models.FloatField(null=True)
    ib_rx_bytes_per_s_max = models.FloatField(null=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["host", "resolution", "t"], name="hostrollup_unique_bucket")]
        indexes = [models.Index(fields=["resolution", "t"], name="hostrollup_resolution_t")]


class HostEvent(models.Model):
    """Why a host is what it is: state changes, report errors, ECC errors, registration."""

    class Kind(models.TextChoices):
        REGISTERED = "registered"
        STATE_CHANGED = "state_changed", "state changed"
        REPORT_ERROR = "report_error", "report error"
        ECC = "ecc", "ECC errors"
        GPU_ADDED = "gpu_added", "GPU added"
        GPU_MISSING = "gpu_missing", "GPU missing"
        GPU_CHANGED = "gpu_changed", "GPU changed"
        ADAPTER_LINKED = "adapter_linked", "adapter linked"
        VANISHED = "vanished", "left the fabric"
        RETURNED = "returned", "back in the fabric"
        DRAINED = "drained"
        UNDRAINED = "undrained"

    class Severity(models.TextChoices):
        INFO = "info"
        WARNING = "warning"
        ERROR = "error"

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=20, choices=Kind.choices)
    severity = models.CharField(max_length=8, choices=Severity.choices, default=Severity.INFO)
    message = models.CharField(max_length=500)
    data = models.JSONField(default=dict, blank=True)
    actor = models.CharField(max_length=150, blank=True, help_text="The user who acted; empty for the system.")
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["host", "-created_at"], name="hostevent_host_created")]

    def __str__(self):
        return f"{self.host.name}: {self.message}"


class PollRound(models.Model):
    """One poll round: its chunks update the counters as they finish; the last one closes it."""

    started_at = models.DateTimeField(default=timezone.now, db_index=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    hosts = models.PositiveIntegerField(default=0)
    chunks = models.PositiveIntegerField(default=0)
    chunks_done = models.PositiveIntegerField(default=0)
    hosts_ok = models.PositiveIntegerField(default=0)
    hosts_error = models.PositiveIntegerField(default=0)
    gpu_samples = models.PositiveIntegerField(default=0)
    duration_s = models.FloatField(null=True, blank=True)
    overran = models.BooleanField(default=False, help_text="Took longer than POLL_INTERVAL.")
    abandoned = models.BooleanField(default=False, help_text="Never finished (a worker died or its chunks expired).")

    class Meta:
        ordering = ["-started_at", "-id"]

    def __str__(self):
        return f"poll round {self.pk} at {self.started_at:%Y-%m-%d %H:%M:%S}"
