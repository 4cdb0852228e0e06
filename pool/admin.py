"""Admin for the pool: pools, hosts and their GPUs are configured here (agent URL and kind,
pool, labels). What polling measures is shown read-only: agent reports overwrite it. A
host's state changes only through pool.services (drain and undrain, here as actions), so
that every change leaves a HostEvent. Events and poll rounds are history: view only.
Sample and rollup tables are not registered (millions of rows; the host page charts them)."""
from django.contrib import admin, messages
from django.db.models import Count, Q

from .models import Gpu, Host, HostEvent, PollRound, Pool
from .services import drain_host, undrain_host


@admin.register(Pool)
class PoolAdmin(admin.ModelAdmin):
    list_display = ("name", "description", "host_count")
    search_fields = ("name", "description")

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(host_count=Count("hosts"))

    @admin.display(description="hosts", ordering="host_count")
    def host_count(self, obj):
        return obj.host_count


GPU_MEASURED = ("present", "fp64_class", "compute_capability", "utilization", "memory_used_mib", "temperature_c", "power_w",
                "power_limit_w", "ecc_corrected", "ecc_uncorrected", "updated_at")


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0
    fields = ("index", "model", "memory_mib", "uuid", "nearest_hca", *GPU_MEASURED[:3], "utilization", "temperature_c",
              "power_w", "updated_at")
    # fp64_class follows the model name (Gpu.save); the rest is what the agent reports.
    readonly_fields = (*GPU_MEASURED[:3], "utilization", "temperature_c", "power_w", "updated_at")


HOST_MEASURED = (
    "state", "state_changed_at", "last_report_at", "agent_version", "missed_rounds", "last_error", "last_error_at",
    "cpu_percent", "cpu_count", "load1", "memory_total_mib", "memory_used_mib", "ib_tx_bytes_per_s", "ib_rx_bytes_per_s",
    "ib_ports", "created_at",
)


@admin.register(Host)
class HostAdmin(admin.ModelAdmin):
    list_display = ("name", "state", "pool", "fabric", "gpu_count", "last_report_at", "agent_kind", "in_fabric")
    list_filter = ("state", "pool", "fabric", "agent_kind", "in_fabric")
    list_select_related = ("pool", "fabric")
    search_fields = ("name", "agent_url", "adapters__description")
    # Thousands of adapters: pick them by search, not from a multi-select of all of them.
    autocomplete_fields = ("adapters",)
    readonly_fields = HOST_MEASURED
    fieldsets = (
        (None, {"fields": ("name", "pool", "site", "fabric", "adapters", "labels", "in_fabric")}),
        ("Agent", {"fields": ("agent_kind", "agent_url", "ib_metrics_url")}),
        ("Measured by polling (state changes: the drain and undrain actions)", {"fields": HOST_MEASURED}),
    )
    inlines = (GpuInline,)
    actions = ("drain", "undrain")

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(gpu_count=Count("gpus", filter=Q(gpus__present=True)))

    @admin.display(description="GPUs", ordering="gpu_count")
    def gpu_count(self, obj):
        return obj.gpu_count

    def has_drain_permission(self, request):
        return request.user.has_perm("pool.drain_host")

    @admin.action(description="Drain the selected hosts (running work goes on, GPUs are offered to no one)", permissions=["drain"])
    def drain(self, request, queryset):
        self._act(request, queryset, drain_host, "drained", "already draining")

    @admin.action(description="Undrain the selected hosts", permissions=["drain"])
    def undrain(self, request, queryset):
        self._act(request, queryset, undrain_host, "undrained", "not drained or down")

    def _act(self, request, queryset, service, done_text, skipped_text):
        actor = request.user.get_username()
        done = skipped = 0
        for host in queryset.select_related(None).only("id", "name"):
            if service(host, actor=actor):
                done += 1
            else:
                skipped += 1
        text = f"{done} host{'s' if done != 1 else ''} {done_text}"
        if skipped:
            text += f"; {skipped} left as they were ({skipped_text})"
        self.message_user(request, text + ".", messages.SUCCESS if done else messages.INFO)


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = ("__str__", "model", "memory_mib", "uuid", "nearest_hca", "utilization", "present", "updated_at")
    list_filter = ("present", "fp64_class", "host__pool", "host__state")
    list_select_related = ("host",)
    search_fields = ("uuid", "host__name", "model")
    autocomplete_fields = ("host",)
    readonly_fields = GPU_MEASURED


class ReadOnlyAdmin(admin.ModelAdmin):
    """History written by the system: viewable, never added, changed or deleted by hand."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(HostEvent)
class HostEventAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "host", "kind", "severity", "message", "actor")
    list_filter = ("kind", "severity")
    list_select_related = ("host",)
    search_fields = ("host__name", "message", "actor")


@admin.register(PollRound)
class PollRoundAdmin(ReadOnlyAdmin):
    list_display = ("started_at", "finished_at", "duration_s", "hosts", "hosts_ok", "hosts_error", "gpu_samples", "overran",
                    "abandoned")
    list_filter = ("overran", "abandoned")
