"""The scheduler's records: who may use what (Tenant, TenantQuota, PoolPolicy), what is asked
for (Job), what was decided (Placement and its GPUs), when (AllocationCycle) and by whom
(AuditEvent).

The invariant "a GPU is in at most one active placement" is held by the database: a
partial unique index on PlacementGpu(gpu) WHERE active. `active` is True while the
placement is proposed, approved, dispatching or running, and set False in the same
transaction that ends it. A running placement whose job was cancelled keeps its GPUs
active (stop_requested_at set) until its agent confirms the work stopped: the process may
still be on them.
"""
from django.conf import settings
from django.db import models
from django.db.models import Q, Value
from django.utils import timezone

from pool.models import Gpu, Pool


class Tenant(models.Model):
    """A team. Usage is GPU-seconds decayed with USAGE_HALF_LIFE_HOURS (fair share)."""

    name = models.SlugField(max_length=64, unique=True)
    description = models.CharField(max_length=200, blank=True)
    usage_gpu_seconds = models.FloatField(default=0.0, editable=False)
    usage_updated_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name


class TenantQuota(models.Model):
    """GPUs of a pool that are the tenant's own (guaranteed), and how far it may borrow
    idle GPUs beyond them (limit; empty: no limit)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="quotas")
    pool = models.ForeignKey(Pool, on_delete=models.CASCADE, related_name="quotas")
    guaranteed_gpus = models.PositiveIntegerField(default=0)
    limit_gpus = models.PositiveIntegerField(null=True, blank=True, help_text="Empty: no limit.")

    class Meta:
        ordering = ["tenant__name", "pool__name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "pool"], name="tenantquota_unique_tenant_pool"),
            models.CheckConstraint(condition=Q(limit_gpus__isnull=True) | Q(limit_gpus__gte=models.F("guaranteed_gpus")),
                                   name="tenantquota_limit_at_least_guarantee"),
        ]

    def __str__(self):
        limit = "no limit" if self.limit_gpus is None else f"limit {self.limit_gpus}"
        return f"{self.tenant} in {self.pool}: {self.guaranteed_gpus} guaranteed, {limit}"


class PoolPolicy(models.Model):
    """When proposals in a pool wait for an operator. A pool without a row: auto-approve."""

    class Mode(models.TextChoices):
        AUTO = "auto", "approve automatically"
        MANUAL = "manual", "every proposal waits for an operator"
        THRESHOLD = "threshold", "operator above a GPU count"

    pool = models.OneToOneField(Pool, on_delete=models.CASCADE, related_name="policy")
    mode = models.CharField(max_length=10, choices=Mode.choices, default=Mode.AUTO)
    threshold_gpus = models.PositiveIntegerField(
        default=64, help_text="Threshold mode: proposals for more GPUs than this wait for an operator.")
    manual_when_crossing_spines = models.BooleanField(
        default=False, help_text="Proposals that span more than one pod (spine group) wait for an operator.")
    manual_for_overrides = models.BooleanField(default=False, help_text="An override waits for a second decision.")
    manual_for_preemptions = models.BooleanField(default=True)

    class Meta:
        verbose_name_plural = "pool policies"

    def __str__(self):
        return f"{self.pool}: {self.get_mode_display()}"


class Job(models.Model):
    class State(models.TextChoices):
        PENDING = "pending"
        PROPOSED = "proposed"
        APPROVED = "approved"
        DISPATCHING = "dispatching"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"
        PREEMPTED = "preempted"

    class TaskClass(models.TextChoices):
        TRAINING = "training"
        INFERENCE = "inference"
        SIMULATION = "simulation"
        SCIENCE = "science"
        RENDERING = "rendering"

    class Fp64(models.TextChoices):
        ANY = "", "any"
        HIGH = "high"
        LOW = "low"

    FINAL_STATES = (State.SUCCEEDED, State.FAILED, State.CANCELLED)
    # States in which the job holds (or is about to hold) GPUs through an active placement.
    PLACED_STATES = (State.PROPOSED, State.APPROVED, State.DISPATCHING, State.RUNNING)

    name = models.CharField(max_length=200, blank=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="jobs")
    pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="jobs")
    gpus = models.PositiveIntegerField()
    # Constraints.
    gpu_models = models.JSONField(default=list, blank=True, help_text='Any of these models, e.g. ["H100", "A100"].')
    min_memory_mib = models.PositiveIntegerField(default=0)
    fp64 = models.CharField("FP64 class", max_length=8, choices=Fp64.choices, default=Fp64.ANY, blank=True)
    site = models.CharField(max_length=100, blank=True)
    task_class = models.CharField(max_length=12, choices=TaskClass.choices, default=TaskClass.TRAINING)
    priority = models.IntegerField(default=0, help_text="Higher first.")
    gang = models.BooleanField(default=True, help_text="All GPUs at once.")
    whole_hosts = models.BooleanField(default=True, help_text="A job larger than one host takes whole hosts.")
    estimated_runtime_s = models.PositiveIntegerField(null=True, blank=True)
    max_runtime_s = models.PositiveIntegerField(null=True, blank=True)
    preemptible = models.BooleanField(default=False)
    restartable = models.BooleanField(default=False, db_default=False, help_text="May be stopped and restarted elsewhere (rebalancing).")
    grace_period_s = models.PositiveIntegerField(default=30, db_default=30, help_text="Preemption: SIGTERM, then stop after this.")
    preemption_count = models.PositiveIntegerField(default=0, db_default=0, editable=False)
    allow_remote_site = models.BooleanField(default=False, db_default=False,
                                            help_text="May run at another site when its own cannot start it in time.")
    # GPU sharing (gpus must be 1): a share of one GPU in thousandths and/or the GPU memory it
    # needs, or a MIG profile. All zero/empty: whole GPUs.
    gpu_milli = models.PositiveIntegerField(default=0, db_default=0, help_text="Share of one GPU in thousandths (1-999); 0: whole GPUs.")
    gpu_memory_mib = models.PositiveIntegerField(default=0, db_default=0, help_text="GPU memory a shared job needs, MiB.")
    mig_profile = models.CharField(max_length=20, blank=True, db_default="", help_text='MIG profile, e.g. "1g.10gb".')
    # Topology requirement, like Slurm's --switches=N@wait.
    max_leaves = models.PositiveIntegerField(null=True, blank=True, help_text="At most this many leaf switches.")
    topology_hard = models.BooleanField(default=False, help_text="Never relax the leaf limit.")
    max_wait_s = models.PositiveIntegerField(default=0, help_text="A soft leaf limit is dropped after this wait.")
    # What the agent runs.
    command = models.JSONField(default=list, help_text="argv")
    env = models.JSONField(default=dict, blank=True)
    submitted_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="submitted_jobs")

    # Indexed by (state, pool) below; every index is paid for on each cycle's bulk writes.
    state = models.CharField(max_length=12, choices=State.choices, default=State.PENDING)
    state_changed_at = models.DateTimeField(default=timezone.now)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Why a pending job waits (engine reason codes, scheduler.engine.REASONS, or
    # "rejected"/"expired"/"dispatch_failed"), a sentence for people, and when it may start.
    pending_reason = models.CharField(max_length=40, blank=True)
    pending_message = models.TextField(blank=True)
    expected_start = models.DateTimeField(null=True, blank=True)
    # How it ended: the exit code its agents reported (a failing host's, else 0 when every
    # host succeeded) and why it failed, was cancelled or ended, for people.
    exit_code = models.IntegerField(null=True, blank=True)
    message = models.TextField(blank=True, help_text="Why it failed, was cancelled or ended.")

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["state", "pool"], name="job_state_pool")]
        constraints = [models.CheckConstraint(condition=Q(gpus__gte=1), name="job_gpus_at_least_one")]

    def __str__(self):
        return f"job {self.pk}" + (f" ({self.name})" if self.name else "")

    @property
    def is_final(self) -> bool:
        return self.state in self.FINAL_STATES

    def active_placement(self):
        return self.placements.filter(state__in=Placement.ACTIVE_STATES).order_by("-id").first()


class AllocationCycle(models.Model):
    started_at = models.DateTimeField(default=timezone.now, db_index=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    snapshot_s = models.FloatField(null=True, blank=True)
    plan_s = models.FloatField(null=True, blank=True)
    persist_s = models.FloatField(null=True, blank=True)
    gpus_total = models.PositiveIntegerField(default=0)
    gpus_free = models.PositiveIntegerField(default=0)
    jobs_queued = models.PositiveIntegerField(default=0)
    proposed = models.PositiveIntegerField(default=0, help_text="Proposals waiting for an operator.")
    auto_approved = models.PositiveIntegerField(default=0)
    pending = models.PositiveIntegerField(default=0)
    expired = models.PositiveIntegerField(default=0, help_text="Proposals that expired in this cycle.")
    pending_reasons = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["-started_at", "-id"]

    def __str__(self):
        return f"cycle {self.pk} at {self.started_at:%Y-%m-%d %H:%M:%S}"

    @property
    def duration_s(self) -> float | None:
        parts = [self.snapshot_s, self.plan_s, self.persist_s]
        return None if any(p is None for p in parts) else sum(parts)


class Placement(models.Model):
    class State(models.TextChoices):
        PROPOSED = "proposed"
        APPROVED = "approved"
        REJECTED = "rejected"
        EXPIRED = "expired"
        DISPATCHING = "dispatching"
        RUNNING = "running"
        FINISHED = "finished"
        FAILED = "failed"
        CANCELLED = "cancelled"
        PREEMPTED = "preempted"

    class Kind(models.TextChoices):
        PLACE = "place", "placement"
        PREEMPTION = "preemption", "preemption (stops victims)"
        REBALANCE = "rebalance", "move (rebalancing)"
        REMOTE = "remote", "remote site"

    ACTIVE_STATES = (State.PROPOSED, State.APPROVED, State.DISPATCHING, State.RUNNING)
    DECIDABLE_STATES = (State.PROPOSED,)

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="placements")
    cycle = models.ForeignKey(AllocationCycle, null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="placements")
    state = models.CharField(max_length=12, choices=State.choices, default=State.PROPOSED)  # (state, expires_at) index
    gpus = models.ManyToManyField(Gpu, through="PlacementGpu", related_name="placements")
    # Cost of the GPUs it holds (the chosen ones, for an override); see scheduler.engine.Cost.
    hosts = models.PositiveIntegerField(default=0)
    leaves = models.PositiveIntegerField(default=0)
    pod_crossings = models.PositiveIntegerField(default=0)
    health_penalty = models.FloatField(default=0.0)
    fragmentation_left = models.PositiveIntegerField(default=0)
    lower_bound_leaves = models.PositiveIntegerField(null=True, blank=True)
    explanation = models.TextField(blank=True)
    borrowed = models.BooleanField(default=False, help_text="Beyond the tenant's guarantee: reclaimable.")
    borrowed_gpus = models.PositiveIntegerField(default=0)
    partial = models.BooleanField(default=False, help_text="A non-gang job started on fewer GPUs than it asked for.")
    # Override: what the engine proposed (GPU ids and Cost.as_dict()); the chosen set is `gpus`.
    is_override = models.BooleanField(default=False)
    kind = models.CharField(max_length=12, choices=Kind.choices, default=Kind.PLACE, db_default=Kind.PLACE)
    site = models.CharField(max_length=64, blank=True, db_default="", help_text="Where it runs, when away from the job's home site.")
    # Preemption / rebalancing: the jobs it stops (ids) and what it costs and gains, for people
    # and the dashboard, e.g. {"gpus_freed": 8, "leaves_before": 3, "leaves_after": 1}.
    victims = models.JSONField(default=list, blank=True, db_default=Value([], output_field=models.JSONField()))
    gains = models.JSONField(default=dict, blank=True, db_default=Value({}, output_field=models.JSONField()))
    moves_placement = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
                                        help_text="Rebalancing: the running placement this one replaces.")
    proposed_gpus = models.JSONField(default=list, blank=True)
    proposed_cost = models.JSONField(default=dict, blank=True)
    overridden_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                      related_name="+", db_index=False)
    overridden_at = models.DateTimeField(null=True, blank=True)
    # The decision: a user, or "policy" for auto-approval (decided_by empty).
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+", db_index=False)
    decided_by_name = models.CharField(max_length=150, blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    reject_reason = models.TextField(blank=True)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="A proposal not decided by then expires.")
    # Bumped by every change of state or GPUs: a decision names the version it saw.
    version = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    dispatched_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    stop_requested_at = models.DateTimeField(null=True, blank=True,
                                             help_text="The job was cancelled while this ran: its agents must stop it.")
    message = models.TextField(blank=True, help_text="Why it failed or ended, for people.")

    class Meta:
        ordering = ["-created_at", "-id"]
        permissions = [("decide_placement", "Can approve, reject and override placements")]
        indexes = [models.Index(fields=["state", "expires_at"], name="placement_state_expires")]

    def __str__(self):
        return f"placement {self.pk} of job {self.job_id}"

    @property
    def is_active(self) -> bool:
        return self.state in self.ACTIVE_STATES

    def cost_dict(self) -> dict:
        return {"hosts": self.hosts, "leaves": self.leaves, "pod_crossings": self.pod_crossings,
                "health_penalty": self.health_penalty, "fragmentation_left": self.fragmentation_left}

    def set_cost(self, cost) -> None:
        """From an engine Cost."""
        self.hosts, self.leaves, self.pod_crossings = cost.hosts, cost.leaves, cost.pod_crossings
        self.health_penalty, self.fragmentation_left = cost.health_penalty, cost.fragmentation_left


class PlacementGpu(models.Model):
    # The (placement, gpu) unique index serves lookups by placement.
    placement = models.ForeignKey(Placement, on_delete=models.CASCADE, related_name="placement_gpus", db_index=False)
    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="placement_gpus")
    active = models.BooleanField(default=True)
    # Sharing: the share of the GPU (thousandths) and memory it holds; 1000 = the whole GPU.
    # Whole GPUs are held by the unique index below; shares of one GPU are checked under the
    # Gpu row lock when persisted (sum of shares <= 1000, memory within the GPU's).
    share_milli = models.PositiveIntegerField(default=1000, db_default=1000)
    memory_mib = models.PositiveIntegerField(default=0, db_default=0)
    mig_device = models.CharField(max_length=80, blank=True, db_default="", help_text="MIG device (UUID or GPU:GI) when MIG is used.")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["gpu"], condition=Q(active=True, share_milli__gte=1000),
                                    name="placementgpu_one_active_per_gpu"),
            models.UniqueConstraint(fields=["placement", "gpu"], name="placementgpu_unique_pair"),
        ]

    def __str__(self):
        return f"{self.gpu_id} in placement {self.placement_id}"


class AuditEvent(models.Model):
    """Every job state change and every decision attempt, refused ones included."""

    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    # A username, or "scheduler" (cycles), "policy" (auto-approval), "system" (expiry, dispatch).
    actor = models.CharField(max_length=150)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                             related_name="+", db_index=False)
    action = models.CharField(max_length=40)
    refused = models.BooleanField(default=False, help_text="The attempt was refused; nothing changed.")
    # Lookups by job use the (job, -created_at) index.
    job = models.ForeignKey(Job, null=True, blank=True, on_delete=models.CASCADE, related_name="audit_events",
                            db_index=False)
    placement = models.ForeignKey(Placement, null=True, blank=True, on_delete=models.CASCADE,
                                  related_name="audit_events")
    from_state = models.CharField(max_length=12, blank=True)
    to_state = models.CharField(max_length=12, blank=True)
    message = models.TextField(blank=True)
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["job", "-created_at"], name="audit_job_created")]

    def __str__(self):
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.actor} {self.action}"


class TaskClassRule(models.Model):
    """How the engine treats a task class (editable in the admin; defaults in settings
    SCHEDULER_TASK_CLASSES when a class has no row)."""

    task_class = models.CharField(max_length=12, choices=Job.TaskClass.choices, unique=True)
    whole_gpus = models.BooleanField(default=True, help_text="Never share a GPU with other jobs.")
    pack_tightly = models.BooleanField(default=True, help_text="Fewest leaf switches first.")
    prefer_healthy_leaves = models.BooleanField(default=False, help_text="Avoid degraded leaves even for one-leaf jobs.")
    prefer_lightly_loaded = models.BooleanField(default=False, help_text="Prefer leaves with the most free GPUs.")
    preemptible = models.BooleanField(default=True, help_text="Jobs of this class may be preempted.")
    requires_fp64 = models.CharField(max_length=8, blank=True, help_text='FP64 class required, e.g. "high".')
    leftovers_only = models.BooleanField(default=False, help_text="Takes what is left (lowest placement priority).")

    class Meta:
        ordering = ["task_class"]

    def __str__(self):
        return f"rules for {self.task_class}"
