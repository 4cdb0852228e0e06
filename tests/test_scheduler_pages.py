"""The scheduler pages, on a small fat tree with jobs submitted through the services and a
real allocation cycle: the queue says why jobs wait, proposals show their cost against the
lower bound and can be approved, rejected or overridden by operators (POST + CSRF), never
by viewers; an override is previewed with its cost next to the proposal's and refused with
the reasons when it breaks a rule; a decision on a placement that changed meanwhile is
refused with "changed under you"; the submit form reports errors per field; lists take a
fixed number of queries; names are escaped."""
import html
import re
import uuid
from datetime import UTC

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from pool.models import Gpu, Host, Pool
from scheduler import cycle, selectors, services
from scheduler.cycle import run_cycle
from scheduler.models import AllocationCycle, AuditEvent, Job, Placement, PlacementGpu, PoolPolicy, Tenant

pytestmark = pytest.mark.django_db

HOSTILE = '<script>alert("x")</script><b>bold</b>'


def make_user(username, role):
    account = User.objects.create_user(username, password="unused-password-1")
    account.groups.add(Group.objects.get(name=role))
    return account


def logged_in(user, **kwargs) -> Client:
    client = Client(**kwargs)
    client.force_login(user)
    return client


def text(response) -> str:
    return response.content.decode()


def plain(fragment: str) -> str:
    """Visible text of an HTML fragment, whitespace collapsed."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


def section(page: str, section_id: str) -> str:
    match = re.search(rf'<section[^>]*id="{section_id}".*?</section>', page, flags=re.S)
    assert match, f"no section {section_id}"
    return match.group(0)


def table_rows(fragment: str) -> list[list[str]]:
    body = fragment.split("<tbody>", 1)[1].split("</tbody>", 1)[0] if "<tbody>" in fragment else ""
    return [[plain(c) for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row, flags=re.S)]
            for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body, flags=re.S)]


class Scene:
    """8 hosts × 4 H100 under 4 leaves (2 hosts each), pool "main" approving by hand, tenant
    physics; jobs "big" (8 GPUs), "small" (4) and "huge" (64, more than the pool has), then
    one allocation cycle."""

    def __init__(self):
        call_command("build_fattree", "--fabric", "sched", "--spines", "2", "--leaves", "4", "--hosts-per-leaf", "2",
                     "--gpus-per-host", "4", "--speed", "EDR", verbosity=0)
        self.pool = Pool.objects.create(name="main")
        Host.objects.filter(fabric__name="sched").update(pool=self.pool, state=Host.State.UP)
        PoolPolicy.objects.create(pool=self.pool, mode=PoolPolicy.Mode.MANUAL)
        self.tenant = Tenant.objects.create(name="physics")
        self.alice = make_user("alice", "operator")
        self.bob = make_user("bob", "operator")
        self.vera = make_user("vera", "viewer")
        self.big = self.submit("big", 8)
        self.small = self.submit("small", 4)
        self.huge = self.submit("huge", 64)
        result = run_cycle()
        assert result.ok, result.error
        self.cycle = AllocationCycle.objects.get(pk=result.cycle_id)

    def submit(self, name, gpus, **extra):
        return services.submit_job(self.alice, tenant="physics", pool="main", gpus=gpus,
                                   command=["python", "train.py"], name=name, **extra)

    def placement(self, job) -> Placement:
        return Placement.objects.get(job=job, state__in=Placement.ACTIVE_STATES)

    def gpus_of(self, placement) -> list[int]:
        return sorted(placement.placement_gpus.filter(active=True).values_list("gpu_id", flat=True))

    def free_hosts(self) -> list[Host]:
        held = PlacementGpu.objects.filter(active=True).values_list("gpu__host_id", flat=True)
        return list(Host.objects.filter(pool=self.pool).exclude(id__in=held).order_by("name"))

    def host_gpus(self, host) -> list[int]:
        return list(Gpu.objects.filter(host=host).order_by("index").values_list("id", flat=True))


@pytest.fixture
def scene(db, monkeypatch):
    # A lock of our own: the cycle's key is per database name, and every in-memory SQLite
    # test database has the same name, so test runs side by side would skip each other's cycles.
    key = f"{cycle.LOCK_PREFIX}:test-pages:{uuid.uuid4().hex}"
    monkeypatch.setattr(cycle, "lock_key", lambda: key)
    return Scene()


# --- the scheduler page ----------------------------------------------------------------------


def test_the_page_shows_proposals_queue_and_cycle_with_their_numbers(scene):
    big, small = scene.placement(scene.big), scene.placement(scene.small)
    assert (big.hosts, big.leaves, big.lower_bound_leaves) == (2, 1, 1)
    response = logged_in(scene.vera).get("/scheduler/")
    assert response.status_code == 200
    page = text(response)

    proposals = {row[0]: row for row in table_rows(section(page, "proposals"))}
    assert set(proposals) == {str(big.pk), str(small.pk)}
    row = proposals[str(big.pk)]
    assert row[1].startswith("big") and "physics" in row[1]
    assert row[2] == "8"
    big_hosts = sorted(PlacementGpu.objects.filter(placement=big).values_list("gpu__host__name", flat=True).distinct())
    assert row[3] == ", ".join(big_hosts)
    assert row[4] == "1 / 1"
    assert row[5].startswith("2 hosts, 0 pod crossings")
    assert big.explanation in row[6]
    assert row[7].startswith("in ")  # expires in ...
    # A viewer sees no decision buttons.
    assert 'value="approve"' not in page and "Override…" not in page

    queue = table_rows(section(page, "queue"))
    assert [r[0] for r in queue] == ["huge"]
    huge = Job.objects.get(pk=scene.huge.pk)
    assert queue[0][1:5] == ["physics", "main", "64", "0"]
    assert huge.pending_reason == "constraints"
    assert huge.pending_message and huge.pending_message in queue[0][6]
    assert queue[0][6].startswith(selectors.REASON_LABELS["constraints"])

    cycles = table_rows(section(page, "cycles"))
    assert cycles[0][0] == str(scene.cycle.pk)
    assert cycles[0][3:7] == ["3", "2", "0", "0"]  # queued, proposed, auto-approved, expired
    assert cycles[0][7] == "1 constraints cannot be met"
    assert f'datetime="{scene.cycle.started_at.astimezone(UTC).isoformat(timespec="seconds")}"' in page

    counts = re.findall(r'aria-label="(\d+) jobs (\w+)"', page)
    assert {s: int(n) for n, s in counts} == {"pending": 1, "preempted": 0, "proposed": 2, "approved": 0,
                                              "dispatching": 0, "running": 0}


def test_operators_see_the_decision_buttons(scene):
    page = text(logged_in(scene.alice).get("/scheduler/"))
    big = scene.placement(scene.big)
    assert f'aria-label="Approve placement {big.pk}"' in page
    assert f'aria-label="Reject placement {big.pk}"' in page
    assert f'href="/scheduler/placements/{big.pk}/override/"' in page
    assert 'name="csrfmiddlewaretoken"' in page


@pytest.mark.parametrize("query, message", [
    ("tenant=nobody", "Unknown tenant 'nobody': tenants are physics."),
    ("pool=deep", "Unknown pool 'deep': pools are main."),
    ("state=succeeded",
     "Unknown state 'succeeded': choose one of pending, preempted, proposed, approved, dispatching, running."),
])
def test_a_bad_filter_gets_a_400_that_names_it(scene, query, message):
    response = logged_in(scene.vera).get(f"/scheduler/?{query}")
    assert response.status_code == 400
    assert html.escape(message) in text(response)


def test_filters_narrow_the_sections(scene):
    Tenant.objects.create(name="biology")
    client = logged_in(scene.vera)
    page = text(client.get("/scheduler/?tenant=biology"))
    assert "No proposal waits for a decision with these filters." in page and "No job waits with these filters." in page
    page = text(client.get("/scheduler/?state=pending"))
    assert 'id="queue"' in page and 'id="proposals"' not in page and 'id="running"' not in page
    page = text(client.get("/scheduler/?state=proposed&tenant=physics&pool=main"))
    assert 'id="proposals"' in page and 'id="queue"' not in page
    assert len(table_rows(section(page, "proposals"))) == 2
    # Preempted jobs wait in the queue too, marked as such.
    Job.objects.filter(pk=scene.huge.pk).update(state=Job.State.PREEMPTED)
    queue = table_rows(section(text(client.get("/scheduler/?state=preempted")), "queue"))
    assert [r[0] for r in queue] == ["huge preempted"]


# --- decisions -----------------------------------------------------------------------------


def test_an_operator_approves_from_the_list_and_the_audit_log_says_who(scene):
    big = scene.placement(scene.big)
    response = logged_in(scene.alice).post(f"/scheduler/placements/{big.pk}/", {
        "action": "approve", "version": big.version, "next": "/scheduler/?state=proposed"})
    assert response.status_code == 302 and response["Location"] == "/scheduler/?state=proposed"
    big.refresh_from_db()
    assert big.state == Placement.State.APPROVED and big.decided_by == scene.alice
    assert Job.objects.get(pk=scene.big.pk).state == Job.State.APPROVED
    event = AuditEvent.objects.get(placement=big, action="approve")
    assert (event.actor, event.refused, event.to_state) == ("alice", False, "approved")
    page = text(logged_in(scene.vera).get(f"/scheduler/placements/{big.pk}/"))
    assert "approved by alice" in plain(page)


def test_after_a_decision_only_local_pages_are_followed(scene):
    small = scene.placement(scene.small)
    response = logged_in(scene.alice).post(f"/scheduler/placements/{small.pk}/", {
        "action": "approve", "version": small.version, "next": "https://evil.example/"})
    assert response.status_code == 302 and response["Location"] == f"/scheduler/placements/{small.pk}/"


def test_an_operator_rejects_with_a_reason_and_the_job_goes_back_to_the_queue(scene):
    small = scene.placement(scene.small)
    gpus = scene.gpus_of(small)
    client = logged_in(scene.alice)
    response = client.post(f"/scheduler/placements/{small.pk}/", {
        "action": "reject", "version": small.version, "reason": "  host   under maintenance "}, follow=True)
    assert response.status_code == 200
    small.refresh_from_db()
    assert small.state == Placement.State.REJECTED and small.reject_reason == "host under maintenance"
    assert not PlacementGpu.objects.filter(gpu_id__in=gpus, active=True).exists()
    job = Job.objects.get(pk=scene.small.pk)
    assert job.state == Job.State.PENDING and job.pending_reason == "rejected"
    event = AuditEvent.objects.get(placement=small, action="reject")
    assert event.actor == "alice" and event.data["reason"] == "host under maintenance"
    page = text(response)
    assert "host under maintenance" in page and f"Rejected placement {small.pk}" in page
    # Back in the queue, with the rejection as its reason.
    queue = {r[0]: r for r in table_rows(section(text(client.get("/scheduler/")), "queue"))}
    assert "Rejected by alice: host under maintenance." in queue["small"][6]


def test_viewers_get_403_on_every_decision_and_nothing_changes(scene):
    big = scene.placement(scene.big)
    events = AuditEvent.objects.count()
    client = logged_in(scene.vera)
    other = scene.host_gpus(scene.free_hosts()[0])
    posts = [
        (f"/scheduler/placements/{big.pk}/", {"action": "approve", "version": big.version}),
        (f"/scheduler/placements/{big.pk}/", {"action": "reject", "version": big.version, "reason": "no"}),
        (f"/scheduler/placements/{big.pk}/override/", {"step": "confirm", "version": big.version, "gpu": other}),
        (f"/scheduler/placements/{big.pk}/override/", {"step": "preview", "version": big.version, "gpu": other}),
        (f"/scheduler/jobs/{scene.big.pk}/", {"action": "cancel"}),
        ("/scheduler/submit/", {"tenant": "physics", "pool": "main", "gpus": 1, "command": "true",
                                "task_class": "training", "priority": 0}),
    ]
    for path, data in posts:
        response = client.post(path, data)
        assert response.status_code == 403, path
        assert "Only operators and admins" in text(response)
    big.refresh_from_db()
    assert big.state == Placement.State.PROPOSED and big.version == 1 and not big.is_override
    assert Job.objects.count() == 3 and AuditEvent.objects.count() == events
    # The placement page and the override page show no forms to a viewer.
    page = text(client.get(f"/scheduler/placements/{big.pk}/"))
    assert 'value="approve"' not in page and "Waiting for an operator's decision." in page
    page = text(client.get(f"/scheduler/placements/{big.pk}/override/"))
    assert 'type="checkbox"' not in page and "Only operators and admins may override" in page
    page = text(client.get("/scheduler/submit/"))
    assert 'name="command"' not in page and "Only operators and admins may submit jobs." in page


def test_decisions_need_the_csrf_token(scene):
    big = scene.placement(scene.big)
    client = logged_in(scene.alice, enforce_csrf_checks=True)
    refused = client.post(f"/scheduler/placements/{big.pk}/", {"action": "approve", "version": big.version})
    assert refused.status_code == 403
    big.refresh_from_db()
    assert big.state == Placement.State.PROPOSED
    client.get("/scheduler/")
    token = client.cookies["csrftoken"].value
    accepted = client.post(f"/scheduler/placements/{big.pk}/", {"action": "approve", "version": big.version,
                                                                "csrfmiddlewaretoken": token})
    assert accepted.status_code == 302
    big.refresh_from_db()
    assert big.state == Placement.State.APPROVED


def test_a_decision_on_a_placement_that_changed_is_refused_with_what_it_is_now(scene):
    big = scene.placement(scene.big)
    seen = big.version
    services.approve(big, scene.bob, expected_version=seen)  # bob was faster
    response = logged_in(scene.alice).post(f"/scheduler/placements/{big.pk}/", {
        "action": "reject", "version": seen, "reason": "too late"})
    assert response.status_code == 409
    page = text(response)
    assert "changed under you" in page and "approved by bob" in page
    assert '<span class="state state-up">approved</span>' in page  # the current state is shown
    big.refresh_from_db()
    assert big.state == Placement.State.APPROVED and big.reject_reason == ""
    assert AuditEvent.objects.filter(placement=big, action="reject", refused=True, actor="alice").exists()


def test_a_refused_decision_shows_its_message_not_a_500(scene):
    small = scene.placement(scene.small)
    services.reject(small, scene.bob, reason="", expected_version=small.version)
    small.refresh_from_db()
    client = logged_in(scene.alice)
    response = client.post(f"/scheduler/placements/{small.pk}/", {"action": "approve", "version": small.version})
    assert response.status_code == 409
    assert "is not decidable: it is rejected by bob" in text(response)
    response = client.post(f"/scheduler/placements/{small.pk}/", {"action": "approve"})
    assert response.status_code == 400 and "which version" in text(response)
    response = client.post(f"/scheduler/placements/{small.pk}/", {"action": "launch", "version": 1})
    assert response.status_code == 400 and "Unknown action &#x27;launch&#x27;" in text(response)
    assert client.get("/scheduler/placements/999999/").status_code == 404


# --- overrides -------------------------------------------------------------------------------


def test_the_override_picker_preselects_the_proposal_and_marks_busy_gpus(scene):
    big, small = scene.placement(scene.big), scene.placement(scene.small)
    page = text(logged_in(scene.alice).get(f"/scheduler/placements/{big.pk}/override/"))
    checked = {int(i) for i in re.findall(r'name="gpu" value="(\d+)" checked', page)}
    assert checked == set(scene.gpus_of(big))
    assert len(re.findall(r'name="gpu" value="\d+"', page)) == 32
    # GPUs of the other proposal are busy, naming its job; grouped under leaf switches.
    assert page.count(f'title="job {scene.small.pk}">busy</span>') == len(scene.gpus_of(small))
    assert len(re.findall(r"<legend>", page)) == 4


def test_override_preview_shows_both_costs_then_confirm_stores_both(scene):
    big = scene.placement(scene.big)
    proposal = scene.gpus_of(big)
    leaves = selectors.host_leaves([h.pk for h in scene.free_hosts()])
    # Two free hosts under different leaf switches: 2 hosts and 2 leaves instead of 2 and 1.
    first = scene.free_hosts()[0]
    second = next(h for h in scene.free_hosts() if leaves[h.pk] != leaves[first.pk])
    pick = scene.host_gpus(first) + scene.host_gpus(second)
    client = logged_in(scene.alice)
    url = f"/scheduler/placements/{big.pk}/override/"
    response = client.post(url, {"step": "preview", "version": big.version, "gpu": pick})
    assert response.status_code == 200, plain(text(response))[:2000]
    page = text(response)
    costs = {row[0]: row[1:] for row in table_rows(section(page, "preview"))}
    assert costs["hosts"] == ["2", "2"]
    assert costs["leaf switches"] == ["1", "2"]
    assert costs["pod crossings (through the core)"] == ["0", "0"]
    assert 'name="step" value="confirm"' in page
    big.refresh_from_db()
    assert big.version == 1 and scene.gpus_of(big) == proposal  # a preview changes nothing

    response = client.post(url, {"step": "confirm", "version": big.version, "gpu": pick})
    assert response.status_code == 302 and response["Location"] == f"/scheduler/placements/{big.pk}/"
    big.refresh_from_db()
    assert big.is_override and sorted(big.proposed_gpus) == proposal and scene.gpus_of(big) == sorted(pick)
    assert (big.leaves, big.proposed_cost["leaves"]) == (2, 1)
    page = text(client.get(f"/scheduler/placements/{big.pk}/"))
    costs = {row[0]: row[1:] for row in table_rows(section(page, "why"))}
    assert costs["leaf switches"] == ["1", "2"]  # the engine's proposal, the override
    gpus = plain(section(page, "gpus"))
    assert f"Proposed by the engine ({len(proposal)})" in gpus and f"Chosen by alice ({len(pick)})" in gpus
    assert first.name in gpus and second.name in gpus
    assert AuditEvent.objects.filter(placement=big, action="override", actor="alice").exists()


def test_a_pick_with_a_busy_gpu_is_refused_with_the_reason(scene):
    big, small = scene.placement(scene.big), scene.placement(scene.small)
    pick = scene.gpus_of(big)[:4] + scene.gpus_of(small)
    response = logged_in(scene.alice).post(f"/scheduler/placements/{big.pk}/override/", {
        "step": "preview", "version": big.version, "gpu": pick})
    assert response.status_code == 400
    page = plain(text(response))
    assert "This pick breaks" in page and f"is held by job {scene.small.pk} (proposed)" in page
    assert 'value="confirm"' not in text(response)
    # Confirming it anyway (a hand-made POST) is refused by the service too.
    response = logged_in(scene.alice).post(f"/scheduler/placements/{big.pk}/override/", {
        "step": "confirm", "version": big.version, "gpu": pick})
    assert response.status_code == 409 and f"held by job {scene.small.pk}" in plain(text(response))
    big.refresh_from_db()
    assert not big.is_override and big.version == 1


def test_a_pick_of_the_wrong_model_is_refused_with_the_reason(scene):
    job = scene.submit("h100-only", 4, gpu_models=["H100"])
    Job.objects.filter(pk__in=[scene.big.pk, scene.huge.pk]).update(state=Job.State.CANCELLED)
    free = scene.free_hosts()
    Gpu.objects.filter(host=free[-1]).update(model="NVIDIA A100-SXM4-80GB")
    assert run_cycle().ok
    placement = scene.placement(job)
    pick = scene.host_gpus(free[-1])
    assert set(pick).isdisjoint(scene.gpus_of(placement))
    response = logged_in(scene.alice).post(f"/scheduler/placements/{placement.pk}/override/", {
        "step": "preview", "version": placement.version, "gpu": pick})
    assert response.status_code == 400
    page = plain(text(response))
    assert f"GPU {free[-1].name}/0 is a NVIDIA A100-SXM4-80GB, not H100." in page


def test_a_pick_outside_the_pool_or_empty_is_refused(scene):
    big = scene.placement(scene.big)
    client = logged_in(scene.alice)
    url = f"/scheduler/placements/{big.pk}/override/"
    response = client.post(url, {"step": "preview", "version": big.version, "gpu": [999999]})
    assert response.status_code == 400 and "GPU 999999 is not in this job&#x27;s pool." in text(response)
    response = client.post(url, {"step": "preview", "version": big.version})
    assert response.status_code == 400 and "Pick at least one GPU." in text(response)


def test_an_override_of_a_placement_that_changed_is_refused(scene):
    big = scene.placement(scene.big)
    seen = big.version
    pick = scene.gpus_of(big)
    services.reject(big, scene.bob, reason="no", expected_version=seen)
    client = logged_in(scene.alice)
    for step in ("preview", "confirm"):
        response = client.post(f"/scheduler/placements/{big.pk}/override/", {"step": step, "version": seen,
                                                                               "gpu": pick})
        assert response.status_code == 409
        page = text(response)
        assert "changed under you" in page and "it is now rejected" in page
        assert "Only a proposal waiting for a decision can be overridden; this placement is rejected." in page
    big.refresh_from_db()
    assert big.state == Placement.State.REJECTED and not big.is_override


# --- jobs, cycles, submit ------------------------------------------------------------------


def test_the_job_page_shows_constraints_timeline_and_placements(scene):
    job = scene.submit("constrained", 2, gpu_models=["H100", "A100"], min_memory_mib=40000, max_leaves=1,
                       topology_hard=True, env={"NCCL_DEBUG": "INFO"}, priority=5, estimated_runtime_s=5400)
    big = scene.placement(scene.big)
    services.approve(big, scene.alice, expected_version=big.version)
    client = logged_in(scene.vera)
    page = plain(text(client.get(f"/scheduler/jobs/{job.pk}/")))
    assert "GPU models H100 or A100" in page and "at least 40000 MiB" in page
    assert "estimated 1 h 30 min, at most unlimited" in page
    assert "at most 1, hard (never relaxed)" in page and "NCCL_DEBUG=INFO" in page and "python train.py" in page
    assert "Submitted; waiting for the next allocation cycle." in page

    response = client.get(f"/scheduler/jobs/{scene.big.pk}/")
    rows = [r for r in table_rows(text(response).split('id="timeline-title"', 1)[1])]
    assert [(r[1], r[2].split()[0], r[3]) for r in rows] == [
        ("alice", "submit", "— → pending"), ("scheduler", "propose", "pending → proposed"),
        ("alice", "approve", "proposed → approved")]
    placements = table_rows(text(response).split('id="placements-title"', 1)[1].split("</section>", 1)[0])
    assert placements[0][0] == str(big.pk) and placements[0][1] == "approved" and placements[0][2] == "8"


def test_an_operator_cancels_a_job_and_a_second_cancel_is_refused_politely(scene):
    client = logged_in(scene.alice)
    response = client.post(f"/scheduler/jobs/{scene.small.pk}/", {"action": "cancel"}, follow=True)
    assert response.status_code == 200 and "is cancelled" in text(response)
    assert Job.objects.get(pk=scene.small.pk).state == Job.State.CANCELLED
    response = client.post(f"/scheduler/jobs/{scene.small.pk}/", {"action": "cancel"})
    assert response.status_code == 409 and "already cancelled" in text(response)


def test_job_history_filters_and_400(scene):
    client = logged_in(scene.vera)
    rows = table_rows(text(client.get("/scheduler/jobs/?state=proposed")))
    assert sorted(r[1] for r in rows) == ["big", "small"]
    rows = table_rows(text(client.get("/scheduler/jobs/?name=HUG")))
    assert [r[1] for r in rows] == ["huge"]
    response = client.get("/scheduler/jobs/?state=done")
    assert response.status_code == 400 and "Unknown state &#x27;done&#x27;" in text(response)
    response = client.get("/scheduler/jobs/?pool=nope")
    assert response.status_code == 400 and "Unknown pool" in text(response)
    # The overview links each waiting reason to the jobs waiting for it.
    Job.objects.filter(pk=scene.huge.pk).update(state=Job.State.PENDING, pending_reason="resources")
    rows = table_rows(text(client.get("/scheduler/jobs/?state=pending&reason=resources")))
    assert [r[1] for r in rows] == ["huge"]
    assert table_rows(text(client.get("/scheduler/jobs/?state=pending&reason=quota"))) == []
    response = client.get("/scheduler/jobs/?reason=%3Cscript%3E")
    assert response.status_code == 400 and "is not a reason code" in text(response)


def test_cycle_pages_show_phases_counts_and_reasons(scene):
    client = logged_in(scene.vera)
    rows = table_rows(text(client.get("/scheduler/cycles/")))
    assert rows[0][0] == str(scene.cycle.pk) and rows[0][3:5] == ["3", "2"]
    page = text(client.get(f"/scheduler/cycles/{scene.cycle.pk}/"))
    for label in ("snapshot", "plan (engine)", "persist", "total"):
        assert f"<dt>{label}</dt><dd>" in page
    assert f"{scene.cycle.plan_s:.3f} s" in page
    assert "1</a> constraints cannot be met" in page
    placements = table_rows(page.split('id="placements-title"', 1)[1])
    assert sorted(r[1].split()[0] for r in placements) == ["big", "small"]


def test_submit_creates_the_job_with_argv_and_env(scene):
    client = logged_in(scene.alice)
    response = client.post("/scheduler/submit/", {
        "name": "lm", "tenant": "physics", "pool": "main", "gpus": "16", "task_class": "training", "priority": "3",
        "gang": "on", "whole_hosts": "on", "gpu_models": "H100, A100,", "estimated_runtime": "1h30m",
        "max_runtime": "2h", "max_leaves": "2", "max_wait": "10m",
        "command": "torchrun --nproc-per-node 4 train.py --name 'my run' \"a b\"",
        "env": "# comment\nNCCL_DEBUG=INFO\n\nPYTHONPATH=/opt/x=y\n"})
    job = Job.objects.get(name="lm")
    assert response.status_code == 302 and response["Location"] == f"/scheduler/jobs/{job.pk}/"
    assert job.command == ["torchrun", "--nproc-per-node", "4", "train.py", "--name", "my run", "a b"]
    assert job.env == {"NCCL_DEBUG": "INFO", "PYTHONPATH": "/opt/x=y"}
    assert job.gpu_models == ["H100", "A100"]
    assert (job.gpus, job.priority, job.gang, job.estimated_runtime_s, job.max_runtime_s) == (16, 3, True, 5400, 7200)
    assert (job.max_leaves, job.topology_hard, job.max_wait_s, job.submitted_by) == (2, False, 600, scene.alice)
    assert AuditEvent.objects.filter(job=job, action="submit", actor="alice").exists()


def field_errors(page: str, field: str) -> str:
    match = re.search(rf'id="id_{field}_errors">(.*?)</span>', page, flags=re.S)
    return plain(match.group(1)) if match else ""


def test_submit_errors_are_per_field_and_submit_nothing(scene):
    client = logged_in(scene.alice)
    response = client.post("/scheduler/submit/", {
        "tenant": "nobody", "pool": "main", "gpus": "0", "task_class": "training", "priority": "0",
        "estimated_runtime": "3 fortnights", "max_leaves": "", "topology_hard": "on",
        "command": "python 'unclosed", "env": "GOOD=1\nnot a pair\n1BAD=x\nGOOD=2"})
    assert response.status_code == 400
    page = text(response)
    assert "The job was not submitted" in page
    assert "Select a valid choice" in field_errors(page, "tenant")
    assert "greater than or equal to 1" in field_errors(page, "gpus")
    assert "is not a duration" in field_errors(page, "estimated_runtime")
    assert "A hard limit needs the number of leaf switches." in field_errors(page, "max_leaves")
    assert field_errors(page, "command") == "Cannot split the command: no closing quotation."
    env = field_errors(page, "env")
    assert "Line 2: expected KEY=VALUE" in env and "Line 3: '1BAD' is not a variable name" in env
    assert "Line 4: GOOD is set twice." in env
    assert field_errors(page, "pool") == "" and field_errors(page, "name") == ""
    assert 'aria-invalid="true"' in page
    # What was typed comes back.
    assert 'value="python &#x27;unclosed"' in page
    assert Job.objects.count() == 3


def test_submit_asks_for_a_command(scene):
    response = logged_in(scene.alice).post("/scheduler/submit/", {
        "tenant": "physics", "pool": "main", "gpus": "1", "task_class": "training", "priority": "0", "command": "  "})
    assert response.status_code == 400
    assert field_errors(text(response), "command") == "This field is required."


# --- escaping and query counts -------------------------------------------------------------


def test_html_in_job_names_and_reasons_is_escaped_everywhere(scene):
    job = scene.submit(HOSTILE, 4)
    assert run_cycle().ok
    placement = scene.placement(job)
    services.reject(placement, scene.alice, reason=HOSTILE, expected_version=placement.version)
    client = logged_in(scene.alice)
    for path in ("/scheduler/", "/scheduler/jobs/", f"/scheduler/jobs/{job.pk}/", f"/scheduler/placements/{placement.pk}/",
                 f"/scheduler/cycles/{scene.cycle.pk}/"):
        page = text(client.get(path))
        assert "<script>alert" not in page and "<b>bold</b>" not in page, path
        if path != f"/scheduler/cycles/{scene.cycle.pk}/":
            assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page, path


def many_jobs(scene, n):
    """n jobs: half pending, a quarter proposed, a quarter running (placements without
    GPUs: the pages count them the same way), each with an audit event."""
    now = timezone.now()
    states = [Job.State.PENDING] * (n // 2) + [Job.State.PROPOSED] * (n // 4) + [Job.State.RUNNING] * (n - n // 2 - n // 4)
    start = Job.objects.count()
    Job.objects.bulk_create([Job(tenant=scene.tenant, pool=scene.pool, gpus=1 + i % 8, name=f"bulk-{start + i}",
                                 command=["x"], state=state, pending_reason="resources" if state == "pending" else "",
                                 pending_message="Waits for GPUs." if state == "pending" else "", created_at=now)
                             for i, state in enumerate(states)])
    jobs = list(Job.objects.filter(name__startswith="bulk-").exclude(placements__isnull=False)
                .exclude(state=Job.State.PENDING))
    Placement.objects.bulk_create([Placement(job=j, state=j.state, cycle=scene.cycle, expires_at=now, explanation="x",
                                             started_at=now if j.state == Job.State.RUNNING else None) for j in jobs])
    AuditEvent.objects.bulk_create([AuditEvent(actor="scheduler", action="propose", job=j) for j in jobs])


def count_queries(client, path) -> int:
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(path).status_code == 200, path
    return len(ctx.captured_queries)


def test_pages_take_a_fixed_number_of_queries(scene):
    client = logged_in(scene.alice)
    paths = ["/scheduler/", "/scheduler/?state=running", "/scheduler/jobs/", "/scheduler/cycles/",
             f"/scheduler/cycles/{scene.cycle.pk}/"]
    many_jobs(scene, 20)
    small = {path: count_queries(client, path) for path in paths}
    many_jobs(scene, 200)
    large = {path: count_queries(client, path) for path in paths}
    assert large == small
    assert max(large.values()) <= 25, large
    page = text(client.get("/scheduler/"))
    # huge and 10 + 100 bulk jobs wait; big, small and 5 + 50 bulk proposals; 5 + 50 running.
    assert "page 1 of 3 (111 in all)" in section(page, "queue")
    assert "page 1 of 2 (57 in all)" in section(page, "proposals")
    assert "page 1 of 2 (55 in all)" in section(page, "running")
    assert len(table_rows(section(page, "queue"))) == 50


def test_placement_and_override_pages_take_a_fixed_number_of_queries(scene, django_assert_max_num_queries):
    client = logged_in(scene.alice)
    big = scene.placement(scene.big)
    with django_assert_max_num_queries(25):
        assert client.get(f"/scheduler/placements/{big.pk}/").status_code == 200
    with django_assert_max_num_queries(25):
        assert client.get(f"/scheduler/placements/{big.pk}/override/").status_code == 200
    with django_assert_max_num_queries(25):
        assert client.get(f"/scheduler/jobs/{scene.big.pk}/").status_code == 200
