"""Picking an override on the GPU heatmap, through the Django test client: the dry-run
endpoint (/scheduler/placements/<id>/override/check/) and the confirm endpoint next to it.
Operators and admins get the pick's cost (the engine's own validate_and_cost, not a copy)
next to the proposal's, or every rule the pick breaks, and nothing changes either way;
viewers and anonymous users are refused; CSRF is enforced; a pick on a placement that
changed meanwhile is refused with what happened. The heatmap page in pick mode shows the
controls to operators only."""
import json
import re

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.utils import timezone

from pool.models import Gpu, Host, Pool
from scheduler import engine, services, snapshot
from scheduler.cycle import run_cycle
from scheduler.models import AuditEvent, Job, Placement, PlacementGpu
from tests.test_scheduler_pages import logged_in, scene  # noqa: F401 - `scene` is a fixture

pytestmark = pytest.mark.django_db


def check_url(p) -> str:
    return f"/scheduler/placements/{p.pk}/override/check/"


def confirm_url(p) -> str:
    return f"/scheduler/placements/{p.pk}/override/confirm/"


def post(client, url, body, **extra):
    return client.post(url, json.dumps(body), content_type="application/json", **extra)


def state_of_everything() -> tuple:
    """What a refused or dry-run request must leave exactly as it was."""
    return (sorted(Placement.objects.values_list("id", "state", "version", "is_override")),
            sorted(PlacementGpu.objects.values_list("placement_id", "gpu_id", "active")),
            sorted(Job.objects.values_list("id", "state")))


def engine_cost(placement, gpu_ids) -> dict:
    taken = snapshot.take(timezone.now(), with_queue=False).snapshot
    cost = engine.validate_and_cost(snapshot.job_for_engine(placement.job), gpu_ids, taken)
    assert not isinstance(cost, list), cost
    return cost.as_dict()


def two_leaves_pick(scene):
    """Two free hosts under different leaf switches: 8 GPUs on 2 hosts and 2 leaves."""
    from scheduler import selectors

    free = scene.free_hosts()
    leaves = selectors.host_leaves([h.pk for h in free])
    second = next(h for h in free if leaves[h.pk] != leaves[free[0].pk])
    return scene.host_gpus(free[0]) + scene.host_gpus(second)


# --- who may ---------------------------------------------------------------------------------


def test_only_operators_and_admins_may_check_or_confirm(scene):
    big = scene.placement(scene.big)
    pick = two_leaves_pick(scene)
    body = {"gpus": pick, "version": big.version}
    before = state_of_everything()
    audits = AuditEvent.objects.count()

    anonymous = Client()
    for url in (check_url(big), confirm_url(big)):
        response = post(anonymous, url, body)
        assert response.status_code == 302 and response["Location"].startswith("/login/")
    viewer = logged_in(scene.vera)
    for url in (check_url(big), confirm_url(big)):
        response = post(viewer, url, body)
        assert response.status_code == 403
        assert response.json()["error"] == "Only operators and admins may override placements. Nothing was changed."
    assert state_of_everything() == before and AuditEvent.objects.count() == audits

    admin = User.objects.create_user("ada", password="unused-password-1")
    admin.groups.add(Group.objects.get(name="admin"))
    for user in (scene.alice, admin):
        response = post(logged_in(user), check_url(big), body)
        assert response.status_code == 200 and response.json()["ok"] is True
    assert state_of_everything() == before  # a dry run writes nothing


def test_csrf_is_enforced(scene):
    big = scene.placement(scene.big)
    client = logged_in(scene.alice, enforce_csrf_checks=True)
    body = {"gpus": two_leaves_pick(scene), "version": big.version}
    assert post(client, check_url(big), body).status_code == 403
    assert post(client, confirm_url(big), body).status_code == 403
    page = client.get(f"/heatmap/?pick={big.pk}")
    token = re.search(r'data-csrf="([^"]+)"', page.content.decode()).group(1)
    assert post(client, check_url(big), body, HTTP_X_CSRFTOKEN=token).status_code == 200
    big.refresh_from_db()
    assert big.version == 1 and not big.is_override


# --- a good pick ------------------------------------------------------------------------------


def test_a_good_pick_costs_what_the_engine_says_next_to_the_proposal(scene):
    big = scene.placement(scene.big)
    pick = two_leaves_pick(scene)
    before = state_of_everything()
    answer = post(logged_in(scene.alice), check_url(big), {"gpus": pick, "version": big.version}).json()
    assert answer["ok"] is True and answer["problems"] == []
    assert answer["cost"] == engine_cost(big, pick)
    assert answer["proposal_cost"] == big.cost_dict()
    rows = {row["key"]: row for row in answer["table"]}
    assert (rows["hosts"]["proposal"], rows["hosts"]["pick"], rows["hosts"]["differs"]) == (2, 2, False)
    assert (rows["leaves"]["proposal"], rows["leaves"]["pick"], rows["leaves"]["differs"]) == (1, 2, True)
    assert state_of_everything() == before


def test_the_proposal_itself_is_a_valid_pick_at_its_own_cost(scene):
    big = scene.placement(scene.big)
    answer = post(logged_in(scene.alice), check_url(big), {"gpus": scene.gpus_of(big), "version": 1}).json()
    assert answer["ok"] is True and answer["cost"] == big.cost_dict()
    assert not any(row["differs"] for row in answer["table"])


def test_a_whole_host_job_on_part_of_a_host_is_noted_not_refused(scene):
    # The override service treats hosts as a cost an operator may choose; the panel says so.
    big = scene.placement(scene.big)
    free = scene.free_hosts()
    pick = scene.host_gpus(free[0]) + scene.host_gpus(free[1])[:2] + scene.host_gpus(free[2])[:2]
    answer = post(logged_in(scene.alice), check_url(big), {"gpus": pick, "version": 1}).json()
    assert answer["ok"] is True and answer["cost"] == engine_cost(big, pick)
    assert len(answer["notes"]) == 1 and "asks for whole hosts" in answer["notes"][0]
    assert free[1].name in answer["notes"][0] and free[0].name not in answer["notes"][0]


# --- bad picks: refused with the reason, nothing changed -------------------------------------


def refused(scene, placement, pick) -> list[str]:
    before = state_of_everything()
    audits = AuditEvent.objects.count()
    response = post(logged_in(scene.alice), check_url(placement), {"gpus": pick, "version": placement.version})
    assert response.status_code == 200
    answer = response.json()
    assert answer["ok"] is False and answer["cost"] is None and answer["problems"]
    assert state_of_everything() == before and AuditEvent.objects.count() == audits
    # The real override refuses the same pick, for a reason the dry run gave (it stops at the
    # first rule broken; the dry run lists them all).
    response = post(logged_in(scene.alice), confirm_url(placement), {"gpus": pick, "version": placement.version})
    assert response.status_code == 409
    said = response.json()["error"] + " ".join(response.json()["problems"])
    assert any(problem.rstrip(".") in said for problem in answer["problems"]), (said, answer["problems"])
    assert state_of_everything() == before
    return answer["problems"]


def test_a_busy_gpu_is_refused_naming_the_job_that_holds_it(scene):
    big, small = scene.placement(scene.big), scene.placement(scene.small)
    problems = refused(scene, big, scene.gpus_of(big)[:4] + scene.gpus_of(small))
    assert any(f"is held by job {scene.small.pk} (proposed)" in p for p in problems)


def test_the_wrong_count_for_a_gang_is_refused(scene):
    big = scene.placement(scene.big)
    problems = refused(scene, big, scene.gpus_of(big)[:7])
    assert "The job needs exactly 8 GPUs (gang); 7 were chosen." in problems


def test_a_gpu_of_another_pool_is_refused(scene):
    big = scene.placement(scene.big)
    other = Pool.objects.create(name="other")
    host = scene.free_hosts()[0]
    Host.objects.filter(pk=host.pk).update(pool=other)
    problems = refused(scene, big, scene.gpus_of(big)[:4] + scene.host_gpus(host))
    assert f"GPU {host.name}/0 is in pool other, not main." in problems


def test_a_gpu_that_does_not_exist_is_refused(scene):
    big = scene.placement(scene.big)
    problems = refused(scene, big, scene.gpus_of(big)[:7] + [999999])
    assert "GPU 999999 does not exist." in problems


def test_model_and_memory_mismatches_are_refused(scene):
    Job.objects.filter(pk__in=[scene.big.pk, scene.huge.pk]).update(state=Job.State.CANCELLED)
    Placement.objects.filter(job_id=scene.big.pk).update(state=Placement.State.CANCELLED)
    PlacementGpu.objects.filter(placement__job_id=scene.big.pk).update(active=False)
    job = scene.submit("h100-80g", 4, gpu_models=["H100"], min_memory_mib=80000)
    free = scene.free_hosts()
    Gpu.objects.filter(host=free[-1]).update(model="NVIDIA A100-SXM4-40GB", memory_mib=40960)
    assert run_cycle().ok
    placement = scene.placement(job)
    pick = scene.host_gpus(free[-1])
    assert set(pick).isdisjoint(scene.gpus_of(placement))
    problems = refused(scene, placement, pick)
    assert f"GPU {free[-1].name}/0 is a NVIDIA A100-SXM4-40GB, not H100." in problems
    assert f"GPU {free[-1].name}/0 has 40960 MiB, less than 80000 MiB." in problems


def test_an_empty_pick_is_refused(scene):
    big = scene.placement(scene.big)
    before = state_of_everything()
    answer = post(logged_in(scene.alice), check_url(big), {"gpus": [], "version": 1}).json()
    assert answer["ok"] is False and answer["problems"] == ["Pick at least one GPU."]
    assert state_of_everything() == before


@pytest.mark.parametrize("body, message", [
    ("not json", "The request body is not JSON."),
    ([1, 2], 'Send a JSON object {"gpus"'),
    ({"gpus": "1,2", "version": 1}, '"gpus" must be a list of GPU ids'),
    ({"gpus": [1, True], "version": 1}, '"gpus" must be a list of GPU ids'),
    ({"gpus": [1], "version": "1"}, '"version" must be the placement version you saw'),
    ({"gpus": [1]}, '"version" must be the placement version you saw'),
    ({"gpus": list(range(5000)), "version": 1}, '"gpus" lists 5000 ids: at most 4096.'),
])
def test_a_malformed_request_is_refused_saying_what_is_wrong(scene, body, message):
    big = scene.placement(scene.big)
    before = state_of_everything()
    client = logged_in(scene.alice)
    for url in (check_url(big), confirm_url(big)):
        raw = body if isinstance(body, str) else json.dumps(body)
        response = client.post(url, raw, content_type="application/json")
        assert response.status_code == 400
        assert message in response.json()["error"] and response.json()["error"].endswith("Nothing was changed.")
    assert state_of_everything() == before
    assert client.get(check_url(big)).status_code == 405
    response = post(client, "/scheduler/placements/999999/override/check/", {"gpus": [1], "version": 1})
    assert response.status_code == 404 and response.json()["error"] == "There is no placement 999999."


# --- a proposal that changed meanwhile --------------------------------------------------------


def test_a_pick_on_a_placement_that_changed_is_refused_with_what_happened(scene):
    big = scene.placement(scene.big)
    pick = two_leaves_pick(scene)
    services.reject(big, scene.bob, reason="too spread", expected_version=1)
    before = state_of_everything()
    client = logged_in(scene.alice)
    for url in (check_url(big), confirm_url(big)):
        response = post(client, url, {"gpus": pick, "version": 1})
        assert response.status_code == 409
        answer = response.json()
        assert answer["changed"] is True and answer["state"] == "rejected" and answer["version"] == 2
        assert f"Placement {big.pk} changed under you: it is now rejected (version 2). Nothing was changed" \
            in answer["error"]
    assert state_of_everything() == before


# --- confirm ----------------------------------------------------------------------------------


def test_confirm_overrides_with_the_pick_and_keeps_the_proposal_on_record(scene):
    big = scene.placement(scene.big)
    proposal = scene.gpus_of(big)
    pick = two_leaves_pick(scene)
    client = logged_in(scene.alice)
    response = post(client, confirm_url(big), {"gpus": pick, "version": 1})
    assert response.status_code == 200, response.content
    answer = response.json()
    assert answer["ok"] is True and answer["url"] == f"/scheduler/placements/{big.pk}/"
    big.refresh_from_db()
    assert big.is_override and scene.gpus_of(big) == sorted(pick) and sorted(big.proposed_gpus) == proposal
    assert big.overridden_by == scene.alice and (answer["version"], answer["state"]) == (big.version, big.state)
    assert AuditEvent.objects.filter(placement=big, action="override", actor="alice", refused=False).exists()
    # The page it sends the operator to says so.
    page = client.get(answer["url"]).content.decode()
    assert f"Placement {big.pk} overridden with the 8 GPUs you picked." in page


# --- the heatmap in pick mode -----------------------------------------------------------------


def pick_data(page: str) -> dict:
    return json.loads(re.search(r'<script id="pick-data" type="application/json">(.*?)</script>', page, re.S).group(1))


def test_the_heatmap_in_pick_mode_shows_controls_to_operators_only(scene):
    big = scene.placement(scene.big)
    page = logged_in(scene.alice).get(f"/heatmap/?pick={big.pk}").content.decode()
    data = pick_data(page)
    assert data["can_pick"] is True and data["proposal"] == scene.gpus_of(big) and data["version"] == 1
    # Every pool GPU has a cell id on this fabric's heatmap and an entry of the keyboard list
    # (the page's script builds the checkboxes from it), busy ones saying so.
    cells = {i for row in data["cells"] for i in row if i is not None}
    assert set(scene.gpus_of(big)) <= cells and len(cells) == 32
    listed = {g[0]: g[2] for group in data["groups"] for host in group["hosts"] for g in host["gpus"]}
    assert set(listed) == cells and len(data["groups"]) == 4
    assert {listed[g] for g in scene.gpus_of(scene.placement(scene.small))} == {"busy"}
    assert {listed[g] for g in scene.gpus_of(big)} == {"free"}
    assert 'id="pick-confirm" disabled' in page and 'id="pick-list"' in page

    page = logged_in(scene.vera).get(f"/heatmap/?pick={big.pk}").content.decode()
    assert pick_data(page)["can_pick"] is False
    assert 'type="checkbox"' not in page and 'id="pick-confirm"' not in page
    assert "Only operators and admins may override placements" in page


def test_the_heatmap_refuses_an_unknown_pick_with_the_reason(scene):
    response = logged_in(scene.alice).get("/heatmap/?pick=abc")
    assert response.status_code == 400
    assert "pick=&#x27;abc&#x27; is not a placement number." in response.content.decode()
    response = logged_in(scene.alice).get("/heatmap/?pick=999999")
    assert response.status_code == 400 and "There is no placement 999999." in response.content.decode()


def test_a_decided_placement_is_shown_but_not_pickable(scene):
    big = scene.placement(scene.big)
    services.approve(big, scene.bob, expected_version=1)
    page = logged_in(scene.alice).get(f"/heatmap/?pick={big.pk}").content.decode()
    assert pick_data(page)["can_pick"] is False and 'type="checkbox"' not in page
    assert "Only a proposal waiting for a decision can be overridden; this placement is approved." in page


def test_proposals_link_to_the_heatmap_pick_for_operators_only(scene):
    big = scene.placement(scene.big)
    link = f'href="/heatmap/?pick={big.pk}"'
    assert link in logged_in(scene.alice).get("/scheduler/").content.decode()
    assert link in logged_in(scene.alice).get(f"/scheduler/placements/{big.pk}/").content.decode()
    assert link not in logged_in(scene.vera).get("/scheduler/").content.decode()
