"""Admin for the scheduler. Tenants, their quotas and pool policies are configured here.
Jobs, placements, cycles and the audit log are records: shown read-only, and changed only
through scheduler.services (the actions below), so that every change is checked, locked
and audited the same way as from the dashboard. Jobs are submitted from the dashboard or
`manage.py submit_job`, not here."""
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied

from . import services
from .models import (AllocationCycle, AuditEvent, Job, Placement, PlacementGpu, PoolPolicy, TaskClassRule, Tenant,
                     TenantQuota)


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class TenantQuotaInline(admin.TabularInline):
    model = TenantQuota
    extra = 0
    fields = ("pool", "guaranteed_gpus", "limit_gpus")


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ("name", "description", "usage_gpu_hours", "usage_updated_at")
    search_fields = ("name", "description")
    readonly_fields = ("usage_gpu_seconds", "usage_updated_at")
    inlines = (TenantQuotaInline,)

    @admin.display(description="decayed usage (GPU-hours)")
    def usage_gpu_hours(self, obj):
        return f"{obj.usage_gpu_seconds / 3600:.1f}"


@admin.register(PoolPolicy)
class PoolPolicyAdmin(admin.ModelAdmin):
    list_display = ("pool", "mode", "threshold_gpus", "manual_when_crossing_spines", "manual_for_overrides",
                    "manual_for_preemptions")
    list_select_related = ("pool",)


@admin.register(TaskClassRule)
class TaskClassRuleAdmin(admin.ModelAdmin):
    """A row overrides settings SCHEDULER_TASK_CLASSES for its class (read at every cycle)."""
    list_display = ("task_class", "pack_tightly", "prefer_healthy_leaves", "prefer_lightly_loaded", "preemptible",
                    "requires_fp64", "leftovers_only", "whole_gpus")


def _each(modeladmin, request, queryset, call, verb):
    done, refused = 0, []
    for obj in queryset:
        try:
            call(obj)
            done += 1
        except (services.DecisionError, PermissionDenied) as exc:
            refused.append(str(exc))
    if done:
        modeladmin.message_user(request, f"{verb} {done}.", messages.SUCCESS)
    for message in refused[:10]:
        modeladmin.message_user(request, message, messages.ERROR)


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    list_display = ("id", "name", "tenant", "pool", "gpus", "state", "priority", "pending_reason", "created_at")
    list_filter = ("state", "pool", "tenant", "task_class", "pending_reason")
    list_select_related = ("tenant", "pool")
    search_fields = ("name", "id")
    actions = ("cancel",)

    @admin.action(description="Cancel the selected jobs")
    def cancel(self, request, queryset):
        _each(self, request, queryset, lambda job: services.cancel_job(job, request.user), "Cancelled")


class PlacementGpuInline(admin.TabularInline):
    model = PlacementGpu
    extra = 0
    fields = ("gpu", "active")
    readonly_fields = fields
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Placement)
class PlacementAdmin(ReadOnlyAdmin):
    list_display = ("id", "job", "kind", "state", "hosts", "leaves", "pod_crossings", "site", "is_override",
                    "decided_by_name", "decided_at", "expires_at")
    list_filter = ("state", "kind", "is_override", "borrowed")
    list_select_related = ("job",)
    search_fields = ("job__name", "job__id")
    inlines = (PlacementGpuInline,)
    actions = ("approve", "reject")

    @admin.action(description="Approve the selected proposals")
    def approve(self, request, queryset):
        _each(self, request, queryset, lambda p: services.approve(p, request.user, p.version), "Approved")

    @admin.action(description="Reject the selected proposals (jobs go back to the queue)")
    def reject(self, request, queryset):
        _each(self, request, queryset, lambda p: services.reject(p, request.user, "rejected in admin", p.version),
              "Rejected")


@admin.register(AllocationCycle)
class AllocationCycleAdmin(ReadOnlyAdmin):
    list_display = ("id", "started_at", "snapshot_s", "plan_s", "persist_s", "jobs_queued", "gpus_free",
                    "auto_approved", "proposed", "pending", "expired", "error")
    list_filter = ("started_at",)


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "actor", "action", "refused", "job", "placement", "from_state", "to_state", "message")
    list_filter = ("action", "refused", "actor")
    search_fields = ("actor", "message", "job__id")
    list_select_related = ("job", "placement")

    def has_delete_permission(self, request, obj=None):
        return False
