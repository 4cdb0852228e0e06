"""The job options through the REST API and `fabricpool submit`: GPU sharing (gpu_milli,
gpu_memory_mib, mig_profile), restartable, allow_remote_site, grace_period_s. Accepted and
shown back (API, `fabricpool status`), refused naming the field, described in the schema."""
import json

import pytest

from scheduler.models import Job

from .conftest import caller
from .test_api import error
from .test_cli import run  # noqa: F401 - the fixture

pytestmark = pytest.mark.django_db

FLAGS = ("gpu_milli", "gpu_memory_mib", "mig_profile", "restartable", "allow_remote_site", "grace_period_s")


def body(**extra):
    return {"tenant": "physics", "pool": "main", "gpus": 1, "command": ["python", "serve.py"], **extra}


def test_submit_with_the_options_and_read_them_back(cluster, tenant, operator):
    response = operator.post("/api/v1/jobs/", body(gpu_milli=250, gpu_memory_mib=8000, restartable=True,
                                                   grace_period_s=5, site="north", allow_remote_site=True,
                                                   max_wait_s=600))
    assert response.status_code == 201, response.content
    shown = response.json()
    assert {k: shown[k] for k in FLAGS} == {"gpu_milli": 250, "gpu_memory_mib": 8000, "mig_profile": "",
                                            "restartable": True, "allow_remote_site": True, "grace_period_s": 5}
    job = Job.objects.get()
    assert (job.gpu_milli, job.gpu_memory_mib, job.restartable, job.allow_remote_site, job.grace_period_s) == (
        250, 8000, True, True, 5)
    mig = operator.post("/api/v1/jobs/", body(mig_profile="1g.10gb")).json()
    assert (mig["mig_profile"], mig["gpu_milli"], mig["grace_period_s"], mig["restartable"]) == ("1g.10gb", 0, 30,
                                                                                                False)
    listed = operator.get("/api/v1/jobs/").json()["results"]
    assert {j["id"]: j["mig_profile"] for j in listed} == {job.pk: "", mig["id"]: "1g.10gb"}


def test_bad_options_name_the_field_and_change_nothing(cluster, tenant, operator):
    cases = [
        ({"gpu_milli": 1000}, "gpu_milli", "less than or equal to 999"),
        ({"gpu_milli": 250, "gpus": 4}, "gpu_milli", "ask for 1 GPU, not 4"),
        ({"mig_profile": "1g.10gb", "gpu_milli": 100}, "mig_profile", "not both"),
        ({"mig_profile": "8g.80gb"}, "mig_profile", "not of the form Ng.Mgb"),
        ({"mig_profile": "x" * 21}, "mig_profile", "no more than 20 characters"),
        ({"gpu_memory_mib": -1}, "gpu_memory_mib", "greater than or equal to 0"),
        ({"grace_period_s": 3601}, "grace_period_s", "less than or equal to 3600"),
        ({"restartable": "perhaps"}, "restartable", "must be a valid boolean"),
        ({"allow_remote_site": True}, "allow_remote_site", "names its home site"),
    ]
    for change, field, words in cases:
        response = operator.post("/api/v1/jobs/", body(**change))
        assert response.status_code == 400, (change, response.content)
        problem = error(response)
        assert field in problem["fields"], (change, problem)
        assert words.lower() in " ".join(problem["fields"][field]).lower(), (change, problem)
    assert Job.objects.count() == 0


def test_the_schema_describes_the_options(cluster, viewer):
    schema = viewer.get("/api/schema/?format=json").json()["components"]["schemas"]
    submit = schema["JobSubmitRequest"]["properties"]
    assert (submit["gpu_milli"]["minimum"], submit["gpu_milli"]["maximum"]) == (0, 999)
    assert submit["grace_period_s"]["maximum"] == 3600 and submit["mig_profile"]["maxLength"] == 20
    assert "1g.10gb" in submit["mig_profile"]["description"]
    assert all(flag in schema["Job"]["properties"] for flag in FLAGS)


@pytest.mark.django_db(transaction=True)
def test_the_cli_submits_and_shows_a_shared_job(cluster, tenant, run):  # noqa: F811
    otto = caller("otto", "operator")
    out = run("submit", "--tenant", "physics", "--pool", "main", "--gpus", "1", "--gpu-share", "250", "--gpu-memory",
              "8000", "--restartable", "--grace", "5", "--site", "north", "--allow-remote-site", "--max-wait", "600",
              "--", "python", "serve.py", token=otto.token).stdout
    job = Job.objects.get()
    assert out.startswith(f"submitted job {job.pk}: 1 GPUs in pool main")
    assert (job.gpu_milli, job.gpu_memory_mib, job.restartable, job.grace_period_s, job.allow_remote_site) == (
        250, 8000, True, 5, True)
    assert "  sharing: 250/1000 of one GPU, 8000 MiB of GPU memory" in run("status", str(job.pk),
                                                                          token=otto.token).stdout
    mig = json.loads(run("--json", "submit", "--tenant", "physics", "--pool", "main", "--gpus", "1", "--mig", "2g.20gb",
                         "--", "x", token=otto.token).stdout)
    assert (mig["mig_profile"], mig["restartable"], mig["allow_remote_site"]) == ("2g.20gb", False, False)
    assert "  sharing: MIG 2g.20gb" in run("status", str(mig["id"]), token=otto.token).stdout

    bad = run("submit", "--tenant", "physics", "--pool", "main", "--gpus", "4", "--gpu-share", "500", "--mig",
              "1g.10gb", "--", "x", token=otto.token, expect=1)
    assert "  mig_profile: " in bad.stderr and "not both" in bad.stderr
    assert Job.objects.count() == 2
