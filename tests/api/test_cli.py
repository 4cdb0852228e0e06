"""The `fabricpool` command line against a live test server, run as a user would run it (a
subprocess): submit, status, queue, cancel and hosts, in text and --json, and the errors a
user meets (bad token, a viewer's token, bad input, no server) as one clear message."""
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler.models import Job

from .conftest import caller

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def run(live_server, tmp_path):
    def run(*args, token=None, url=None, config=None, expect=0):
        env = {k: v for k, v in os.environ.items() if not k.startswith("FABRICPOOL_")}
        env.update(FABRICPOOL_URL=url or live_server.url, FABRICPOOL_CONFIG=str(config or tmp_path / "none.toml"))
        if token:
            env["FABRICPOOL_TOKEN"] = token
        done = subprocess.run([sys.executable, "-m", "fabricpool.cli", *args], env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == expect, (done.stdout, done.stderr)
        return done
    return run


def test_submit_status_queue_cancel(cluster, tenant, run):
    otto = caller("otto", "operator")
    out = run("submit", "--tenant", "physics", "--pool", "main", "--gpus", "4", "--name", "resnet", "--max-leaves", "1",
              "--env", "SEED=7", "--", "python", "train.py", "--lr", "0.1", token=otto.token).stdout
    job = Job.objects.get()
    assert out.strip() == (f"submitted job {job.pk}: 4 GPUs in pool main for physics (pending). "
                           f"Follow it with: fabricpool status {job.pk}")
    assert (job.command, job.env, job.max_leaves, job.submitted_by.username) == (
        ["python", "train.py", "--lr", "0.1"], {"SEED": "7"}, 1, "otto")

    status = run("status", str(job.pk), token=otto.token).stdout
    assert status.startswith(f"job {job.pk} (resnet): pending\n")
    assert "command: python train.py --lr 0.1" in status and "tenant physics, pool main, 4 GPUs" in status

    queue = run("queue", token=otto.token).stdout.splitlines()
    assert queue[0].split()[:6] == ["ID", "NAME", "STATE", "TENANT", "POOL", "GPUS"]
    assert queue[1].split()[:6] == [str(job.pk), "resnet", "pending", "physics", "main", "4"]
    listed = json.loads(run("--json", "queue", "--user", "otto", token=otto.token).stdout)
    assert [(j["id"], j["state"]) for j in listed] == [(job.pk, "pending")]

    assert run("cancel", str(job.pk), token=otto.token).stdout.strip() == f"job {job.pk} is cancelled: cancelled by otto"
    assert json.loads(run("--json", "status", str(job.pk), token=otto.token).stdout)["state"] == "cancelled"
    assert run("queue", token=otto.token).stdout.strip() == "no jobs"
    assert run("queue", "--all", token=otto.token).stdout.splitlines()[1].split()[:3] == [str(job.pk), "resnet",
                                                                                      "cancelled"]
    again = run("cancel", str(job.pk), token=otto.token, expect=1)
    assert again.stderr.strip() == (f"fabricpool: Job {job.pk} is already cancelled; only unfinished jobs can be "
                                    "cancelled.")


def test_hosts_and_the_config_file(cluster, run, tmp_path, live_server):
    vera = caller("vera", "viewer")
    config = tmp_path / "config.toml"
    config.write_text(f'url = "{live_server.url}"\ntoken = "{vera.token}"\n')
    config.chmod(0o600)
    env_free = dict(url=live_server.url, config=config)
    lines = run("hosts", **env_free).stdout.splitlines()
    assert lines[0].split()[:5] == ["NAME", "STATE", "POOL", "GPUS", "ALLOCATED"]
    assert lines[1].split()[:5] == ["gpu0001", "up", "main", "4", "0"] and len(lines) == 9
    assert run("hosts", "--state", "draining", **env_free).stdout.strip() == "no hosts"
    hosts = json.loads(run("--json", "hosts", "--pool", "main", **env_free).stdout)
    assert [h["name"] for h in hosts][:2] == ["gpu0001", "gpu0002"]


def test_errors_are_one_clear_message(cluster, tenant, run):
    vera = caller("vera", "viewer")
    bad = run("queue", token="fpt_notarealtoken", expect=1)
    assert bad.stderr.startswith("fabricpool: the API refused the token: Invalid or revoked API token. "
                                 "Create a new token at http://")
    refused = run("submit", "--tenant", "physics", "--pool", "main", "--gpus", "1", "--", "true", token=vera.token,
                  expect=1)
    assert "Only operators and admins may submit jobs; vera is viewer. Nothing was changed." in refused.stderr
    otto = caller("otto", "operator")
    invalid = run("submit", "--tenant", "nobody", "--pool", "main", "--gpus", "0", "--", "true", token=otto.token,
                  expect=1)
    assert "  gpus: Ensure this value is greater than or equal to 1." in invalid.stderr
    assert run("status", "999999", token=otto.token, expect=1).stderr.strip() == (
        "fabricpool: Job '999999' does not exist.")
    assert "is not a job id" in run("status", "abc", token=otto.token, expect=1).stderr
    assert "no API token: set FABRICPOOL_TOKEN" in run("queue", expect=1).stderr
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = run("queue", token=otto.token, url=f"http://127.0.0.1:{port}", expect=1)
    assert "cannot reach FabricPool at http://127.0.0.1:" in down.stderr and "connection refused" in down.stderr
    assert Job.objects.count() == 0


def test_the_console_script_is_installed():
    script = Path(sys.executable).parent / "fabricpool"
    assert script.exists() or shutil.which("fabricpool"), "run: pip install -e . --no-deps"
    done = subprocess.run([str(script if script.exists() else shutil.which("fabricpool")), "--help"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and "submit" in done.stdout and "hosts" in done.stdout
