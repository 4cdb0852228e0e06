"""Trace replay: tiny traces with known answers for each policy, malformed traces refused
with file:line and nothing replayed, and `manage.py replay` writing its report."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from scheduler.replay import sim, traces
from scheduler.replay.traces import TraceError, TraceJob

DATA = Path(__file__).resolve().parents[2] / "data"
ITP_SAMPLE = DATA / "msft_itp_cluster04_first200.csv"
OPENB_PODS = DATA / "alibaba_openb_pod_list_first150.csv"
OPENB_NODES = DATA / "alibaba_openb_node_list_first40.csv"


def small():  # 2 leaves x 2 hosts x 4 GPUs = 16 GPUs
    return sim.fat_tree_cluster(leaves=2, hosts_per_leaf=2, gpus_per_host=4)


def starts(result):
    return {o.job.id: o.start for o in result.outcomes}


HEAD_OF_LINE = [TraceJob("big-running", 0, 100, 8), TraceJob("all", 1, 10, 16), TraceJob("short", 2, 10, 4)]


def test_fifo_blocks_behind_the_head_job():
    r = sim.replay(small(), HEAD_OF_LINE, "fifo", cycle_s=0)
    assert starts(r) == {"big-running": 0, "all": 100, "short": 110}


@pytest.mark.parametrize("policy", ["backfill", "fabricpool"])
def test_backfill_and_fabricpool_start_the_short_job_before_the_reservation(policy):
    r = sim.replay(small(), HEAD_OF_LINE, policy, cycle_s=0)
    assert starts(r) == {"big-running": 0, "all": 100, "short": 2}
    s = sim.summary(r, small())
    assert s["avg_queue_s"] == 33.0 and s["jobs_never_started"] == 0


def test_backfill_never_delays_the_reserved_job():
    jobs = [TraceJob("a", 0, 100, 8), TraceJob("head", 1, 10, 16), TraceJob("long", 2, 500, 4)]
    for policy in ("backfill", "fabricpool"):
        got = starts(sim.replay(small(), jobs, policy, cycle_s=0))
        assert got["head"] == 100 and got["long"] == 110, policy  # 500 s would run past the reservation


def test_fabricpool_keeps_a_multi_host_job_under_one_leaf_where_first_fit_splits_it():
    jobs = [TraceJob("one-host", 0, 1000, 4), TraceJob("two-hosts", 1, 1000, 8)]
    fifo = sim.summary(sim.replay(small(), jobs, "fifo", cycle_s=0), small())
    fabricpool = sim.summary(sim.replay(small(), jobs, "fabricpool", cycle_s=0), small())
    assert fifo["mean_leaves_multi_leaf"] == 2.0
    assert fabricpool["mean_leaves_multi_leaf"] == 1.0 == fabricpool["mean_leaves_lower_bound"]


def test_cycles_are_batched_on_the_cycle_interval():
    jobs = [TraceJob(str(i), i, 50, 1) for i in range(5)]
    r = sim.replay(small(), jobs, "fabricpool", cycle_s=10)
    assert set(starts(r).values()) == {0, 10}  # job 0 at t=0, the four others at the next cycle
    assert r.cycles == 2


def test_speed_compresses_submissions_not_run_times():
    jobs = [TraceJob("a", 0, 100, 16), TraceJob("b", 60, 100, 16)]
    r = sim.replay(small(), jobs, "fifo", cycle_s=0, speed=2)
    assert starts(r) == {"a": 0, "b": 100}
    assert sim.summary(r, small())["avg_queue_s"] == 35.0  # b submitted at 30, started at 100


def test_a_job_larger_than_the_cluster_is_refused():
    with pytest.raises(sim.ReplayError, match="asks for 64 GPUs; the cluster has 16"):
        sim.replay(small(), [TraceJob("x", 0, 1, 64)], "fifo")


def test_itp_sample_replays_under_every_policy_with_the_same_work_done():
    jobs = traces.read_itp(ITP_SAMPLE)
    assert len(jobs) == 200
    cluster = sim.fat_tree_cluster(leaves=8, hosts_per_leaf=4, gpus_per_host=8)
    busy = {}
    for policy in sim.POLICIES:
        r = sim.replay(cluster, jobs, policy)
        assert len(r.outcomes) == 200 and not r.unstarted
        busy[policy] = sum(o.job.gpus * (o.end - o.start) for o in r.outcomes)
        assert all(o.start >= o.job.submit for o in r.outcomes)
    assert len(set(busy.values())) == 1


def test_openb_pods_are_packed_without_over_committing(tmp_path):
    nodes = [traces.Node("n0", 8000, 64000, 2, "T4")]
    pods = [traces.Pod(f"p{i}", 1000, 1000, 1, milli, "BE", i) for i, milli in enumerate([600, 600, 400, 400])]
    for policy in sim.OPENB_POLICIES:
        out = sim.replay_openb(nodes, pods, policy)
        assert out["placed"] == 4 and out["unallocated_gpu_share"] == 0.0, policy
    # A whole-GPU pod after two fractions: fabricpool put both fractions on one GPU.
    pods = [traces.Pod("a", 0, 0, 1, 300, "BE", 0), traces.Pod("b", 0, 0, 1, 300, "BE", 1),
            traces.Pod("w", 0, 0, 1, 1000, "LS", 2)]
    assert sim.replay_openb(nodes, pods, "fabricpool")["failed"] == 0


@pytest.mark.parametrize("text, where", [
    ("job_id,submission_time,duration,num_gpu\na,0,10,1\nb,5,ten,1\n", ":3: duration must be a number"),
    ("job_id,submission_time,duration,num_gpu\na,0,10,0\n", ":2: num_gpu must be at least 1"),
    ("job_id,submission_time,duration,num_gpu\na,0,10\n", ":2: 3 fields, the header has 4"),
    ("job_id,submit,duration,num_gpu\na,0,10,1\n", "unknown trace format"),
])
def test_malformed_trace_is_refused_naming_file_and_line_and_nothing_is_written(tmp_path, text, where):
    bad = tmp_path / "bad.csv"
    bad.write_text(text)
    out = tmp_path / "out"
    with pytest.raises(CommandError, match=f"bad.csv{where}" if where.startswith(":") else where):
        call_command("replay", str(bad), "--fabric", "fattree:2x2x4", "--out", str(out))
    assert not out.exists()


def test_openb_row_with_a_bad_share_is_refused(tmp_path):
    bad = tmp_path / "pods.csv"
    lines = OPENB_PODS.read_text().splitlines()
    fields = lines[3].split(",")
    fields[4] = "1500"
    bad.write_text("\n".join(lines[:3] + [",".join(fields)] + lines[4:]) + "\n")
    with pytest.raises(TraceError, match=r"pods.csv:4: gpu_milli must be 1-1000"):
        traces.read_openb_pods(bad)


def test_command_writes_json_and_html_reports(tmp_path, capsys):
    out = tmp_path / "report"
    call_command("replay", str(ITP_SAMPLE), "--fabric", "fattree:8x4x8", "--policy", "fabricpool", "--policy",
                 "fifo", "--out", str(out))
    printed = capsys.readouterr().out
    assert "kaleido is not installed" in printed
    data = json.loads((out / "report.json").read_text())
    assert data["jobs"] == 200 and data["gpus"] == 256
    assert set(data["policies"]) == {"fabricpool", "fifo"}
    for key in ("avg_queue_s", "p95_queue_s", "avg_jct_s", "utilization", "mean_leaves_multi_leaf",
                "replay_seconds", "by_size", "fragmentation", "preemptions"):
        assert key in data["policies"]["fabricpool"]
    page = (out / "report.html").read_text()
    assert "GPU utilization" in page and "fabricpool" in page and "kaleido" in page


def test_command_replays_openb_on_its_node_list(tmp_path, capsys):
    out = tmp_path / "openb"
    call_command("replay", str(OPENB_PODS), "--fabric", "openb", "--nodes", str(OPENB_NODES), "--out", str(out))
    data = json.loads((out / "report.json").read_text())
    shares = data["openb"]["unallocated_gpu_share"]
    assert set(shares) == {"fabricpool", "bestfit"} and all(0 <= v <= 1 for v in shares.values())


@pytest.mark.django_db
def test_command_refuses_an_unknown_database_fabric(tmp_path):
    with pytest.raises(CommandError, match="no fabric named 'nope'"):
        call_command("replay", str(ITP_SAMPLE), "--fabric", "nope", "--out", str(tmp_path / "x"))


@pytest.mark.django_db
def test_command_replays_on_a_fabric_from_the_database(tmp_path):
    from tests.scheduler.conftest import build_cluster

    build_cluster(fabric="replaydb", leaves=2, hosts_per_leaf=2, gpus=4)
    trace = tmp_path / "t.csv"
    trace.write_text("job_id,submission_time,duration,num_gpu\na,0,100,4\nb,1,100,8\n")
    out = tmp_path / "r"
    call_command("replay", str(trace), "--fabric", "replaydb", "--policy", "fabricpool", "--out", str(out))
    data = json.loads((out / "report.json").read_text())
    assert data["gpus"] == 16 and "2 leaves" in data["fabric"]
    p = data["policies"]["fabricpool"]
    assert p["jobs_started"] == 2 and p["mean_leaves_multi_leaf"] == 1.0  # 8 GPUs: both hosts of the other leaf


def test_short_first_starts_the_short_job_of_one_cycle_first_and_queues_less():
    jobs = [TraceJob("big-running", 0, 1000, 8), TraceJob("long", 1, 100, 8), TraceJob("short", 2, 10, 8)]
    age = sim.replay(small(), jobs, "fabricpool", cycle_s=10)
    short = sim.replay(small(), jobs, "fabricpool_short_first", cycle_s=10)
    assert starts(age) == {"big-running": 0, "long": 10, "short": 110}
    assert starts(short) == {"big-running": 0, "short": 10, "long": 20}
    assert sim.summary(short, small())["avg_queue_s"] < sim.summary(age, small())["avg_queue_s"]
