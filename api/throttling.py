"""Rate limits on writes, per user (reads are not limited). API_WRITE_RATE in the settings,
e.g. "120/min"; read on each request so a change takes effect without a restart of tests.
Counts live in Django's default cache: per process unless CACHES points at a shared one."""
from django.conf import settings
from rest_framework import permissions, throttling

DEFAULT_WRITE_RATE = "120/min"


class WriteRateThrottle(throttling.UserRateThrottle):
    scope = "api_write"

    def get_rate(self):
        return getattr(settings, "API_WRITE_RATE", DEFAULT_WRITE_RATE)

    def allow_request(self, request, view):
        if request.method in permissions.SAFE_METHODS:
            return True
        return super().allow_request(request, view)
