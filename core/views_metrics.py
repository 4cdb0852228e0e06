"""GET /metrics: Prometheus text for scrapers, guarded without a login page in the way.

Who gets in:
* a logged-in admin (session), to look at it in a browser;
* a scraper that passes every guard configured: the bearer token (METRICS_TOKEN, compared
  in constant time) and the address allow-list (METRICS_ALLOWED_IPS, matched against
  REMOTE_ADDR: a proxy in front must be the one listed, forwarded headers are not trusted).
With neither configured, scrapers are refused with a 403 that says what to set.
"""
from __future__ import annotations

import functools
import hashlib
import hmac
import ipaddress

from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from .metrics import registry
from .roles import ADMIN, user_role

NOT_CONFIGURED = ("/metrics is closed: set METRICS_TOKEN (a bearer token for the scraper) and/or "
                  "METRICS_ALLOWED_IPS (the scraper's addresses) on the server, or log in as an admin.\n")


@functools.lru_cache(maxsize=4)
def _networks(entries: tuple[str, ...]):
    networks = []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            raise ImproperlyConfigured(f"METRICS_ALLOWED_IPS: {entry!r} is not an IP address or network") from None
    return tuple(networks)


def _address_allowed(request, entries) -> bool:
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    if address.version == 6 and address.ipv4_mapped:
        address = address.ipv4_mapped
    return any(address in network for network in _networks(tuple(entries)))


def _token_matches(request, token: str) -> bool:
    scheme, _, given = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
    if scheme.lower() != "bearer":
        given = ""
    # Digests of equal length: compare_digest then leaks neither content nor length.
    return hmac.compare_digest(hashlib.sha256(given.strip().encode()).digest(), hashlib.sha256(token.encode()).digest())


def _refused(status: int, message: str) -> HttpResponse:
    response = HttpResponse(message, status=status, content_type="text/plain; charset=utf-8")
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="fabricpool-metrics"'
    return response


@login_not_required
@never_cache
@require_http_methods(["GET", "HEAD"])
def metrics(request):
    token = settings.METRICS_TOKEN
    allowed = settings.METRICS_ALLOWED_IPS
    admin = user_role(request.user) == ADMIN
    if not admin:
        if not token and not allowed:
            return _refused(403, NOT_CONFIGURED)
        if allowed and not _address_allowed(request, allowed):
            return _refused(403, "/metrics: this address is not in METRICS_ALLOWED_IPS.\n")
        if token and not _token_matches(request, token):
            return _refused(401, "/metrics: send the token as `Authorization: Bearer <METRICS_TOKEN>`.\n")
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
