"""The job options users can now set, through every way in: GPU sharing (gpu_milli,
gpu_memory_mib, mig_profile), restartable, allow_remote_site and grace_period_s. The
service refuses bad values naming the field and stores nothing; the submit form, the
`submit_job` command and dispatch (the job's grace period reaches the agent) pass them on."""
import re

import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.test import Client

from scheduler import dispatch, services, tasks
from scheduler.models import Job

from .agents import (  # noqa: F401 - fixtures
    agent_settings,
    approve,
    clock,
    eager_tasks,
    propose,
    simulator,
    small_cluster,
    submit,
)

# ruff: noqa: F811
pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_cycle(monkeypatch):
    monkeypatch.setattr(tasks, "request_cycle_soon", lambda: None)


def submitted(**kw) -> Job:
    kw.setdefault("gpus", 1)
    return services.submit_job(None, tenant="physics", pool="main", command=["python", "serve.py"], **kw)


def refused(**kw) -> dict:
    with pytest.raises(ValidationError) as error:
        submitted(**kw)
    return error.value.message_dict


# -- the service ---------------------------------------------------------------------------------

def test_the_service_stores_each_option(cluster, tenant):
    share = submitted(gpu_milli=250, gpu_memory_mib=8000, restartable=True, grace_period_s=5)
    assert (share.gpus, share.gpu_milli, share.gpu_memory_mib, share.mig_profile) == (1, 250, 8000, "")
    assert (share.restartable, share.allow_remote_site, share.grace_period_s) == (True, False, 5)
    mig = submitted(mig_profile=" 3G.40GB ", site="north", allow_remote_site=True, max_wait_s=600)
    assert (mig.mig_profile, mig.gpu_milli, mig.allow_remote_site, mig.site) == ("3g.40gb", 0, True, "north")
    memory_only = submitted(gpu_memory_mib=20000)
    assert (memory_only.gpu_milli, memory_only.gpu_memory_mib) == (0, 20000)
    whole = submitted(gpus=8)
    assert (whole.gpu_milli, whole.gpu_memory_mib, whole.mig_profile, whole.restartable, whole.grace_period_s) == (
        0, 0, "", False, 30)


@pytest.mark.parametrize("kw, field, words", [
    ({"gpu_milli": 1000}, "gpu_milli", "must be between 0 and 999"),
    ({"gpu_milli": -5}, "gpu_milli", "must be between 0 and 999"),
    ({"gpu_milli": "half"}, "gpu_milli", "expected a whole number, got 'half'"),
    ({"gpu_milli": 250, "gpus": 4}, "gpu_milli", "ask for 1 GPU, not 4"),
    ({"gpu_memory_mib": 8000, "gpus": 2}, "gpu_memory_mib", "ask for 1 GPU, not 2"),
    ({"mig_profile": "1g.10gb", "gpus": 8}, "mig_profile", "ask for 1 GPU, not 8"),
    ({"gpu_memory_mib": -1}, "gpu_memory_mib", "must be between 0 and 10000000"),
    ({"mig_profile": "5g.10gb"}, "mig_profile", "not of the form Ng.Mgb"),
    ({"mig_profile": "big"}, "mig_profile", "'big' is not of the form"),
    ({"mig_profile": 3}, "mig_profile", "expected a MIG profile such as 1g.10gb"),
    ({"mig_profile": "1g.10gb", "gpu_milli": 500}, "mig_profile", "either mig_profile or gpu_milli/gpu_memory_mib"),
    ({"mig_profile": "1g.10gb", "gpu_memory_mib": 4000}, "mig_profile", "not both"),
    ({"grace_period_s": -1}, "grace_period_s", "must be between 0 and 3600"),
    ({"grace_period_s": 7200}, "grace_period_s", "must be between 0 and 3600"),
    ({"allow_remote_site": True}, "allow_remote_site", "only when it names its home site"),
    ({"restartable": "yes"}, "restartable", "expected true or false, got 'yes'"),
])
def test_the_service_names_the_bad_field_and_stores_nothing(cluster, tenant, kw, field, words):
    problems = refused(**kw)
    assert field in problems, problems
    assert words in " ".join(problems[field]), problems
    assert not Job.objects.exists()


# -- the submit form -----------------------------------------------------------------------------

def form_post(operator, **fields):
    client = Client()
    client.force_login(operator)
    data = {"tenant": "physics", "pool": "main", "gpus": "1", "task_class": "inference", "priority": "0",
            "command": "python serve.py", **fields}
    return client.post("/scheduler/submit/", data)


def field_errors(page: str, field: str) -> str:
    match = re.search(rf'id="id_{field}_errors">(.*?)</span>', page, flags=re.S)
    return " ".join(re.sub(r"<[^>]+>", " ", match.group(1)).split()) if match else ""


def test_the_form_offers_the_options(cluster, tenant, operator):
    client = Client()
    client.force_login(operator)
    page = client.get("/scheduler/submit/").content.decode()
    assert "<legend>GPU sharing (a part of one GPU)</legend>" in page
    for name in ("gpu_milli", "gpu_memory_mib", "mig_profile", "restartable", "allow_remote_site", "grace_period"):
        assert f'name="{name}"' in page, name
    assert 'name="grace_period" value="30s"' in page


def test_the_form_submits_a_shared_restartable_job(cluster, tenant, operator):
    response = form_post(operator, gpu_milli="250", gpu_memory_mib="8000", restartable="on", grace_period="2m",
                         site="north", allow_remote_site="on", max_wait="10m")
    job = Job.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/scheduler/jobs/{job.pk}/"
    assert (job.gpu_milli, job.gpu_memory_mib, job.mig_profile, job.restartable) == (250, 8000, "", True)
    assert (job.grace_period_s, job.allow_remote_site, job.site, job.max_wait_s) == (120, True, "north", 600)

    form_post(operator, mig_profile="1G.10GB", grace_period="")
    mig = Job.objects.latest("id")
    assert (mig.mig_profile, mig.grace_period_s, mig.restartable, mig.allow_remote_site) == ("1g.10gb", 30, False,
                                                                                            False)


@pytest.mark.parametrize("fields, field, words", [
    ({"gpu_milli": "250", "gpus": "4"}, "gpu_milli", "set GPUs to 1"),
    ({"gpu_milli": "1000"}, "gpu_milli", "less than or equal to 999"),
    ({"mig_profile": "1g.10gb", "gpu_milli": "500"}, "mig_profile", "leave those two empty"),
    ({"mig_profile": "9g.1gb"}, "mig_profile", "is not of the form Ng.Mgb"),
    ({"gpu_memory_mib": "4000", "gpus": "2"}, "gpu_memory_mib", "ask for 1 GPU, not 2"),
    ({"grace_period": "2h"}, "grace_period", "At most 60 minutes"),
    ({"grace_period": "soon"}, "grace_period", "is not a duration"),
    ({"allow_remote_site": "on"}, "allow_remote_site", "only when it names its home site"),
])
def test_form_errors_are_on_the_field_and_submit_nothing(cluster, tenant, operator, fields, field, words):
    response = form_post(operator, **fields)
    assert response.status_code == 400
    page = response.content.decode()
    assert words in field_errors(page, field), (field, page[page.find("errors"):][:500])
    assert not Job.objects.exists()


# -- manage.py submit_job ------------------------------------------------------------------------

def test_the_command_takes_the_options(cluster, tenant, capsys):
    call_command("submit_job", "--tenant", "physics", "--pool", "main", "--gpus", "1", "--gpu-share", "300",
                 "--gpu-memory", "10000", "--restartable", "--grace", "7", "--", "python", "serve.py")
    job = Job.objects.get()
    assert (job.gpu_milli, job.gpu_memory_mib, job.restartable, job.grace_period_s) == (300, 10000, True, 7)
    call_command("submit_job", "--tenant", "physics", "--pool", "main", "--gpus", "1", "--mig", "2g.20gb",
                 "--site", "north", "--allow-remote-site", "--max-wait", "60", "--", "x")
    mig = Job.objects.latest("id")
    assert (mig.mig_profile, mig.allow_remote_site, mig.max_wait_s, mig.grace_period_s) == ("2g.20gb", True, 60, 30)


def test_the_command_refuses_bad_options_naming_them(cluster, tenant):
    with pytest.raises(CommandError, match="job not submitted: gpu_milli: a shared job runs on a fraction of one "
                                           "GPU: ask for 1 GPU, not 8"):
        call_command("submit_job", "--tenant", "physics", "--pool", "main", "--gpus", "8", "--gpu-share", "500",
                     "--", "x")
    with pytest.raises(CommandError, match="mig_profile: a MIG profile fixes the share"):
        call_command("submit_job", "--tenant", "physics", "--pool", "main", "--gpus", "1", "--gpu-share", "500",
                     "--mig", "1g.10gb", "--", "x")
    with pytest.raises(CommandError, match="grace_period_s: must be between 0 and 3600"):
        call_command("submit_job", "--tenant", "physics", "--pool", "main", "--gpus", "1", "--grace", "-3", "--", "x")
    assert not Job.objects.exists()


# -- dispatch ------------------------------------------------------------------------------------

def test_dispatch_sends_the_jobs_grace_period(simulator, small_cluster, tenant, operator, eager_tasks,
                                              django_capture_on_commit_callbacks):
    job = submit(small_cluster, tenant, 4, grace_period_s=90)
    placement = approve(propose(job, ["gpu0001"]), operator, django_capture_on_commit_callbacks)
    [request] = dispatch.allocation_requests(job, placement.pk, dispatch.placement_parts(placement.pk))
    assert request["grace_period_s"] == 90
    from agent.protocol import parse_allocation_request
    assert parse_allocation_request(request)["grace_period_s"] == 90.0  # what the agent reads


def test_the_job_page_shows_the_options(cluster, tenant, operator):
    job = submitted(gpu_milli=250, gpu_memory_mib=8000, restartable=True, grace_period_s=45, site="north",
                    allow_remote_site=True)
    client = Client()
    client.force_login(operator)
    page = " ".join(re.sub(r"<[^>]+>", " ", client.get(f"/scheduler/jobs/{job.pk}/").content.decode()).split())
    assert "GPU sharing 250/1000 of one GPU, 8000 MiB of its memory" in page
    assert "north · may run at another site after waiting" in page and "· restartable" in page
    assert "On stop SIGTERM, then SIGKILL after 45 s" in page
    mig = submitted(mig_profile="1g.10gb")
    page = " ".join(re.sub(r"<[^>]+>", " ", client.get(f"/scheduler/jobs/{mig.pk}/").content.decode()).split())
    assert "GPU sharing MIG instance 1g.10gb" in page and "restartable" not in page
