"""The REST API: read endpoints over the scheduler, pool and fabric, and the actions people
take on the dashboard (submit, cancel, approve, reject, override, drain, undrain), which
call the same services so the same rules, permissions and audit apply.

Every action URL also answers a GET that says whether you may do it and whether it can be
done now (the project's rule: every URL answers a GET)."""
from __future__ import annotations

from django.db.models import Count, Exists, IntegerField, OuterRef, Prefetch, Subquery, Value
from django.db.models.functions import Coalesce
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import exceptions, mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from core.roles import user_role
from fabric.models import FabricEvent, Link, Switch
from pool.models import Gpu, Host, Pool
from pool.services import drain_host, undrain_host
from scheduler import services
from scheduler.models import AllocationCycle, Job, Placement, PlacementGpu, Tenant, TenantQuota

from . import serializers as s
from .filters import Spec

DRAIN = "pool.drain_host"
QUEUED = (Job.State.PENDING, Job.State.PREEMPTED)
RUNNING = (Job.State.APPROVED, Job.State.DISPATCHING, Job.State.RUNNING)


def _count(queryset, group: str):
    """A correlated COUNT subquery (0 when there are no rows): no join fan-out in lists."""
    counted = queryset.order_by().values(group).annotate(n=Count("*")).values("n")
    return Coalesce(Subquery(counted, output_field=IntegerField()), Value(0))


class ReadViewSet(viewsets.GenericViewSet):
    """Lists with filters (`filter_specs`), ordering and pagination; objects by id."""

    # Any segment reaches the view, so a malformed id is the API's JSON 404, not Django's page.
    lookup_value_regex = "[^/]+"

    filter_specs: tuple = ()
    write_permissions: dict = {}
    write_descriptions: dict = {}

    def get_object(self):
        value = str(self.kwargs.get(self.lookup_url_kwarg or self.lookup_field, ""))
        label = self.get_queryset().model._meta.verbose_name
        if self.lookup_field == "pk" and (not value.isdigit() or len(value) > 18):
            raise exceptions.NotFound(f"{label.capitalize()} {value[:40]!r} does not exist: ids are whole numbers.")
        obj = self.get_queryset().filter(**{self.lookup_field: value}).first()
        if obj is None:
            raise exceptions.NotFound(f"{label.capitalize()} {value[:80]!r} does not exist.")
        self.check_object_permissions(self.request, obj)
        return obj

    def may(self, action_name: str) -> bool:
        perm = self.write_permissions.get(action_name)
        return bool(perm and self.request.user.has_perm(perm))

    def check(self, action_name: str, possible: bool, message: str, **extra) -> Response:
        allowed = self.may(action_name)
        if not allowed:
            message = f"Your role ({user_role(self.request.user)}) may not do this. " + message
        return Response(s.ActionCheckSerializer({"action": action_name, "allowed": allowed, "possible": possible,
                                                 "message": message, **extra}).data)

    def validated(self, serializer_class):
        serializer = serializer_class(data=self.request.data)
        serializer.is_valid(raise_exception=True)
        return serializer.validated_data


CHECK = extend_schema(methods=["GET"], responses=s.ActionCheckSerializer,
                      description="Whether you may do this and whether it can be done now; changes nothing.")


# --- jobs -----------------------------------------------------------------------------------


@extend_schema_view(
    list=extend_schema(summary="List jobs", description="Newest first unless ?ordering= says otherwise."),
    retrieve=extend_schema(summary="One job, with its placements"),
    create=extend_schema(summary="Submit a job", request=s.JobSubmitSerializer, responses={201: s.JobDetailSerializer}),
)
class JobViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin, ReadViewSet):
    lookup_url_kwarg = "job_id"
    filter_specs = (
        Spec("state", "state", "choice", tuple(Job.State.values)),
        Spec("states", "state__in", "choices", tuple(Job.State.values),
             description="Several states separated by commas, e.g. pending,running."),
        Spec("pool", "pool__name", description="Pool name."),
        Spec("tenant", "tenant__name", description="Tenant name."),
        Spec("user", "submitted_by__username", description="Username of who submitted it."),
        Spec("name", "name__icontains", description="Part of the job's name."),
    )
    ordering_fields = ["id", "created_at", "state_changed_at", "priority", "gpus", "state"]
    ordering = ["-created_at", "-id"]
    write_permissions = {"create": services.SUBMIT, "cancel": services.CANCEL}
    write_descriptions = {"create": "submit jobs", "cancel": "cancel jobs"}

    def get_queryset(self):
        jobs = Job.objects.select_related("tenant", "pool", "submitted_by")
        if self.action != "list":
            placements = Placement.objects.order_by("-created_at", "-id").prefetch_related("placement_gpus")
            jobs = jobs.prefetch_related(Prefetch("placements", queryset=placements))
        return jobs

    def get_serializer_class(self):
        return s.JobSerializer if self.action == "list" else s.JobDetailSerializer

    def create(self, request, *args, **kwargs):
        data = self.validated(s.JobSubmitSerializer)
        job = services.submit_job(request.user, **data)
        body = s.JobDetailSerializer(self.get_queryset().get(pk=job.pk)).data
        return Response(body, status=status.HTTP_201_CREATED, headers={"Location": f"{request.path}{job.pk}/"})

    @CHECK
    @extend_schema(methods=["POST"], request=None, responses=s.JobDetailSerializer, summary="Cancel a job")
    @action(detail=True, methods=["get", "post"])
    def cancel(self, request, job_id=None):
        job = self.get_object()
        if request.method == "GET":
            return self.check("cancel", not job.is_final,
                              f"Job {job.pk} is {job.state}" + (": it can no longer be cancelled." if job.is_final
                                                                else ": it can be cancelled."))
        services.cancel_job(job.pk, request.user)
        return Response(s.JobDetailSerializer(self.get_queryset().get(pk=job.pk)).data)


# --- placements -----------------------------------------------------------------------------


@extend_schema_view(list=extend_schema(summary="List placements"), retrieve=extend_schema(summary="One placement"))
class PlacementViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ReadViewSet):
    lookup_url_kwarg = "placement_id"
    serializer_class = s.PlacementSerializer
    filter_specs = (
        Spec("state", "state", "choice", tuple(Placement.State.values)),
        Spec("kind", "kind", "choice", tuple(Placement.Kind.values)),
        Spec("job", "job_id", "int", description="Job id."),
        Spec("pool", "job__pool__name", description="Pool name."),
        Spec("tenant", "job__tenant__name", description="Tenant name."),
    )
    ordering_fields = ["id", "created_at", "expires_at", "state"]
    ordering = ["-created_at", "-id"]
    write_permissions = {name: services.DECIDE for name in ("approve", "reject", "override")}
    write_descriptions = {name: "decide placements" for name in ("approve", "reject", "override")}

    def get_queryset(self):
        return Placement.objects.select_related("job", "job__tenant", "job__pool").prefetch_related("placement_gpus")

    def _check(self, name):
        p = self.get_object()
        possible = p.state in Placement.DECIDABLE_STATES
        message = (f"Placement {p.pk} is {p.state}" +
                   (f"; send version {p.version} with your decision." if possible
                    else ": only proposed placements can be decided."))
        return self.check(name, possible, message, version=p.version)

    def _done(self, p):
        return Response(s.PlacementSerializer(self.get_queryset().get(pk=p.pk)).data)

    @CHECK
    @extend_schema(methods=["POST"], request=s.VersionSerializer, responses=s.PlacementSerializer,
                   summary="Approve a proposal")
    @action(detail=True, methods=["get", "post"])
    def approve(self, request, placement_id=None):
        if request.method == "GET":
            return self._check("approve")
        p = self.get_object()
        data = self.validated(s.VersionSerializer)
        return self._done(services.approve(p.pk, request.user, expected_version=data["version"]))

    @CHECK
    @extend_schema(methods=["POST"], request=s.RejectSerializer, responses=s.PlacementSerializer,
                   summary="Reject a proposal (its job goes back to the queue)")
    @action(detail=True, methods=["get", "post"])
    def reject(self, request, placement_id=None):
        if request.method == "GET":
            return self._check("reject")
        p = self.get_object()
        data = self.validated(s.RejectSerializer)
        reason = " ".join(data.get("reason", "").split())
        return self._done(services.reject(p.pk, request.user, reason=reason, expected_version=data["version"]))

    @CHECK
    @extend_schema(methods=["POST"], request=s.OverrideSerializer, responses=s.PlacementSerializer,
                   summary="Give the job other GPUs than proposed")
    @action(detail=True, methods=["get", "post"])
    def override(self, request, placement_id=None):
        if request.method == "GET":
            return self._check("override")
        p = self.get_object()
        data = self.validated(s.OverrideSerializer)
        gpus = list(dict.fromkeys(data["gpus"]))
        return self._done(services.override(p.pk, request.user, gpu_ids=gpus, expected_version=data["version"]))


# --- pool -----------------------------------------------------------------------------------


def _allocated_gpus():
    return PlacementGpu.objects.filter(active=True)


@extend_schema_view(list=extend_schema(summary="List hosts"),
                    retrieve=extend_schema(summary="One host, with its GPUs and recent events"))
class HostViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ReadViewSet):
    lookup_field = "name"
    lookup_url_kwarg = "host"
    lookup_value_regex = "[^/]+"
    filter_specs = (
        Spec("state", "state", "choice", tuple(Host.State.values)),
        Spec("pool", "pool__name", description="Pool name."),
        Spec("site", "site__name", description="Site name."),
        Spec("fabric", "fabric__name", description="Fabric name."),
        Spec("name", "name__icontains", description="Part of the host name."),
    )
    ordering_fields = ["name", "state", "last_report_at", "state_changed_at"]
    ordering = ["name"]
    write_permissions = {"drain": DRAIN, "undrain": DRAIN}
    write_descriptions = {"drain": "drain hosts", "undrain": "undrain hosts"}

    def get_queryset(self):
        hosts = Host.objects.select_related("pool", "site", "fabric").annotate(
            gpu_count=_count(Gpu.objects.filter(host=OuterRef("pk"), present=True), "host"),
            gpus_allocated=_count(Gpu.objects.filter(host=OuterRef("pk")).filter(
                Exists(_allocated_gpus().filter(gpu=OuterRef("pk")))), "host"))
        if self.action != "list":
            hosts = hosts.prefetch_related(Prefetch("gpus", queryset=Gpu.objects.order_by("index")))
        return hosts

    def get_serializer_class(self):
        return s.HostSerializer if self.action == "list" else s.HostDetailSerializer

    def _act(self, name, request):
        host = self.get_object()
        drained = host.state in Host.OPERATOR_STATES
        if request.method == "GET":
            possible = host.state != Host.State.DRAINING if name == "drain" else drained
            return self.check(name, possible, f"{host.name} is {host.state}.")
        if name == "drain":
            reason = " ".join(self.validated(s.DrainSerializer).get("reason", "").split())
            changed = drain_host(host, actor=request.user.get_username(), reason=reason)
            message = (f"{host.name} is draining: its running work goes on, its GPUs are offered to no one."
                       if changed else f"{host.name} was already draining; nothing changed.")
        else:
            changed = undrain_host(host, actor=request.user.get_username())
            host.refresh_from_db(fields=["state"])
            message = (f"{host.name} is no longer drained; polling puts it at {host.state}." if changed
                       else f"{host.name} was not drained (it is {host.state}); nothing changed.")
        host = self.get_queryset().get(pk=host.pk)
        return Response(s.HostActionResultSerializer({"changed": changed, "message": message, "host": host}).data)

    @CHECK
    @extend_schema(methods=["POST"], request=s.DrainSerializer, responses=s.HostActionResultSerializer,
                   summary="Drain a host: running work goes on, its GPUs are offered to no one")
    @action(detail=True, methods=["get", "post"])
    def drain(self, request, host=None):
        return self._act("drain", request)

    @CHECK
    @extend_schema(methods=["POST"], request=None, responses=s.HostActionResultSerializer,
                   summary="Undrain a host: polling decides its state again")
    @action(detail=True, methods=["get", "post"])
    def undrain(self, request, host=None):
        return self._act("undrain", request)


@extend_schema_view(list=extend_schema(summary="List GPUs"))
class GpuViewSet(mixins.ListModelMixin, ReadViewSet):
    serializer_class = s.GpuSerializer
    filter_specs = (
        Spec("host", "host__name", description="Host name."),
        Spec("pool", "host__pool__name", description="Pool name."),
        Spec("model", "model", description="GPU model, e.g. NVIDIA H100 80GB HBM3."),
        Spec("fp64_class", "fp64_class", "choice", tuple(Gpu.Fp64.values)),
        Spec("present", "present", "bool", description="In the host's latest report."),
        Spec("allocated", "allocated", "bool", description="Held by an active placement."),
    )
    ordering_fields = ["id", "index", "model", "memory_mib", "utilization", "temperature_c"]
    ordering = ["host__name", "index"]

    def get_queryset(self):
        return Gpu.objects.select_related("host", "host__pool").annotate(
            allocated=Exists(_allocated_gpus().filter(gpu=OuterRef("pk"))))


@extend_schema_view(list=extend_schema(summary="Pools with their GPUs and jobs"))
class PoolViewSet(mixins.ListModelMixin, ReadViewSet):
    serializer_class = s.PoolSerializer
    filter_specs = (Spec("name", "name"),)
    ordering_fields = ["name"]
    ordering = ["name"]

    def get_queryset(self):
        return Pool.objects.annotate(
            n_hosts=_count(Host.objects.filter(pool=OuterRef("pk")), "pool"),
            n_gpus=_count(Gpu.objects.filter(host__pool=OuterRef("pk"), present=True), "host__pool"),
            # Distinct GPUs: shares of one GPU held by several jobs count once.
            n_gpus_allocated=_count(Gpu.objects.filter(host__pool=OuterRef("pk")).filter(
                Exists(_allocated_gpus().filter(gpu=OuterRef("pk")))), "host__pool"),
            n_jobs_queued=_count(Job.objects.filter(pool=OuterRef("pk"), state__in=QUEUED), "pool"),
            n_jobs_running=_count(Job.objects.filter(pool=OuterRef("pk"), state__in=RUNNING), "pool"),
        )


@extend_schema_view(list=extend_schema(summary="Tenants with their usage and quotas"))
class TenantViewSet(mixins.ListModelMixin, ReadViewSet):
    serializer_class = s.TenantSerializer
    filter_specs = (Spec("name", "name"),)
    ordering_fields = ["name", "usage_gpu_seconds"]
    ordering = ["name"]

    def get_queryset(self):
        return Tenant.objects.prefetch_related(
            Prefetch("quotas", queryset=TenantQuota.objects.select_related("pool").order_by("pool__name"))).annotate(
            gpus_in_use=_count(_allocated_gpus().filter(placement__job__tenant=OuterRef("pk")), "placement__job__tenant"),
            jobs_queued=_count(Job.objects.filter(tenant=OuterRef("pk"), state__in=QUEUED), "tenant"),
            jobs_running=_count(Job.objects.filter(tenant=OuterRef("pk"), state__in=RUNNING), "tenant"),
        )


# --- fabric ---------------------------------------------------------------------------------


@extend_schema_view(list=extend_schema(summary="List switches"))
class SwitchViewSet(mixins.ListModelMixin, ReadViewSet):
    serializer_class = s.SwitchSerializer
    filter_specs = (
        Spec("fabric", "fabric__name", description="Fabric name."),
        Spec("tier", "tier", "choice", tuple(Switch.Tier.values)),
        Spec("present", "present", "bool", description="Seen in the latest discovery."),
    )
    ordering_fields = ["description", "guid", "tier", "last_seen"]
    ordering = ["fabric__name", "description"]

    def get_queryset(self):
        return Switch.objects.select_related("fabric")


@extend_schema_view(list=extend_schema(summary="List links"))
class LinkViewSet(mixins.ListModelMixin, ReadViewSet):
    serializer_class = s.LinkSerializer
    filter_specs = (
        Spec("fabric", "fabric__name", description="Fabric name."),
        Spec("state", "state", "choice", tuple(Link.State.values)),
        Spec("kind", "kind", "choice", tuple(Link.Kind.values)),
    )
    ordering_fields = ["key", "state", "gbps", "last_seen"]
    ordering = ["fabric__name", "key"]

    def get_queryset(self):
        ends = ["port_a__switch", "port_a__adapter", "port_b__switch", "port_b__adapter"]
        return Link.objects.select_related("fabric", "port_a", "port_b", *ends)


@extend_schema_view(list=extend_schema(summary="List fabric events"))
class FabricEventViewSet(mixins.ListModelMixin, ReadViewSet):
    serializer_class = s.FabricEventSerializer
    filter_specs = (
        Spec("fabric", "fabric__name", description="Fabric name."),
        Spec("kind", "kind", "choice", tuple(FabricEvent.Kind.values)),
        Spec("severity", "severity", "choice", tuple(FabricEvent.Severity.values)),
        Spec("since", "created_at__gte", "datetime", description="Only events at or after this time."),
    )
    ordering_fields = ["created_at", "id"]
    ordering = ["-created_at", "-id"]

    def get_queryset(self):
        return FabricEvent.objects.select_related("fabric")


# --- cycles ---------------------------------------------------------------------------------


@extend_schema_view(list=extend_schema(summary="List allocation cycles"),
                    retrieve=extend_schema(summary="One allocation cycle"))
class CycleViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ReadViewSet):
    lookup_url_kwarg = "cycle_id"
    serializer_class = s.CycleSerializer
    filter_specs = (Spec("since", "started_at__gte", "datetime", description="Only cycles started at or after this."),)
    ordering_fields = ["id", "started_at"]
    ordering = ["-started_at", "-id"]

    def get_queryset(self):
        return AllocationCycle.objects.all()
