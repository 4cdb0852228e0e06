"""Anonymous users see nothing: every URL of the project is walked and must send them to a
login page. Viewers see the pages but change nothing; operators cannot administer; every
POST needs the CSRF token. The walk discovers every URL pattern by itself (apps added later
included), so a new page is covered without editing this file. Login and logout work and
are CSRF-protected. The add_user command gives users exactly one role."""
import hashlib
import re
import uuid

import pytest
from django.apps import apps
from django.contrib.auth.models import Group, User
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from django.urls.converters import IntConverter, UUIDConverter
from django.urls.resolvers import RoutePattern

from fabric.importer import import_file

pytestmark = pytest.mark.django_db

LAB = "ibnetdiscover_nvidia_ufm_lab_hdr_fdr_edr_sharp.txt"
# The only pages anyone may open without logging in. A URL that opts out of login must be
# listed here on purpose (agent endpoints, which check tokens, with tests of their own).
PUBLIC = {"/login/", "/admin/login/"}
# Outside /admin/, only admins may open these (session); the rest of the world needs a token.
ADMIN_ONLY = {"/metrics"}
PASSWORD = "correct horse battery staple"
# What a hand-made POST sends: a decision, in case a view reads the action before the role.
POST_DATA = {"action": "approve", "reason": "walk", "gpus": "1", "name": "walk", "tenant": "1", "pool": "1"}


def all_paths(fill: dict[str, str]) -> list[str]:
    """One concrete path per URL pattern of the project, path parameters filled from
    `fill` by name (a value of the converter's type otherwise)."""
    paths = []

    def value(name, converter=None):
        if name in fill:
            return fill[name]
        if isinstance(converter, UUIDConverter):
            return str(uuid.UUID(int=1))
        return "1" if converter is None or isinstance(converter, IntConverter) else "x"

    def walk(patterns, prefix):
        for entry in patterns:
            route = str(entry.pattern).lstrip("^").rstrip("$").replace("\\Z", "")
            if isinstance(entry.pattern, RoutePattern):  # path("<conv:name>/")
                converters = entry.pattern.converters
                route = re.sub(r"<(?:\w+:)?(\w+)>", lambda m: value(m.group(1), converters.get(m.group(1))), route)
            else:  # re_path(r"^(?P<name>...)/$")
                route = re.sub(r"\(\?P<(\w+)>[^)]*\)", lambda m: value(m.group(1)), route)
                route = route.replace("\\.", ".").replace("/?", "/")
            if isinstance(entry, URLResolver):
                walk(entry.url_patterns, prefix + route)
            elif isinstance(entry, URLPattern):
                paths.append("/" + prefix + route)

    walk(get_resolver().url_patterns, "")
    return sorted(set(paths))


def database_state() -> dict[str, str]:
    """A digest of every table's rows (sessions aside: logging in and out writes them)."""
    state = {}
    for model in apps.get_models():
        if model._meta.label in {"sessions.Session"}:
            continue
        rows = list(model._base_manager.order_by("pk").values_list())
        state[model._meta.label] = hashlib.sha256(repr(rows).encode()).hexdigest()
    return state


def changed(before: dict[str, str]) -> list[str]:
    after = database_state()
    return sorted(label for label in after if after[label] != before.get(label))


@pytest.fixture
def lab(sample):
    return import_file(sample(LAB), "lab", source_name=LAB).fabric


@pytest.fixture
def filled(lab):
    from pool.models import Host, Pool
    from scheduler.models import AllocationCycle, Job, Placement, Tenant

    switch = lab.switches.order_by("guid").first()
    host = Host.objects.create(name="r-dcs96", fabric=lab)  # for /pool/hosts/<host>/
    # For /scheduler/jobs/<job_id>/, /scheduler/placements/<placement_id>/ and /scheduler/cycles/<cycle_id>/.
    job = Job.objects.create(tenant=Tenant.objects.create(name="walkers"), pool=Pool.objects.create(name="walk"), gpus=1,
                             command=["true"])
    cycle = AllocationCycle.objects.create()
    placement = Placement.objects.create(job=job, cycle=cycle)
    return {"name": lab.name, "guid": switch.guid, "app_label": "fabric", "object_id": str(switch.pk), "url": "nowhere/",
            "host": host.name, "job_id": str(job.pk), "placement_id": str(placement.pk), "cycle_id": str(cycle.pk)}


def make_user(username, role, **extra):
    user = User.objects.create_user(username, password=PASSWORD, **extra)
    if role:
        user.groups.add(Group.objects.get(name=role))
    return user


def test_the_walk_covers_the_dashboard_and_the_admin(filled):
    paths = all_paths(filled)
    for expected in ["/", "/fabric/", "/fabric/lab/", "/fabric/lab/links/", f"/fabric/lab/switches/{filled['guid']}/",
                     "/pool/", "/pool/hosts/r-dcs96/", "/scheduler/", "/scheduler/jobs/", "/scheduler/cycles/",
                     "/scheduler/submit/", f"/scheduler/jobs/{filled['job_id']}/",
                     f"/scheduler/placements/{filled['placement_id']}/",
                     f"/scheduler/placements/{filled['placement_id']}/override/",
                     f"/scheduler/cycles/{filled['cycle_id']}/", "/login/", "/logout/", "/admin/", "/admin/fabric/switch/",
                     f"/admin/fabric/switch/{filled['object_id']}/change/", "/admin/nowhere/",
                     # Apps added later are found by themselves: the API (router patterns) and /metrics.
                     "/metrics", "/api/v1/jobs/", f"/api/v1/placements/{filled['placement_id']}/approve/",
                     f"/api/v1/hosts/{filled['host']}/drain/"]:
        assert expected in paths
    assert len(paths) > 60


def test_anonymous_users_are_sent_to_log_in_everywhere(client, filled):
    wrong = []
    for path in all_paths(filled):
        response = client.get(path)
        if path in PUBLIC:
            if response.status_code != 200:
                wrong.append(f"{path}: public page answered {response.status_code}")
            continue
        # The admin's own views send to its login page, the rest to the dashboard's.
        logins = ("/login/?next=", "/admin/login/?next=") if path.startswith("/admin/") else ("/login/?next=",)
        if response.status_code == 302:
            if not response["Location"].startswith(logins):
                wrong.append(f"{path}: redirected to {response['Location']}")
        elif response.status_code not in (401, 403):  # non-HTML endpoints may refuse instead
            wrong.append(f"{path}: anonymous got {response.status_code}")
    assert not wrong, "\n".join(wrong)


def test_anonymous_post_is_refused_too(client, filled):
    response = client.post("/fabric/lab/", {})
    assert response.status_code in (302, 403)
    assert response.status_code == 403 or response["Location"].startswith("/login/")


def test_anonymous_posts_with_a_valid_csrf_token_change_nothing_anywhere(filled):
    client = Client(enforce_csrf_checks=True)
    token = csrf_token(client, "/login/")
    before, wrong = database_state(), []
    for path in all_paths(filled):
        if path in PUBLIC:
            continue
        response = client.post(path, {**POST_DATA, "csrfmiddlewaretoken": token}, HTTP_X_CSRFTOKEN=token)
        logins = ("/login/?next=", "/admin/login/?next=")
        if not (response.status_code in (401, 403, 405)
                or (response.status_code == 302 and response["Location"].startswith(logins))):
            wrong.append(f"{path}: anonymous POST got {response.status_code} {response.get('Location', '')}")
    assert not wrong, "\n".join(wrong)
    assert not changed(before)


def test_every_post_without_the_csrf_token_is_refused_even_for_an_admin(filled):
    """A foreign page that makes a logged-in admin's browser post anywhere gets a 403
    (Django's CSRF check, or DRF's for session-authenticated API calls) and changes nothing."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user("root", None, is_staff=True, is_superuser=True))
    before, wrong = database_state(), []
    for path in all_paths(filled):
        response = client.post(path, POST_DATA)
        text = response.content.decode(errors="replace")
        if response.status_code != 403 or "CSRF" not in text:
            wrong.append(f"{path}: POST without CSRF token got {response.status_code} {response.get('Location', '')}")
    assert not wrong, "\n".join(wrong)
    assert not changed(before)
    assert client.get("/").status_code == 200  # still logged in: nothing was refused for want of a session


def test_viewers_see_every_dashboard_page_but_not_the_admin(client, filled):
    client.force_login(make_user("vera", "viewer"))
    wrong = []
    for path in all_paths(filled):
        response = client.get(path)
        if path.startswith("/admin/"):
            # Not staff: back to the admin's login page (its logout goes to its index first).
            target = "/admin/" if path == "/admin/logout/" else "/admin/login/"
            ok = (path == "/admin/login/" and response.status_code == 200) or (
                response.status_code == 302 and response["Location"].startswith(target)
            )
        elif path in ADMIN_ONLY:
            ok = response.status_code == 403
        elif path == "/login/":
            ok = response.status_code == 302  # already logged in
        else:
            # 405: the URL takes only POST (logout, an override's check and confirm steps).
            ok = response.status_code in (200, 405)
        if not ok:
            wrong.append(f"{path}: viewer got {response.status_code} {response.get('Location', '')}")
    assert not wrong, "\n".join(wrong)


# URLs that decide or act (found by name, so new ones are caught): a viewer's POST gets a 403.
DECIDING = re.compile(r"/(approve|reject|override|check|confirm|drain|undrain|cancel|submit)/$|/placements/\d+/$"
                      r"|^/scheduler/jobs/\d+/$|^/pool/hosts/|^/api/v1/(jobs|placements|hosts)/$")
# Writes every role may do for itself.
SELF_SERVICE = {"/logout/", "/api/tokens/"}


def test_viewers_cannot_decide_or_change_anything_by_post(filled):
    """With a valid CSRF token, a viewer's POST to every URL (approve, reject, override,
    drain, submit, the API, the admin) is refused, and no POST changes the database."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user("vera", "viewer"))
    token = csrf_token(client, "/")

    def walk(check_each):
        wrong, deciding = [], 0
        for path in all_paths(filled):
            if path in SELF_SERVICE:
                continue
            before = database_state() if check_each else None
            response = client.post(path, {**POST_DATA, "csrfmiddlewaretoken": token}, HTTP_X_CSRFTOKEN=token)
            if path.startswith("/admin/"):
                ok = (path == "/admin/login/" and response.status_code == 200) or (
                    response.status_code == 302 and response["Location"].startswith(("/admin/login/", "/admin/")))
            elif DECIDING.search(path):
                deciding += 1
                ok = response.status_code == 403
            else:  # read-only pages may answer a POST like a GET, or refuse it
                ok = response.status_code < 500
            if not ok:
                wrong.append(f"{path}: viewer POST got {response.status_code} {response.get('Location', '')}")
            if check_each and changed(before):
                wrong.append(f"{path}: a viewer's POST changed {', '.join(changed(before))}")
        return wrong, deciding

    before = database_state()
    wrong, deciding = walk(check_each=False)
    if changed(before):  # walk again, a digest per request, to name the URL that wrote
        wrong += [f"the walk changed {', '.join(changed(before))}"] + walk(check_each=True)[0]
    assert not wrong, "\n".join(wrong)
    assert deciding >= 10  # the placement and job pages, override (+check, confirm), submit, the host page, the API's
    assert client.get("/").status_code == 200


def test_operators_cannot_administer(filled):
    """Operators decide but do not administer: every admin URL and every admin-only page
    refuses them, by GET and by POST with a valid token, and nothing changes."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user("otto", "operator"))
    token = csrf_token(client, "/")
    before, wrong = database_state(), []
    for path in all_paths(filled):
        if not (path.startswith("/admin/") or path in ADMIN_ONLY) or path == "/admin/login/":
            continue
        for method in ("get", "post"):
            response = getattr(client, method)(path, {**POST_DATA, "csrfmiddlewaretoken": token} if method == "post" else {},
                                               HTTP_X_CSRFTOKEN=token)
            if path in ADMIN_ONLY:
                ok = response.status_code == 403 or (method == "post" and response.status_code == 405)
            else:
                ok = response.status_code == 302 and response["Location"].startswith(("/admin/login/", "/admin/"))
            if not ok:
                wrong.append(f"{method.upper()} {path}: operator got {response.status_code} {response.get('Location', '')}")
    assert not wrong, "\n".join(wrong)
    assert not changed(before)
    assert client.get("/admin/login/").status_code == 200  # the login form, for another account


def test_login_with_the_right_password_and_only_with_it(client):
    make_user("otto", "operator")
    page = client.get("/login/").content.decode()
    assert 'name="username"' in page and 'type="password"' in page and 'autocomplete="current-password"' in page
    bad = client.post("/login/", {"username": "otto", "password": "wrong"})
    assert bad.status_code == 200
    assert "Please enter a correct username and password" in bad.content.decode()
    assert client.get("/").status_code == 302
    good = client.post("/login/", {"username": "otto", "password": PASSWORD})
    assert good.status_code == 302 and good["Location"] == "/"
    page = client.get("/").content.decode()
    assert "otto" in page and '<span class="role" title="role">operator</span>' in page


def test_login_follows_next_but_never_off_site(client):
    make_user("vera", "viewer")
    response = client.post("/login/?next=/fabric/", {"username": "vera", "password": PASSWORD, "next": "/fabric/"})
    assert response["Location"] == "/fabric/"
    client.logout()
    response = client.post("/login/", {"username": "vera", "password": PASSWORD, "next": "https://evil.example/"})
    assert response["Location"] == "/"


def test_logout_takes_a_post_and_ends_the_session(client):
    client.force_login(make_user("vera", "viewer"))
    assert client.get("/logout/").status_code == 405
    assert client.get("/").status_code == 200
    response = client.post("/logout/")
    assert response.status_code == 302 and response["Location"] == "/login/"
    assert client.get("/").status_code == 302


def csrf_token(client, path):
    client.get(path)
    return client.cookies["csrftoken"].value


def test_login_post_needs_the_csrf_token():
    make_user("vera", "viewer")
    client = Client(enforce_csrf_checks=True)
    refused = client.post("/login/", {"username": "vera", "password": PASSWORD})
    assert refused.status_code == 403
    assert client.get("/").status_code == 302  # not logged in
    token = csrf_token(client, "/login/")
    accepted = client.post("/login/", {"username": "vera", "password": PASSWORD, "csrfmiddlewaretoken": token})
    assert accepted.status_code == 302 and accepted["Location"] == "/"
    assert client.get("/").status_code == 200


def test_logout_post_needs_the_csrf_token():
    """A foreign page cannot log an operator out by posting to /logout/."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user("vera", "viewer"))
    assert client.post("/logout/").status_code == 403
    assert client.get("/").status_code == 200  # still logged in
    token = csrf_token(client, "/")
    response = client.post("/logout/", {"csrfmiddlewaretoken": token})
    assert response.status_code == 302
    assert client.get("/").status_code == 302


def test_admin_link_only_for_staff(client):
    client.force_login(make_user("otto", "operator"))
    assert 'href="/admin/"' not in client.get("/").content.decode()
    client.force_login(make_user("ada", "admin", is_staff=True))
    assert '<a href="/admin/">Admin</a>' in client.get("/").content.decode()


# --- add_user ------------------------------------------------------------------------------

def run_add_user(*args):
    from io import StringIO

    out = StringIO()
    call_command("add_user", *args, stdout=out)
    return out.getvalue().strip()


def test_add_user_creates_each_role(client, monkeypatch):
    monkeypatch.setenv("NEW_PASSWORD", PASSWORD)
    assert run_add_user("ada", "--role", "admin", "--password-env", "NEW_PASSWORD") == "created user ada with role admin (password set)"
    ada = User.objects.get(username="ada")
    assert ada.is_staff and not ada.is_superuser and [g.name for g in ada.groups.all()] == ["admin"]
    assert ada.has_perm("fabric.delete_switch") and ada.has_perm("auth.add_user")
    assert client.login(username="ada", password=PASSWORD)
    assert client.get("/admin/fabric/switch/").status_code == 200

    assert "created user vera with role viewer" in run_add_user("vera", "--role", "viewer", "--password", PASSWORD)
    vera = User.objects.get(username="vera")
    assert not vera.is_staff and vera.has_perm("fabric.view_link") and not vera.has_perm("pool.change_host")


def test_add_user_changes_the_role_and_password_of_an_existing_user(client):
    run_add_user("otto", "--role", "admin", "--password", PASSWORD)
    User.objects.filter(username="otto").update(is_superuser=True)
    out = run_add_user("otto", "--role", "operator", "--password", "another fine passphrase")
    assert out == "updated user otto: role admin → operator, superuser status removed, password changed"
    otto = User.objects.get(username="otto")
    assert [g.name for g in otto.groups.all()] == ["operator"] and not otto.is_staff and not otto.is_superuser
    assert otto.has_perm("pool.drain_host") and not otto.has_perm("fabric.delete_switch")
    assert client.login(username="otto", password="another fine passphrase")
    assert run_add_user("otto", "--role", "operator") == "updated user otto: role operator unchanged"


def test_add_user_without_password_cannot_log_in(client):
    out = run_add_user("nopass", "--role", "viewer")
    assert "no password" in out
    assert not User.objects.get(username="nopass").has_usable_password()


@pytest.mark.parametrize(
    "args, message",
    [
        (["x", "--role", "viewer", "--password-env", "FABRICPOOL_UNSET_VAR"], "environment variable FABRICPOOL_UNSET_VAR is not set"),
        (["x", "--role", "viewer", "--password", "1234"], "password rejected: This password is too short"),
        (["x", "--role", "viewer", "--password", ""], "the password is empty"),
        (["  ", "--role", "viewer"], "the user name is empty"),
    ],
)
def test_add_user_errors_are_clear_and_change_nothing(args, message, monkeypatch):
    monkeypatch.delenv("FABRICPOOL_UNSET_VAR", raising=False)
    with pytest.raises(CommandError, match=re.escape(message)):
        run_add_user(*args)
    assert not User.objects.exists()


def test_add_user_rejects_an_unknown_role():
    with pytest.raises(CommandError, match="invalid choice: 'root'"):
        run_add_user("x", "--role", "root")
    assert not User.objects.exists()


@pytest.mark.django_db
def test_an_account_without_a_role_sees_nothing(client):
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_user("norole", password="x-very-long-pass")
    client.force_login(user)
    for path in ("/", "/fabric/", "/pool/"):
        response = client.get(path)
        assert response.status_code == 403
        assert b"no role" in response.content
    assert client.post("/logout/").status_code in (200, 302)
