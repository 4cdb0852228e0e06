"""/api/v1/ (the REST API), /api/schema/ (OpenAPI 3), /api/docs/ (its documentation page)
and /api/tokens/ (a user's API tokens)."""
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView
from rest_framework.routers import DefaultRouter

from . import pages, views

router = DefaultRouter(trailing_slash=True)
router.include_format_suffixes = False
router.register("jobs", views.JobViewSet, basename="job")
router.register("placements", views.PlacementViewSet, basename="placement")
router.register("hosts", views.HostViewSet, basename="host")
router.register("gpus", views.GpuViewSet, basename="gpu")
router.register("pools", views.PoolViewSet, basename="pool")
router.register("tenants", views.TenantViewSet, basename="tenant")
router.register("fabric/switches", views.SwitchViewSet, basename="switch")
router.register("fabric/links", views.LinkViewSet, basename="link")
router.register("fabric/events", views.FabricEventViewSet, basename="fabric-event")
router.register("cycles", views.CycleViewSet, basename="cycle")


def _token_or_session(patterns):
    """API views authenticate in DRF (Bearer token or session), so Django's
    LoginRequiredMiddleware must not send a token client to the login page; DRF's own
    permission answers 401/403 instead."""
    for pattern in patterns:
        pattern.callback.login_required = False
    return patterns


schema = SpectacularAPIView.as_view()
schema.login_required = False

app_name = "api"
urlpatterns = [
    path("v1/", include(_token_or_session(router.urls))),
    path("schema/", schema, name="schema"),
    path("docs/", pages.docs, name="docs"),
    path("tokens/", pages.tokens, name="tokens"),
]
