"""The InfiniBand fabric as ibnetdiscover describes it: switches, channel adapters, their
ports and the cables between ports. Rows are never deleted by discovery: what vanishes is
marked missing, so history and the events that explain it stay."""
import string

from django.db import models
from django.db.models import Q
from django.utils import timezone

from .ibnetdiscover import LANE_GBPS, WIDTHS
from .tiers import TIERS


def guid_hex(guid: int) -> str:
    """GUIDs are 64-bit unsigned (too big for a signed bigint): stored as 16 lowercase hex
    digits, so that equal numbers are equal strings whatever padding the file used."""
    return f"{guid:016x}"


def normalize_guid(text: str) -> str | None:
    """`0x2c903007b78b0`, `0002c903007b78b0` or `00:02:c9:...` -> the stored form (16
    lowercase hex digits); None when the text is not a GUID."""
    value = text.strip().lower().replace(":", "")
    if value.startswith("0x"):
        value = value[2:]
    if not 1 <= len(value) <= 16 or any(c not in string.hexdigits for c in value):
        return None
    return value.rjust(16, "0")


class FabricNameError(ValueError):
    pass


def validate_fabric_name(name: str) -> str:
    """Fabric names appear in URLs, Slurm files and commands: letters, digits, - and _."""
    if not name or len(name) > 64 or not all(c.isascii() and (c.isalnum() or c in "-_") for c in name):
        raise FabricNameError(f"fabric name {name!r} must be 1-64 letters, digits, '-' or '_'")
    return name


class Site(models.Model):
    name = models.SlugField(max_length=64, unique=True)
    description = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name


class InterSiteLink(models.Model):
    """A wide-area link between two sites: what a job placed away from home pays in latency
    and bandwidth. One row per unordered pair (site_a < site_b by name, enforced in clean)."""

    site_a = models.ForeignKey(Site, on_delete=models.CASCADE, related_name="+")
    site_b = models.ForeignKey(Site, on_delete=models.CASCADE, related_name="+")
    latency_ms = models.FloatField(help_text="One-way latency in milliseconds.")
    bandwidth_gbps = models.FloatField(help_text="Usable bandwidth in Gb/s.")
    healthy = models.BooleanField(default=True)

    class Meta:
        ordering = ["site_a__name", "site_b__name"]
        constraints = [
            models.UniqueConstraint(fields=["site_a", "site_b"], name="intersitelink_unique_pair"),
            models.CheckConstraint(condition=~Q(site_a=models.F("site_b")), name="intersitelink_two_sites"),
        ]

    def __str__(self):
        return f"{self.site_a} ↔ {self.site_b} ({self.latency_ms:g} ms, {self.bandwidth_gbps:g} Gb/s)"


class Fabric(models.Model):
    """One InfiniBand subnet. A site may have several."""

    name = models.SlugField(max_length=64, unique=True)
    site = models.ForeignKey(Site, null=True, blank=True, on_delete=models.PROTECT, related_name="fabrics")
    description = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    last_import_at = models.DateTimeField(null=True, blank=True)
    last_import_source = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name


class Node(models.Model):
    fabric = models.ForeignKey(Fabric, on_delete=models.CASCADE, related_name="+")
    guid = models.CharField("node GUID", max_length=16, db_index=True)
    system_image_guid = models.CharField(max_length=16, blank=True)
    description = models.CharField(max_length=200, db_index=True)
    vendor_id = models.PositiveIntegerField(null=True, blank=True)
    device_id = models.PositiveIntegerField(null=True, blank=True)
    num_ports = models.PositiveSmallIntegerField(default=0)
    present = models.BooleanField(default=True, help_text="Seen in the latest discovery.")
    first_seen = models.DateTimeField(default=timezone.now)
    last_seen = models.DateTimeField(default=timezone.now)

    class Meta:
        abstract = True

    @property
    def guid_display(self):
        return f"0x{self.guid}"


class Switch(Node):
    class Tier(models.TextChoices):
        LEAF = "leaf"
        SPINE = "spine"
        CORE = "core"
        UNKNOWN = "unknown"

    fabric = models.ForeignKey(Fabric, on_delete=models.CASCADE, related_name="switches")
    lid = models.PositiveIntegerField(null=True, blank=True)
    lmc = models.PositiveSmallIntegerField(null=True, blank=True)
    enhanced_port0 = models.BooleanField(null=True, blank=True)
    tier = models.CharField(max_length=8, choices=Tier.choices, default=Tier.UNKNOWN, db_index=True)

    class Meta:
        ordering = ["fabric", "description"]
        verbose_name_plural = "switches"
        constraints = [models.UniqueConstraint(fields=["fabric", "guid"], name="switch_unique_guid_per_fabric")]

    def __str__(self):
        return f"{self.description} ({self.guid_display})"


assert set(Switch.Tier.values) == set(TIERS)


class ChannelAdapter(Node):
    """An HCA function (or a router) as the fabric sees it. `host_name` is derived from the
    description (`gpu001 mlx5_0` -> `gpu001`); the pool app links its hosts through it."""

    class Kind(models.TextChoices):
        CA = "ca", "channel adapter"
        ROUTER = "router"

    fabric = models.ForeignKey(Fabric, on_delete=models.CASCADE, related_name="adapters")
    kind = models.CharField(max_length=8, choices=Kind.choices, default=Kind.CA)
    host_name = models.CharField(max_length=200, blank=True, db_index=True)
    is_aggregation_node = models.BooleanField(default=False, help_text="SHARP aggregation node inside a switch.")

    class Meta:
        ordering = ["fabric", "description"]
        constraints = [models.UniqueConstraint(fields=["fabric", "guid"], name="adapter_unique_guid_per_fabric")]

    def __str__(self):
        return f"{self.description} ({self.guid_display})"


class Port(models.Model):
    """A numbered port of a switch or an adapter: exactly one owner."""

    class State(models.TextChoices):
        ACTIVE = "active"
        DOWN = "down"
        UNKNOWN = "unknown"

    fabric = models.ForeignKey(Fabric, on_delete=models.CASCADE, related_name="ports")
    switch = models.ForeignKey(Switch, null=True, blank=True, on_delete=models.CASCADE, related_name="ports")
    adapter = models.ForeignKey(ChannelAdapter, null=True, blank=True, on_delete=models.CASCADE, related_name="ports")
    number = models.PositiveSmallIntegerField()
    guid = models.CharField("port GUID", max_length=16, blank=True, db_index=True)
    lid = models.PositiveIntegerField(null=True, blank=True)
    state = models.CharField(max_length=8, choices=State.choices, default=State.ACTIVE)

    class Meta:
        ordering = ["fabric", "switch", "adapter", "number"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(switch__isnull=False, adapter__isnull=True)
                | models.Q(switch__isnull=True, adapter__isnull=False),
                name="port_has_exactly_one_owner",
            ),
            models.UniqueConstraint(fields=["switch", "number"], name="switch_port_unique"),
            models.UniqueConstraint(fields=["adapter", "number"], name="adapter_port_unique"),
        ]

    @property
    def owner(self):
        return self.switch if self.switch_id else self.adapter

    def __str__(self):
        owner = self.owner
        return f"{owner.description if owner else '?'}[{self.number}]"


class Link(models.Model):
    """One cable between two ports. `key` identifies it across imports whatever end the
    file names first. A link whose far end never appeared as a node is `dangling`: its
    `port_b` is empty and the far end is described by the remote_* fields."""

    class State(models.TextChoices):
        UP = "up"
        DEGRADED = "degraded"
        DOWN = "down"
        MISSING = "missing"

    class Kind(models.TextChoices):
        SWITCH_SWITCH = "switch_switch", "switch-switch"
        ADAPTER_SWITCH = "adapter_switch", "adapter-switch"
        ADAPTER_ADAPTER = "adapter_adapter", "adapter-adapter"
        LOOPBACK = "loopback", "loopback (same switch)"
        DANGLING = "dangling", "dangling (far end unknown)"

    Width = models.TextChoices("Width", [(w, w) for w in WIDTHS])
    Speed = models.TextChoices("Speed", [(s, s) for s in LANE_GBPS])

    fabric = models.ForeignKey(Fabric, on_delete=models.CASCADE, related_name="links")
    key = models.CharField(max_length=80)
    kind = models.CharField(max_length=16, choices=Kind.choices, db_index=True)
    port_a = models.ForeignKey(Port, on_delete=models.CASCADE, related_name="links_as_a")
    port_b = models.ForeignKey(Port, null=True, blank=True, on_delete=models.CASCADE, related_name="links_as_b")
    remote_guid = models.CharField(max_length=16, blank=True)
    remote_port = models.PositiveSmallIntegerField(null=True, blank=True)
    remote_description = models.CharField(max_length=200, blank=True)
    width = models.CharField(max_length=4, choices=Width.choices, blank=True)
    speed = models.CharField(max_length=6, choices=Speed.choices, blank=True)
    gbps = models.FloatField("Gb/s", null=True, blank=True, help_text="lanes × per-lane data rate")
    state = models.CharField(max_length=8, choices=State.choices, default=State.UP, db_index=True)
    state_reason = models.CharField(max_length=300, blank=True)
    first_seen = models.DateTimeField(default=timezone.now)
    last_seen = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["fabric", "key"]
        constraints = [models.UniqueConstraint(fields=["fabric", "key"], name="link_unique_key_per_fabric")]

    def __str__(self):
        far = str(self.port_b) if self.port_b_id else f"0x{self.remote_guid}[{self.remote_port}]"
        return f"{self.port_a} ↔ {far} {self.width}{self.speed}"


class PortCounters(models.Model):
    """The latest error and traffic counters read from one port, and the rates computed
    against the reading before. One row per port, overwritten on each read."""

    port = models.OneToOneField(Port, on_delete=models.CASCADE, related_name="counters")
    read_at = models.DateTimeField()
    values = models.JSONField(default=dict)
    error_rate_per_hour = models.JSONField(default=dict, help_text="errors/hour per counter since the previous read")

    class Meta:
        verbose_name_plural = "port counters"


class FabricEvent(models.Model):
    class Kind(models.TextChoices):
        SWITCH_ADDED = "switch_added"
        SWITCH_MISSING = "switch_missing"
        SWITCH_CHANGED = "switch_changed"
        SWITCH_RETURNED = "switch_returned"
        ADAPTER_ADDED = "adapter_added"
        ADAPTER_MISSING = "adapter_missing"
        ADAPTER_CHANGED = "adapter_changed"
        ADAPTER_RETURNED = "adapter_returned"
        LINK_ADDED = "link_added"
        LINK_MISSING = "link_missing"
        LINK_CHANGED = "link_changed"
        LINK_RETURNED = "link_returned"
        LINK_DEGRADED = "link_degraded"
        LINK_DOWN = "link_down"
        LINK_HEALTHY = "link_healthy"
        IMPORT_WARNING = "import_warning"
        DISCOVERY_FAILED = "discovery_failed"
        HEALTH_CHECK_FAILED = "health_check_failed"

    class Severity(models.TextChoices):
        INFO = "info"
        WARNING = "warning"
        ERROR = "error"

    fabric = models.ForeignKey(Fabric, on_delete=models.CASCADE, related_name="events")
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    kind = models.CharField(max_length=24, choices=Kind.choices, db_index=True)
    severity = models.CharField(max_length=8, choices=Severity.choices, default=Severity.INFO)
    message = models.CharField(max_length=500)
    link = models.ForeignKey(Link, null=True, blank=True, on_delete=models.SET_NULL, related_name="events")
    switch = models.ForeignKey(Switch, null=True, blank=True, on_delete=models.SET_NULL, related_name="events")
    adapter = models.ForeignKey(ChannelAdapter, null=True, blank=True, on_delete=models.SET_NULL, related_name="events")
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self):
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.kind}: {self.message}"
