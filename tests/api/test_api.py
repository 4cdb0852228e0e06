"""The REST API as its users meet it: every endpoint with each role, the actions going
through the dashboard's services (same rules, same audit), one error shape naming the field
and the problem, filters, ordering and pagination, and the write rate limit."""
import pytest
from django.test import Client, override_settings

from pool.models import Host, HostEvent
from scheduler.models import AuditEvent, Job, Placement

from .conftest import caller, propose

pytestmark = pytest.mark.django_db

LISTS = ["/api/v1/", "/api/v1/jobs/", "/api/v1/placements/", "/api/v1/hosts/", "/api/v1/gpus/", "/api/v1/pools/",
         "/api/v1/tenants/", "/api/v1/fabric/switches/", "/api/v1/fabric/links/", "/api/v1/fabric/events/",
         "/api/v1/cycles/"]


@pytest.fixture
def seeded(cluster, tenant):
    from scheduler.models import AllocationCycle

    placement = propose(tenant)
    cycle = AllocationCycle.objects.create(pending_reasons={"no_capacity": 2})
    return {"placement": placement, "job": placement.job, "cycle": cycle}


def read_paths(seeded) -> list[str]:
    p, j, c = seeded["placement"], seeded["job"], seeded["cycle"]
    return LISTS + [f"/api/v1/jobs/{j.pk}/", f"/api/v1/jobs/{j.pk}/cancel/", f"/api/v1/placements/{p.pk}/",
                    f"/api/v1/placements/{p.pk}/approve/", f"/api/v1/placements/{p.pk}/reject/",
                    f"/api/v1/placements/{p.pk}/override/", "/api/v1/hosts/gpu0001/", "/api/v1/hosts/gpu0001/drain/",
                    "/api/v1/hosts/gpu0001/undrain/", f"/api/v1/cycles/{c.pk}/", "/api/schema/?format=json"]


def error(response) -> dict:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "fields"}, body
    return body["error"]


# --- who may read -------------------------------------------------------------------------


def test_every_role_reads_every_endpoint(seeded, callers):
    for role, who in callers.items():
        wrong = [f"{path}: {r.status_code}" for path in read_paths(seeded) if (r := who.get(path)).status_code != 200]
        assert not wrong, f"{role}: {wrong}"


def test_anonymous_callers_get_401_in_the_error_shape(seeded):
    anonymous = Client()
    for path in read_paths(seeded):
        response = anonymous.get(path)
        assert response.status_code == 401, path
        assert response["WWW-Authenticate"] == 'Bearer realm="api"'
        assert error(response)["code"] == "not_authenticated"
    response = anonymous.post("/api/v1/jobs/", {}, content_type="application/json")
    assert response.status_code == 401


def test_an_account_without_a_role_sees_nothing(seeded):
    nobody = caller("nemo", None)
    response = nobody.get("/api/v1/jobs/")
    assert response.status_code == 403
    assert "no FabricPool role" in error(response)["message"]


def test_session_login_works_and_writes_need_the_csrf_token(seeded, operator):
    from django.contrib.auth.models import User

    browser = Client(enforce_csrf_checks=True)
    browser.force_login(User.objects.get(username="otto"))
    assert browser.get("/api/v1/jobs/").json()["count"] == 1
    job = seeded["job"]
    refused = browser.post(f"/api/v1/jobs/{job.pk}/cancel/")
    assert refused.status_code == 403 and "CSRF" in error(refused)["message"]
    assert Job.objects.get(pk=job.pk).state == Job.State.PROPOSED
    browser.get("/")  # sets the CSRF cookie
    token = browser.cookies["csrftoken"].value
    done = browser.post(f"/api/v1/jobs/{job.pk}/cancel/", HTTP_X_CSRFTOKEN=token)
    assert done.status_code == 200 and done.json()["state"] == "cancelled"


# --- writes, by role ------------------------------------------------------------------------


def submit_body(**extra):
    return {"tenant": "physics", "pool": "main", "gpus": 2, "command": ["python", "train.py", "--epochs", "3"],
            "env": {"SEED": "1"}, "name": "resnet", "gpu_models": ["H100"], "max_leaves": 1, **extra}


def test_viewers_change_nothing(seeded, viewer):
    p, job = seeded["placement"], seeded["job"]
    attempts = [("/api/v1/jobs/", submit_body()), (f"/api/v1/jobs/{job.pk}/cancel/", {}),
                (f"/api/v1/placements/{p.pk}/approve/", {"version": 1}),
                (f"/api/v1/placements/{p.pk}/reject/", {"version": 1}),
                (f"/api/v1/placements/{p.pk}/override/", {"version": 1, "gpus": [5, 6, 7, 8]}),
                ("/api/v1/hosts/gpu0001/drain/", {}), ("/api/v1/hosts/gpu0001/undrain/", {}),
                ("/api/v1/hosts/", {})]  # no POST there at all: still 403 for a viewer (405 for an operator)
    for path, body in attempts:
        response = viewer.post(path, body)
        assert response.status_code == 403, path
        assert "Only operators and admins may" in error(response)["message"], path
        assert "Nothing was changed." in error(response)["message"], path
    assert Job.objects.count() == 1 and Job.objects.get().state == Job.State.PROPOSED
    assert Placement.objects.get().version == 1
    assert Host.objects.get(name="gpu0001").state == Host.State.UP
    # The action URLs say so on GET too.
    check = viewer.get(f"/api/v1/placements/{p.pk}/approve/").json()
    assert (check["allowed"], check["possible"], check["version"]) == (False, True, 1)


@pytest.mark.parametrize("role", ["operator", "admin"])
def test_submit_then_status_then_cancel(cluster, tenant, callers, role):
    who = callers[role]
    response = who.post("/api/v1/jobs/", submit_body())
    assert response.status_code == 201, response.content
    job = response.json()
    assert response["Location"] == f"/api/v1/jobs/{job['id']}/"
    assert (job["state"], job["gpus"], job["tenant"], job["submitted_by"], job["command"]) == (
        "pending", 2, "physics", who.user.username, ["python", "train.py", "--epochs", "3"])
    row = Job.objects.get(pk=job["id"])
    assert (row.env, row.gpu_models, row.max_leaves, row.name) == ({"SEED": "1"}, ["H100"], 1, "resnet")
    assert AuditEvent.objects.filter(job=row, action="submit", actor=who.user.username).exists()

    assert who.get(f"/api/v1/jobs/{job['id']}/").json()["state"] == "pending"
    cancelled = who.post(f"/api/v1/jobs/{job['id']}/cancel/")
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    again = who.post(f"/api/v1/jobs/{job['id']}/cancel/")
    assert again.status_code == 409
    assert error(again) == {"code": "not_cancellable", "fields": {},
                            "message": f"Job {job['id']} is already cancelled; only unfinished jobs can be cancelled."}
    assert who.get(f"/api/v1/jobs/{job['id']}/cancel/").json()["possible"] is False


def test_approve_with_the_version_seen_and_a_stale_one_is_refused(seeded, operator, admin_caller):
    p = seeded["placement"]
    approved = operator.post(f"/api/v1/placements/{p.pk}/approve/", {"version": 1})
    assert approved.status_code == 200
    assert (approved.json()["state"], approved.json()["version"], approved.json()["decided_by_name"]) == (
        "approved", 2, "otto")
    assert Job.objects.get(pk=p.job_id).state == Job.State.APPROVED
    stale = admin_caller.post(f"/api/v1/placements/{p.pk}/reject/", {"version": 1, "reason": "too big"})
    assert stale.status_code == 409
    assert error(stale)["code"] == "changed_under_you"
    assert error(stale)["message"].startswith(f"Placement {p.pk} changed under you: it is now approved by otto")
    # The refusal is audited by the service, as on the dashboard.
    assert AuditEvent.objects.filter(action="reject", refused=True, actor="ada").exists()
    missing = operator.post(f"/api/v1/placements/{p.pk}/approve/", {})
    assert missing.status_code == 400 and error(missing)["fields"] == {"version": ["This field is required."]}


def test_reject_sends_the_job_back_with_the_reason(seeded, operator):
    p = seeded["placement"]
    response = operator.post(f"/api/v1/placements/{p.pk}/reject/", {"version": 1, "reason": "  wait for   the spine "})
    assert response.status_code == 200 and response.json()["state"] == "rejected"
    assert response.json()["reject_reason"] == "wait for the spine"
    job = Job.objects.get(pk=p.job_id)
    assert (job.state, job.pending_reason) == (Job.State.PENDING, "rejected")


def test_override_checks_the_rules_and_moves_the_gpus(seeded, operator):
    p = seeded["placement"]
    others = list(Host.objects.get(name="gpu0002").gpus.order_by("index").values_list("id", flat=True))
    too_few = operator.post(f"/api/v1/placements/{p.pk}/override/", {"version": 1, "gpus": others[:1]})
    assert too_few.status_code == 400
    problem = error(too_few)
    assert problem["code"] == "invalid_override" and problem["fields"]["gpus"]
    assert "break the job's rules" in problem["message"]
    none = operator.post(f"/api/v1/placements/{p.pk}/override/", {"version": 1, "gpus": []})
    assert none.status_code == 400 and "gpus" in error(none)["fields"]
    moved = operator.post(f"/api/v1/placements/{p.pk}/override/", {"version": 1, "gpus": others})
    assert moved.status_code == 200, moved.content
    assert (moved.json()["gpus"], moved.json()["is_override"]) == (sorted(others), True)


def test_drain_and_undrain_a_host(seeded, operator):
    drained = operator.post("/api/v1/hosts/gpu0003/drain/", {"reason": "fan noise"})
    assert drained.status_code == 200
    body = drained.json()
    assert (body["changed"], body["host"]["state"]) == (True, "draining")
    event = HostEvent.objects.get(host__name="gpu0003", kind=HostEvent.Kind.DRAINED)
    assert event.actor == "otto" and "fan noise" in event.message
    again = operator.post("/api/v1/hosts/gpu0003/drain/", {})
    assert (again.json()["changed"], again.json()["message"]) == (False, "gpu0003 was already draining; nothing changed.")
    assert operator.get("/api/v1/hosts/gpu0003/undrain/").json()["possible"] is True
    undrained = operator.post("/api/v1/hosts/gpu0003/undrain/")
    assert undrained.json()["changed"] is True and undrained.json()["host"]["state"] != "draining"


# --- errors ---------------------------------------------------------------------------------


def test_bad_submissions_name_the_field_and_change_nothing(cluster, tenant, operator):
    cases = [
        ({"gpus": 0}, "gpus", "greater than or equal to 1"),
        ({"gpus": "many"}, "gpus", "valid integer"),
        ({"command": []}, "command", "at least 1"),
        ({"command": "python train.py"}, "command", "list"),
        ({"env": {"1BAD": "x"}}, "env", "not a variable name"),
        ({"tenant": "nobody"}, "tenant", "no tenant named 'nobody'; known: physics"),
        ({"pool": "elsewhere"}, "pool", "no pool named 'elsewhere'"),
        ({"task_class": "mining"}, "task_class", "not a valid choice"),
        ({"topology_hard": True, "max_leaves": None}, "max_leaves", "hard limit needs"),
        ({"estimated_runtime_s": 7200, "max_runtime_s": 60}, "estimated_runtime_s", "longer than the maximum"),
    ]
    for change, field, words in cases:
        response = operator.post("/api/v1/jobs/", submit_body(**change))
        assert response.status_code == 400, (change, response.content)
        problem = error(response)
        assert problem["code"] == "invalid"
        assert field in problem["fields"], (change, problem)
        assert words.lower() in " ".join(problem["fields"][field]).lower(), (change, problem)
        assert field in problem["message"]
    assert Job.objects.count() == 0


def test_malformed_json_wrong_method_and_unknown_things(seeded, operator):
    broken = operator.client.post("/api/v1/jobs/", "{not json", content_type="application/json",
                                  HTTP_AUTHORIZATION=f"Bearer {operator.token}")
    assert broken.status_code == 400 and error(broken)["code"] == "parse_error"
    put = operator.client.put("/api/v1/jobs/", "{}", content_type="application/json",
                              HTTP_AUTHORIZATION=f"Bearer {operator.token}")
    assert put.status_code == 405 and error(put)["code"] == "method_not_allowed"
    for path, words in [("/api/v1/jobs/424242/", "Job '424242' does not exist."),
                        ("/api/v1/jobs/abc/", "ids are whole numbers"),
                        ("/api/v1/hosts/nosuchhost/", "Host 'nosuchhost' does not exist."),
                        ("/api/v1/nothing-here/", "No API endpoint at /api/v1/nothing-here/.")]:
        response = operator.get(path)
        assert response.status_code == 404, path
        assert words in error(response)["message"], path
    cancel_missing = operator.post("/api/v1/jobs/424242/cancel/")
    assert cancel_missing.status_code == 404


def test_bad_filters_are_400_not_an_empty_list(seeded, viewer):
    for query, field in [({"state": "sleeping"}, "state"), ({"ordering": "password"}, "ordering"),
                         ({"job": "x"}, "job"), ({"since": "yesterday"}, "since"), ({"present": "maybe"}, "present")]:
        path = {"job": "/api/v1/placements/", "since": "/api/v1/fabric/events/",
                "present": "/api/v1/gpus/"}.get(field, "/api/v1/jobs/")
        response = viewer.get(path, **query)
        assert response.status_code == 400, (path, query)
        assert list(error(response)["fields"]) == [field]


# --- lists ----------------------------------------------------------------------------------


def test_job_filters_ordering_and_pagination(cluster, tenant, operator, admin_caller):
    from scheduler.models import Tenant

    Tenant.objects.create(name="biology")
    for i, (who, tenant_name, priority) in enumerate([(operator, "physics", 5), (operator, "biology", 1),
                                                      (admin_caller, "physics", 9)]):
        assert who.post("/api/v1/jobs/", submit_body(tenant=tenant_name, priority=priority, name=f"j{i}")).status_code == 201
    operator.post(f"/api/v1/jobs/{Job.objects.get(name='j1').pk}/cancel/")

    def names(**query):
        return [j["name"] for j in operator.get("/api/v1/jobs/", **query).json()["results"]]

    assert names() == ["j2", "j1", "j0"]  # newest first
    assert names(tenant="physics") == ["j2", "j0"]
    assert names(user="otto") == ["j1", "j0"]
    assert names(state="cancelled") == ["j1"]
    assert names(state="pending", pool="main") == ["j2", "j0"]
    assert names(pool="other") == []
    assert names(ordering="priority") == ["j1", "j0", "j2"]
    assert names(ordering="-priority") == ["j2", "j0", "j1"]
    page = operator.get("/api/v1/jobs/", page_size=2, ordering="id").json()
    assert (page["count"], [j["name"] for j in page["results"]]) == (3, ["j0", "j1"])
    assert page["next"].endswith("page=2&page_size=2&ordering=id") or "page=2" in page["next"]
    second = operator.get("/api/v1/jobs/", page_size=2, ordering="id", page=2).json()
    assert [j["name"] for j in second["results"]] == ["j2"]
    beyond = operator.get("/api/v1/jobs/", page=9)
    assert beyond.status_code == 404 and error(beyond)["code"] == "not_found"


def test_usage_of_pools_tenants_hosts_and_gpus(seeded, viewer):
    pool = viewer.get("/api/v1/pools/").json()["results"][0]
    assert {k: pool[k] for k in ("name", "hosts", "gpus", "gpus_allocated", "gpus_free")} == {
        "name": "main", "hosts": 8, "gpus": 32, "gpus_allocated": 4, "gpus_free": 28}
    physics = viewer.get("/api/v1/tenants/").json()["results"][0]
    assert (physics["name"], physics["gpus_in_use"], physics["jobs_queued"]) == ("physics", 4, 0)
    assert viewer.get("/api/v1/gpus/", allocated="true").json()["count"] == 4
    assert viewer.get("/api/v1/gpus/", allocated="false", host="gpu0001").json()["count"] == 0
    host = viewer.get("/api/v1/hosts/gpu0001/").json()
    assert (host["gpus"], host["gpus_allocated"], len(host["gpu_list"])) == (4, 4, 4)
    assert viewer.get("/api/v1/hosts/", state="draining").json()["count"] == 0
    links = viewer.get("/api/v1/fabric/links/", kind="adapter_switch").json()
    assert links["count"] == 8 and links["results"][0]["end_b"].startswith("gpu0001")
    assert viewer.get("/api/v1/fabric/switches/", tier="spine").json()["count"] == 2


def test_lists_take_a_fixed_number_of_queries(seeded, viewer, django_assert_max_num_queries):
    for path in LISTS[1:]:
        with django_assert_max_num_queries(6):  # token, role, count, rows, prefetches: not per row
            assert viewer.get(path, page_size=500).status_code == 200


# --- rate limit -----------------------------------------------------------------------------


@override_settings(API_WRITE_RATE="3/min")
def test_writes_are_rate_limited_per_user_and_reads_are_not(cluster, tenant, operator, admin_caller):
    codes = [operator.post("/api/v1/jobs/", submit_body()).status_code for _ in range(4)]
    assert codes == [201, 201, 201, 429]
    limited = operator.post("/api/v1/jobs/", submit_body())
    assert limited.status_code == 429 and int(limited["Retry-After"]) > 0
    problem = error(limited)
    assert problem["code"] == "throttled" and "available in" in problem["message"]
    assert Job.objects.count() == 3
    assert all(operator.get("/api/v1/jobs/").status_code == 200 for _ in range(10))
    assert admin_caller.post("/api/v1/jobs/", submit_body()).status_code == 201  # per user
