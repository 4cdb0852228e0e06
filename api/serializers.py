"""What the API returns (read serializers, flat and named so a client needs no joins) and
what it accepts (input serializers that only check shapes; the services check the rules)."""
from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from fabric.models import FabricEvent, Link, Switch
from pool.models import Gpu, Host, HostEvent, Pool
from scheduler import services
from scheduler.forms import ENV_NAME, MAX_ARG_CHARS, MAX_ARGS, MAX_ENV, MAX_ENV_VALUE, MAX_REASON
from scheduler.models import AllocationCycle, Job, Placement, Tenant

BIG = 2**31 - 1
RECENT_EVENTS = 25


# --- scheduler ------------------------------------------------------------------------------


class JobSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="name", read_only=True)
    pool = serializers.SlugRelatedField(slug_field="name", read_only=True)
    submitted_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)

    class Meta:
        model = Job
        fields = ["id", "name", "state", "tenant", "pool", "gpus", "gpu_models", "min_memory_mib", "fp64", "site",
                  "task_class", "priority", "gang", "whole_hosts", "preemptible", "max_leaves", "topology_hard",
                  "max_wait_s", "estimated_runtime_s", "max_runtime_s", "gpu_milli", "gpu_memory_mib", "mig_profile",
                  "restartable", "allow_remote_site", "grace_period_s", "command", "env", "submitted_by",
                  "created_at", "state_changed_at", "started_at", "finished_at", "pending_reason", "pending_message",
                  "expected_start", "exit_code", "message"]
        read_only_fields = fields


class PlacementSerializer(serializers.ModelSerializer):
    job_name = serializers.CharField(source="job.name", read_only=True)
    tenant = serializers.CharField(source="job.tenant.name", read_only=True)
    pool = serializers.CharField(source="job.pool.name", read_only=True)
    gpus = serializers.SerializerMethodField(help_text="GPU ids it holds (held, for an ended placement).")

    class Meta:
        model = Placement
        fields = ["id", "job", "job_name", "tenant", "pool", "cycle", "state", "kind", "version", "gpus", "hosts",
                  "leaves", "pod_crossings", "health_penalty", "fragmentation_left", "explanation", "borrowed",
                  "borrowed_gpus", "partial", "is_override", "proposed_gpus", "decided_by_name", "decided_at",
                  "reject_reason", "expires_at", "created_at", "dispatched_at", "started_at", "finished_at",
                  "stop_requested_at", "message"]
        read_only_fields = fields

    def get_gpus(self, obj) -> list[int]:
        return sorted(pg.gpu_id for pg in obj.placement_gpus.all())


class JobPlacementSerializer(serializers.ModelSerializer):
    gpus = serializers.SerializerMethodField()

    class Meta:
        model = Placement
        fields = ["id", "state", "kind", "version", "gpus", "hosts", "leaves", "created_at", "finished_at"]
        read_only_fields = fields

    def get_gpus(self, obj) -> list[int]:
        return sorted(pg.gpu_id for pg in obj.placement_gpus.all())


class JobDetailSerializer(JobSerializer):
    placements = JobPlacementSerializer(many=True, read_only=True)

    class Meta(JobSerializer.Meta):
        fields = JobSerializer.Meta.fields + ["placements"]
        read_only_fields = fields


class CommandField(serializers.ListField):
    def __init__(self, **kwargs):
        super().__init__(child=serializers.CharField(max_length=MAX_ARG_CHARS, allow_blank=True, trim_whitespace=False),
                         min_length=1, max_length=MAX_ARGS, **kwargs)


class JobSubmitSerializer(serializers.Serializer):
    """A job as the submit form takes it, in JSON; the service applies the same rules."""

    tenant = serializers.CharField(max_length=64, help_text="Tenant name.")
    pool = serializers.CharField(max_length=64, help_text="Pool name.")
    gpus = serializers.IntegerField(min_value=1, max_value=services.MAX_GPUS)
    command = CommandField(help_text="argv, e.g. [\"python\", \"train.py\"].")
    env = serializers.DictField(child=serializers.CharField(max_length=MAX_ENV_VALUE, allow_blank=True,
                                                            trim_whitespace=False), required=False)
    name = serializers.CharField(max_length=200, required=False, allow_blank=True)
    gpu_models = serializers.ListField(child=serializers.CharField(max_length=80), max_length=32, required=False,
                                       help_text="Any of these models, e.g. [\"H100\"]; empty: any.")
    min_memory_mib = serializers.IntegerField(min_value=0, max_value=10_000_000, required=False)
    fp64 = serializers.ChoiceField(choices=Job.Fp64.choices, required=False, allow_blank=True)
    site = serializers.CharField(max_length=100, required=False, allow_blank=True)
    task_class = serializers.ChoiceField(choices=Job.TaskClass.choices, required=False)
    priority = serializers.IntegerField(min_value=-1_000_000, max_value=1_000_000, required=False)
    gang = serializers.BooleanField(required=False)
    whole_hosts = serializers.BooleanField(required=False)
    preemptible = serializers.BooleanField(required=False)
    estimated_runtime_s = serializers.IntegerField(min_value=1, max_value=services.MAX_RUNTIME_S, required=False,
                                                   allow_null=True)
    max_runtime_s = serializers.IntegerField(min_value=1, max_value=services.MAX_RUNTIME_S, required=False,
                                             allow_null=True)
    max_leaves = serializers.IntegerField(min_value=1, max_value=100_000, required=False, allow_null=True)
    topology_hard = serializers.BooleanField(required=False)
    max_wait_s = serializers.IntegerField(min_value=0, max_value=services.MAX_RUNTIME_S, required=False,
                                          help_text="Seconds before a soft max_leaves is relaxed and, with "
                                                    "allow_remote_site, before another site may take it.")
    gpu_milli = serializers.IntegerField(min_value=0, max_value=999, required=False,
                                         help_text="Sharing: thousandths of one GPU (1-999; gpus must be 1); "
                                                   "0: whole GPUs.")
    gpu_memory_mib = serializers.IntegerField(min_value=0, max_value=10_000_000, required=False,
                                              help_text="Sharing: GPU memory it needs on the shared GPU (MiB).")
    mig_profile = serializers.CharField(max_length=20, required=False, allow_blank=True,
                                        help_text="Sharing: a MIG profile such as \"1g.10gb\" instead of gpu_milli "
                                                  "(gpus must be 1).")
    restartable = serializers.BooleanField(required=False,
                                           help_text="May be stopped and started again elsewhere (rebalancing).")
    allow_remote_site = serializers.BooleanField(required=False,
                                                 help_text="May run at another site of the pool after max_wait_s; "
                                                           "needs site.")
    grace_period_s = serializers.IntegerField(min_value=0, max_value=3600, required=False,
                                              help_text="Seconds between SIGTERM and SIGKILL when it is stopped "
                                                        "(default 30).")

    def validate_env(self, env):
        if len(env) > MAX_ENV:
            raise serializers.ValidationError(f"{len(env)} variables: at most {MAX_ENV}.")
        bad = [k for k in env if not ENV_NAME.match(k)]
        if bad:
            raise serializers.ValidationError(f"{bad[0][:40]!r} is not a variable name (letters, digits and _, "
                                              "not starting with a digit).")
        return env

    def validate(self, data):
        if data.get("topology_hard") and not data.get("max_leaves"):
            raise serializers.ValidationError({"max_leaves": "A hard limit needs the number of leaf switches."})
        return data


class VersionSerializer(serializers.Serializer):
    version = serializers.IntegerField(min_value=1, max_value=BIG,
                                       help_text="The placement version you looked at; a newer one refuses (409).")


class RejectSerializer(VersionSerializer):
    reason = serializers.CharField(max_length=MAX_REASON, required=False, allow_blank=True)


class OverrideSerializer(VersionSerializer):
    gpus = serializers.ListField(child=serializers.IntegerField(min_value=1, max_value=BIG), min_length=1,
                                 max_length=100_000, help_text="GPU ids to give the job instead of the proposal.")


class ActionCheckSerializer(serializers.Serializer):
    """GET on an action URL: whether you may do it and whether it can be done now."""

    action = serializers.CharField()
    allowed = serializers.BooleanField(help_text="Your role allows it.")
    possible = serializers.BooleanField(help_text="The thing is in a state that allows it.")
    message = serializers.CharField()
    version = serializers.IntegerField(required=False, help_text="Placements: the version to send.")


class CycleSerializer(serializers.ModelSerializer):
    duration_s = serializers.FloatField(read_only=True, allow_null=True)

    class Meta:
        model = AllocationCycle
        fields = ["id", "started_at", "finished_at", "duration_s", "snapshot_s", "plan_s", "persist_s", "gpus_total",
                  "gpus_free", "jobs_queued", "proposed", "auto_approved", "pending", "expired", "pending_reasons",
                  "error"]
        read_only_fields = fields


class QuotaSerializer(serializers.Serializer):
    pool = serializers.CharField(source="pool.name")
    guaranteed_gpus = serializers.IntegerField()
    limit_gpus = serializers.IntegerField(allow_null=True)


class TenantSerializer(serializers.ModelSerializer):
    gpus_in_use = serializers.IntegerField(read_only=True)
    jobs_queued = serializers.IntegerField(read_only=True)
    jobs_running = serializers.IntegerField(read_only=True)
    quotas = QuotaSerializer(many=True, read_only=True)

    class Meta:
        model = Tenant
        fields = ["id", "name", "description", "usage_gpu_seconds", "usage_updated_at", "gpus_in_use", "jobs_queued",
                  "jobs_running", "quotas"]
        read_only_fields = fields


# --- pool -----------------------------------------------------------------------------------


class PoolSerializer(serializers.ModelSerializer):
    hosts = serializers.IntegerField(read_only=True, source="n_hosts")
    gpus = serializers.IntegerField(read_only=True, source="n_gpus", help_text="Present GPUs.")
    gpus_allocated = serializers.IntegerField(read_only=True, source="n_gpus_allocated",
                                              help_text="GPUs held by active placements.")
    gpus_free = serializers.SerializerMethodField(help_text="Present GPUs no active placement holds.")
    jobs_queued = serializers.IntegerField(read_only=True, source="n_jobs_queued")
    jobs_running = serializers.IntegerField(read_only=True, source="n_jobs_running",
                                            help_text="Approved, dispatching or running.")

    class Meta:
        model = Pool
        fields = ["id", "name", "description", "hosts", "gpus", "gpus_allocated", "gpus_free", "jobs_queued",
                  "jobs_running"]
        read_only_fields = fields

    def get_gpus_free(self, obj) -> int:
        return max(0, obj.n_gpus - obj.n_gpus_allocated)


class GpuSerializer(serializers.ModelSerializer):
    host = serializers.CharField(source="host.name", read_only=True)
    pool = serializers.CharField(source="host.pool.name", read_only=True, allow_null=True, default=None)
    allocated = serializers.BooleanField(read_only=True, help_text="Held by an active placement.")

    class Meta:
        model = Gpu
        fields = ["id", "host", "pool", "index", "uuid", "model", "memory_mib", "fp64_class", "compute_capability",
                  "mig_mode", "present", "allocated", "utilization", "memory_used_mib", "temperature_c", "power_w",
                  "updated_at"]
        read_only_fields = fields


class HostSerializer(serializers.ModelSerializer):
    pool = serializers.SlugRelatedField(slug_field="name", read_only=True, allow_null=True)
    site = serializers.SlugRelatedField(slug_field="name", read_only=True, allow_null=True)
    fabric = serializers.SlugRelatedField(slug_field="name", read_only=True, allow_null=True)
    gpus = serializers.IntegerField(read_only=True, source="gpu_count", help_text="Present GPUs.")
    gpus_allocated = serializers.IntegerField(read_only=True)

    class Meta:
        model = Host
        fields = ["id", "name", "state", "state_changed_at", "pool", "site", "fabric", "agent_kind", "agent_version",
                  "in_fabric", "last_report_at", "last_error", "gpus", "gpus_allocated", "cpu_percent", "cpu_count",
                  "load1", "memory_total_mib", "memory_used_mib", "ib_tx_bytes_per_s", "ib_rx_bytes_per_s", "labels"]
        read_only_fields = fields


class HostEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = HostEvent
        fields = ["created_at", "kind", "severity", "message", "actor"]
        read_only_fields = fields


class HostGpuSerializer(serializers.ModelSerializer):
    class Meta:
        model = Gpu
        fields = ["id", "index", "uuid", "model", "memory_mib", "present", "utilization", "memory_used_mib",
                  "temperature_c", "power_w", "updated_at"]
        read_only_fields = fields


class HostDetailSerializer(HostSerializer):
    gpu_list = HostGpuSerializer(many=True, read_only=True, source="gpus")
    recent_events = serializers.SerializerMethodField()

    class Meta(HostSerializer.Meta):
        fields = HostSerializer.Meta.fields + ["gpu_list", "recent_events"]
        read_only_fields = fields

    @extend_schema_field(HostEventSerializer(many=True))
    def get_recent_events(self, obj):
        return HostEventSerializer(obj.events.order_by("-created_at", "-id")[:RECENT_EVENTS], many=True).data


class DrainSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=MAX_REASON, required=False, allow_blank=True)


class HostActionResultSerializer(serializers.Serializer):
    changed = serializers.BooleanField(help_text="False when the host already was (or was not) drained.")
    message = serializers.CharField()
    host = HostSerializer()


# --- fabric ---------------------------------------------------------------------------------


class SwitchSerializer(serializers.ModelSerializer):
    fabric = serializers.SlugRelatedField(slug_field="name", read_only=True)

    class Meta:
        model = Switch
        fields = ["id", "fabric", "guid", "description", "tier", "lid", "num_ports", "present", "first_seen",
                  "last_seen"]
        read_only_fields = fields


class LinkSerializer(serializers.ModelSerializer):
    fabric = serializers.SlugRelatedField(slug_field="name", read_only=True)
    end_a = serializers.SerializerMethodField()
    end_b = serializers.SerializerMethodField()

    class Meta:
        model = Link
        fields = ["id", "fabric", "key", "kind", "state", "state_reason", "end_a", "end_b", "width", "speed", "gbps",
                  "first_seen", "last_seen"]
        read_only_fields = fields

    def get_end_a(self, obj) -> str:
        return str(obj.port_a)

    def get_end_b(self, obj) -> str:
        return str(obj.port_b) if obj.port_b_id else f"0x{obj.remote_guid}[{obj.remote_port}]"


class FabricEventSerializer(serializers.ModelSerializer):
    fabric = serializers.SlugRelatedField(slug_field="name", read_only=True)

    class Meta:
        model = FabricEvent
        fields = ["id", "fabric", "created_at", "kind", "severity", "message", "link", "switch", "adapter", "data"]
        read_only_fields = fields
