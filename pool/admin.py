"""Admin for the pool: pools, hosts and their GPUs are configured here (agent URL, pool,
labels) until the pool pages exist. Agent reports overwrite the measured fields."""
from django.contrib import admin
from django.db.models import Count

from .models import Gpu, Host, Pool


@admin.register(Pool)
class PoolAdmin(admin.ModelAdmin):
    list_display = ("name", "description", "host_count")
    search_fields = ("name", "description")

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(host_count=Count("hosts"))

    @admin.display(description="hosts", ordering="host_count")
    def host_count(self, obj):
        return obj.host_count


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0
    fields = ("index", "model", "memory_mib", "uuid", "nearest_hca", "utilization", "memory_used_mib", "updated_at")
    readonly_fields = ("utilization", "memory_used_mib", "updated_at")


@admin.register(Host)
class HostAdmin(admin.ModelAdmin):
    list_display = ("name", "state", "pool", "fabric", "site", "agent_kind", "in_fabric", "last_report_at", "gpu_count")
    list_filter = ("state", "pool", "fabric", "site", "agent_kind", "in_fabric")
    list_select_related = ("pool", "fabric", "site")
    search_fields = ("name", "agent_url", "adapters__description")
    # Thousands of adapters: pick them by search, not from a multi-select of all of them.
    autocomplete_fields = ("adapters",)
    readonly_fields = ("last_report_at", "agent_version", "created_at")
    inlines = (GpuInline,)

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(gpu_count=Count("gpus"))

    @admin.display(description="GPUs", ordering="gpu_count")
    def gpu_count(self, obj):
        return obj.gpu_count


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = ("__str__", "model", "memory_mib", "uuid", "nearest_hca", "utilization", "updated_at")
    list_filter = ("model", "host__pool", "host__state")
    list_select_related = ("host",)
    search_fields = ("uuid", "host__name", "model")
    autocomplete_fields = ("host",)
    readonly_fields = ("utilization", "memory_used_mib", "updated_at")
