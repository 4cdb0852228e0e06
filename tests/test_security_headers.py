"""Security headers on every response (CSP, X-Frame-Options, Referrer-Policy, nosniff), and
the production settings: HSTS and secure cookies on HTTPS, a redirect from HTTP, the proxy
header only when configured, `check --deploy` clean. Whether the dashboard works under
the CSP is proved in Chromium by tests/test_security_escaping.py."""
import json
import subprocess
import sys

import pytest
from django.contrib.auth.models import Group, User
from django.test import override_settings

from core.security import content_security_policy

from .test_settings import ROOT, manage, production_env

pytestmark = pytest.mark.django_db


def directives(header: str) -> dict[str, list[str]]:
    parsed = {}
    for part in header.split(";"):
        name, *sources = part.split()
        parsed[name] = sources
    return parsed


@pytest.fixture
def viewer(client):
    user = User.objects.create_user("vera", password="unused-password-1")
    user.groups.add(Group.objects.get(name="viewer"))
    client.force_login(user)
    return client


@pytest.mark.parametrize("path", ["/", "/login/", "/topology/", "/heatmap/", "/pool/", "/scheduler/", "/fabric/",
                                  "/admin/login/", "/no-such-page/"])
def test_every_response_carries_the_security_headers(viewer, path):
    response = viewer.get(path)
    assert response.status_code in (200, 302, 404)
    csp = directives(response["Content-Security-Policy"])
    # Scripts only from this site: no inline script, no other origin can run.
    assert csp["script-src"] == ["'self'", "'unsafe-eval'"]
    assert csp["default-src"] == ["'self'"] and csp["object-src"] == ["'none'"]
    assert csp["frame-ancestors"] == ["'none'"] and csp["base-uri"] == ["'self'"] and csp["form-action"] == ["'self'"]
    assert response["X-Frame-Options"] == "DENY"
    assert response["Referrer-Policy"] == "same-origin"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Cross-Origin-Opener-Policy"] == "same-origin"


def test_the_policy_can_be_tightened_or_reported_only_by_settings(viewer):
    with override_settings(CONTENT_SECURITY_POLICY={"script-src": "'self'", "img-src": None}):
        header = content_security_policy()
    assert directives(header)["script-src"] == ["'self'"] and "img-src" not in directives(header)
    with override_settings(CONTENT_SECURITY_POLICY_REPORT_ONLY=True):
        from django.test import Client

        client = Client()
        response = client.get("/login/")
    assert "Content-Security-Policy" not in response and "Content-Security-Policy-Report-Only" in response


# --- production settings, in a process of their own -----------------------------------------

PROBE = r"""
import json
from django.test import Client
c = Client()
out = {}
for name, kwargs in {"http": {}, "https": {"secure": True}, "proxied": {"HTTP_X_FORWARDED_PROTO": "https"}}.items():
    r = c.get("/login/", **kwargs)
    out[name] = {"status": r.status_code, "location": r.get("Location"), "hsts": r.get("Strict-Transport-Security"),
                 "csp": r.get("Content-Security-Policy"), "xfo": r.get("X-Frame-Options"),
                 "cookie": str(r.cookies.get("csrftoken", ""))}
print(json.dumps(out))
"""


def probe(tmp_path, **overrides):
    env = production_env(ALLOWED_HOSTS="testserver", FABRICPOOL_VAR_DIR=str(tmp_path), DATABASE_URL=None, **overrides)
    result = subprocess.run([sys.executable, "manage.py", "shell", "-c", PROBE], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_production_redirects_http_and_sends_hsts_and_secure_cookies_on_https(tmp_path):
    seen = probe(tmp_path)
    assert seen["http"]["status"] == 301 and seen["http"]["location"] == "https://testserver/login/"
    assert seen["http"]["hsts"] is None  # HSTS only over HTTPS
    for name in ("https", "proxied"):  # proxied: the default trusts X-Forwarded-Proto from the proxy
        assert seen[name]["status"] == 200
        assert seen[name]["hsts"] == "max-age=31536000; includeSubDomains; preload"
        assert seen[name]["xfo"] == "DENY" and "frame-ancestors 'none'" in seen[name]["csp"]
        assert "; Secure" in seen[name]["cookie"] and "SameSite=Lax" in seen[name]["cookie"]


def test_production_ignores_the_proxy_header_when_told_there_is_no_proxy(tmp_path):
    seen = probe(tmp_path, SECURE_PROXY_SSL_HEADER="none", SECURE_HSTS_SECONDS="600",
                 SECURE_HSTS_PRELOAD="false")
    assert seen["proxied"]["status"] == 301  # a client cannot claim https
    assert seen["https"]["hsts"] == "max-age=600; includeSubDomains"


def test_check_deploy_reports_nothing_without_a_proxy_either():
    """The default (behind a proxy) is checked by tests/test_settings.py."""
    result = manage("check", "--deploy", "--fail-level", "WARNING", env=production_env(SECURE_PROXY_SSL_HEADER="none"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues (0 silenced)." in result.stdout
