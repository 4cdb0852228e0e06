"""Browser-facing hardening that Django does not ship: a Content-Security-Policy header, and
a limit on failed logins per user name and client address.

CSP: every script is a static file (no inline <script>, no inline handlers), so scripts are
'self' only. Two allowances, both for plotly.js: its WebGL traces (scattergl on the topology
page) compile their draw calls with `new Function` (regl), hence 'unsafe-eval'; and plotly
sets inline styles and draws heatmaps as data: images. The live views connect back to the
same origin ('self' covers ws:/wss: there). Tests: tests/test_security_headers.py and a
Chromium run that records CSP violations on every dashboard page.

Login limit: LOGIN_FAILURE_LIMIT failures for one user name from one address within
LOGIN_FAILURE_WINDOW_S seconds and further attempts are refused, password unchecked, with
a message that says so and for how long. The counter lives in Django's cache (Redis, shared
by every server process) and a successful login clears it. If the cache is down the
limit is not enforced (logged): operators can still log in during a Redis outage.
"""
import hashlib
import logging
import time

from django import forms
from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.core.cache import cache

log = logging.getLogger(__name__)

DEFAULT_CSP = {
    "default-src": "'self'",
    "script-src": "'self' 'unsafe-eval'",
    "style-src": "'self' 'unsafe-inline'",
    "img-src": "'self' data: blob:",
    "font-src": "'self' data:",
    "connect-src": "'self'",
    "worker-src": "'self' blob:",
    "object-src": "'none'",
    "base-uri": "'self'",
    "form-action": "'self'",
    "frame-ancestors": "'none'",
}


def content_security_policy() -> str:
    """settings.CONTENT_SECURITY_POLICY (a dict of directive -> sources) over the default;
    a directive set to None is dropped."""
    policy = dict(DEFAULT_CSP)
    policy.update(getattr(settings, "CONTENT_SECURITY_POLICY", {}) or {})
    return "; ".join(f"{name} {value}".strip() for name, value in policy.items() if value is not None)


class ContentSecurityPolicyMiddleware:
    """Adds Content-Security-Policy to every response that has none yet (a view may set its
    own). CONTENT_SECURITY_POLICY_REPORT_ONLY=True sends it as report-only instead."""

    def __init__(self, get_response):
        self.get_response = get_response
        self.header = (
            "Content-Security-Policy-Report-Only"
            if getattr(settings, "CONTENT_SECURITY_POLICY_REPORT_ONLY", False)
            else "Content-Security-Policy"
        )
        self.policy = content_security_policy()

    def __call__(self, request):
        response = self.get_response(request)
        if self.header not in response:
            response[self.header] = self.policy
        return response


# --- login rate limit -------------------------------------------------------------------------


def _limit() -> int:
    return int(getattr(settings, "LOGIN_FAILURE_LIMIT", 5))


def _window() -> int:
    return int(getattr(settings, "LOGIN_FAILURE_WINDOW_S", 900))


def client_address(request) -> str:
    """REMOTE_ADDR. Behind a proxy every client shares the proxy's address, which only makes
    the limit stricter (it still counts per user name)."""
    return (request.META.get("REMOTE_ADDR") or "unknown") if request is not None else "unknown"


def _key(username: str, address: str) -> str:
    # Hashed: user names are free text, cache keys are not.
    digest = hashlib.sha256(f"{username.strip().casefold()}\0{address}".encode()).hexdigest()
    return f"login-failures:{digest}"


def failures(username: str, address: str) -> tuple[int, float]:
    """(failed attempts in the current window, seconds until the window ends)."""
    key = _key(username, address)
    try:
        entry = cache.get_many([key, key + ":since"])
    except Exception:  # the cache is Redis: an outage must not lock everyone out
        log.warning("login rate limit not enforced: the cache is unavailable", exc_info=True)
        return 0, 0.0
    count, since = entry.get(key, 0), entry.get(key + ":since", time.time())
    return count, max(0.0, since + _window() - time.time())


def record_failure(username: str, address: str) -> None:
    """Counts atomically (add then incr), so parallel guesses are all counted; the window
    runs from the first failure and both keys expire with it."""
    key = _key(username, address)
    for _attempt in range(2):  # the key can expire between add and incr: then a new window
        try:
            cache.add(key + ":since", time.time(), timeout=_window())
            cache.add(key, 0, timeout=_window())
            cache.incr(key)
            return
        except ValueError:
            continue
        except Exception:
            log.warning("login failure not counted: the cache is unavailable", exc_info=True)
            return


def clear_failures(username: str, address: str) -> None:
    key = _key(username, address)
    try:
        cache.delete_many([key, key + ":since"])
    except Exception:
        log.warning("login failures not cleared: the cache is unavailable", exc_info=True)


class RateLimitMixin:
    """For AuthenticationForm: refuse before checking the password once the limit is hit."""

    error_messages = {
        **AuthenticationForm.error_messages,
        "rate_limited": (
            "Too many failed logins for this user from your address. "
            "Try again in %(minutes)s minute(s)."
        ),
    }

    def clean(self):
        username = self.cleaned_data.get("username") or ""
        address = client_address(self.request)
        count, remaining = failures(username, address)
        if count >= _limit():
            log.warning("login refused for %r from %s: %d failures", username, address, count)
            raise forms.ValidationError(
                self.error_messages["rate_limited"],
                code="rate_limited",
                params={"minutes": max(1, -(-int(remaining) // 60))},
            )
        try:
            cleaned = super().clean()
        except forms.ValidationError as error:
            if any(e.code == "invalid_login" for e in error.error_list):
                record_failure(username, address)
            raise
        clear_failures(username, address)
        return cleaned


class RateLimitedAuthenticationForm(RateLimitMixin, AuthenticationForm):
    pass


class RateLimitedAdminAuthenticationForm(RateLimitMixin, AdminAuthenticationForm):
    error_messages = {**AdminAuthenticationForm.error_messages, **RateLimitMixin.error_messages,
                      "invalid_login": AdminAuthenticationForm.error_messages["invalid_login"]}
