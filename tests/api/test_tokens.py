"""API tokens: created on the dashboard (or by an admin), shown once, stored only as a hash,
usable as `Authorization: Bearer`, revocable; plus the documentation page and the schema."""
import hashlib
import re

import pytest
from django.contrib.auth.models import User
from django.contrib.staticfiles import finders
from django.core.management import call_command
from django.test import Client

from api.models import ApiToken

from .conftest import make_user

pytestmark = pytest.mark.django_db


def logged_in(username="vera", role="viewer", **extra) -> tuple[Client, User]:
    user = make_user(username, role)
    if extra:
        User.objects.filter(pk=user.pk).update(**extra)
        user.refresh_from_db()
    client = Client()
    client.force_login(user)
    return client, user


def create_on_page(client, name="laptop") -> str:
    response = client.post("/api/tokens/", {"action": "create", "name": name})
    assert response.status_code == 201
    found = re.search(r'<code id="new-token">(fpt_[A-Za-z0-9_-]+)</code>', response.content.decode())
    assert found, "the new token is shown on the page"
    return found.group(1)


def api(token, path="/api/v1/jobs/"):
    return Client().get(path, HTTP_AUTHORIZATION=f"Bearer {token}")


def test_a_token_is_shown_once_and_only_its_hash_is_stored(db):
    client, user = logged_in()
    secret = create_on_page(client)
    row = ApiToken.objects.get(user=user)
    assert row.token_hash == hashlib.sha256(secret.encode()).hexdigest()
    assert row.prefix == secret[:12] and row.name == "laptop"
    stored = " ".join(str(v) for v in ApiToken.objects.values_list().get())
    assert secret not in stored and secret[12:] not in stored
    page = client.get("/api/tokens/").content.decode()
    assert secret not in page and f"{row.prefix}…" in page and "never" in page


def test_the_token_works_until_it_is_revoked(db):
    client, user = logged_in()
    secret = create_on_page(client)
    response = api(secret)
    assert response.status_code == 200 and response.json()["count"] == 0
    assert ApiToken.objects.get(user=user).last_used_at is not None
    row = ApiToken.objects.get(user=user)
    revoked = client.post("/api/tokens/", {"action": "revoke", "token": row.pk}, follow=True)
    assert f"Revoked token {row.prefix}… (laptop)" in revoked.content.decode()
    refused = api(secret)
    assert refused.status_code == 401
    assert refused.json()["error"] == {"code": "authentication_failed", "message": "Invalid or revoked API token.",
                                       "fields": {}}


def test_nobody_revokes_someone_elses_token(db):
    owner, _ = logged_in("otto", "operator")
    secret = create_on_page(owner)
    other, _ = logged_in()
    response = other.post("/api/tokens/", {"action": "revoke", "token": ApiToken.objects.get().pk})
    assert response.status_code == 404 and "No such token of yours" in response.content.decode()
    assert api(secret).status_code == 200


def test_wrong_or_malformed_tokens_are_refused(db):
    client, user = logged_in()
    secret = create_on_page(client)
    for header in [f"Bearer {secret[:-1]}x", f"Bearer {secret[:12]}", "Bearer", f"Bearer {secret} extra",
                   "Bearer not-a-token", f"Bearer {secret[:-2]}é"]:
        response = Client().get("/api/v1/jobs/", HTTP_AUTHORIZATION=header)
        assert response.status_code == 401, header
    User.objects.filter(pk=user.pk).update(is_active=False)
    assert api(secret).status_code == 401


def test_the_tokens_page_needs_login_csrf_and_a_name(db):
    assert Client().get("/api/tokens/")["Location"].startswith("/login/")
    client, user = logged_in()
    empty = client.post("/api/tokens/", {"action": "create", "name": "  "})
    assert empty.status_code == 400 and "Give the token a name" in empty.content.decode()
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(user)
    assert strict.post("/api/tokens/", {"action": "create", "name": "x"}).status_code == 403
    assert not ApiToken.objects.exists()
    assert 'href="/api/tokens/"' in client.get("/").content.decode()  # the link in the top bar


def test_an_admin_creates_and_revokes_tokens_in_the_admin(db):
    client, _ = logged_in("ada", "admin", is_staff=True, is_superuser=True)
    bob = make_user("bob", "operator")
    response = client.post("/admin/api/apitoken/add/", {"user": bob.pk, "name": "ci"}, follow=True)
    secret = re.search(r"(fpt_[A-Za-z0-9_-]+)", response.content.decode()).group(1)
    row = ApiToken.objects.get(user=bob)
    assert row.token_hash == hashlib.sha256(secret.encode()).hexdigest()
    assert api(secret).status_code == 200
    client.post("/admin/api/apitoken/", {"action": "revoke", "_selected_action": [row.pk]})
    assert api(secret).status_code == 401


def test_the_documentation_page_is_served_from_our_own_static_files(db):
    assert Client().get("/api/docs/")["Location"].startswith("/login/")
    client, _ = logged_in()
    page = client.get("/api/docs/").content.decode()
    assert 'src="/static/api/docs.js"' in page and 'data-schema-url="/api/schema/?format=json"' in page
    assert "cdn" not in page.lower()
    assert finders.find("api/docs.js")
    schema = client.get("/api/schema/?format=json").json()
    assert schema["openapi"].startswith("3.") and "/api/v1/jobs/" in schema["paths"]
    assert schema["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http", "scheme": "bearer",
        "description": "A personal API token (create one on the dashboard's API tokens page)."}


def test_the_schema_validates_without_warnings(db, tmp_path):
    out = tmp_path / "schema.yaml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(out))
    text = out.read_text()
    for path in ["/api/v1/jobs/{job_id}/cancel/", "/api/v1/placements/{placement_id}/override/",
                 "/api/v1/hosts/{host}/drain/", "/api/v1/fabric/links/", "/api/v1/tenants/"]:
        assert f"  {path}:" in text
