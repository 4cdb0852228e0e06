"""The replay report: report.json and report.html (plotly, self-contained) in one folder.

PNG/SVG need kaleido, which is not installed: the report says so instead of failing.
"""
from __future__ import annotations

import html
import json
from pathlib import Path

from .sim import Cluster, Result, summary

MAX_POINTS = 2000  # per series in the HTML: enough to see the shape, small enough to open


def kaleido_available() -> bool:
    try:
        import kaleido  # noqa: F401
    except ImportError:
        return False
    return True


def build(trace: str, cluster: Cluster, results: list[Result], settings: dict) -> dict:
    first = results[0]
    return {
        "trace": trace,
        "jobs": len(first.outcomes) + len(first.unstarted),
        "gpus": cluster.gpus,
        "fabric": cluster.name,
        "settings": settings,
        "policies": {r.policy: summary(r, cluster) for r in results},
    }


def _thin(series: list[tuple[float, float]]) -> tuple[list, list]:
    step = max(1, len(series) // MAX_POINTS)
    picked = series[::step]
    return [round(t / 3600, 3) for t, _ in picked], [round(v, 4) for _, v in picked]


def write(out: Path | str, report: dict, results: list[Result], openb: dict | None = None) -> list[Path]:
    """Write report.json and report.html (and images when kaleido exists); return the paths."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if openb is not None:
        report = {**report, "openb": openb}
    notes = []
    images = kaleido_available()
    if not images:
        notes.append("PNG/SVG plots skipped: kaleido is not installed (pip install kaleido to get them); "
                     "the HTML report has the same plots.")
    report = {**report, "notes": notes}
    paths = [out / "report.json", out / "report.html"]
    paths[0].write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")

    fig = make_subplots(rows=3, cols=1, subplot_titles=(
        "GPU utilization (busy share of GPUs, at each cycle)",
        "Fragmentation (free GPUs not on wholly free hosts, share of free GPUs)",
        "Average queueing delay by job size (s)"), vertical_spacing=0.09)
    for r in results:
        x, y = _thin(r.util_series)
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name=f"{r.policy} utilization"), row=1, col=1)
        x, y = _thin(r.frag_series)
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name=f"{r.policy} fragmentation"), row=2, col=1)
        sizes = report["policies"][r.policy]["by_size"]
        fig.add_trace(go.Bar(x=list(sizes), y=[v["avg_queue_s"] for v in sizes.values()], name=f"{r.policy} queue"),
                      row=3, col=1)
    fig.update_xaxes(title_text="simulated hours", row=1, col=1)
    fig.update_xaxes(title_text="simulated hours", row=2, col=1)
    fig.update_xaxes(title_text="GPUs per job", row=3, col=1)
    fig.update_layout(height=1100, title_text=f"Replay of {report['trace']} on {report['gpus']} GPUs")
    rows = "".join(
        f"<tr><td>{html.escape(name)}</td><td>{p['avg_queue_s']}</td><td>{p['p95_queue_s']}</td><td>{p['avg_jct_s']}"
        f"</td><td>{p['utilization']}</td><td>{p['mean_leaves_multi_leaf']} (bound {p['mean_leaves_lower_bound']})"
        f"</td><td>{p['fragmentation']}</td><td>{p['preemptions']}</td><td>{p['replay_seconds']}</td></tr>"
        for name, p in report["policies"].items())
    extra = ""
    if openb is not None:
        extra = "<h2>Alibaba openb: GPU capacity left unallocated</h2><ul>" + "".join(
            f"<li>{html.escape(k)}: {v['unallocated_gpu_share']:.2%} ({v['failed']} of {v['pods']} pods refused)</li>"
            for k, v in openb.get("policies", {}).items()) + "</ul>"
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>FabricPool replay</title></head><body>"
        f"<h1>Replay of {html.escape(str(report['trace']))}</h1>"
        f"<p>{report['jobs']} jobs on {html.escape(str(report['fabric']))} ({report['gpus']} GPUs). "
        f"Settings: {html.escape(json.dumps(report['settings']))}.</p>"
        "<table border='1' cellpadding='4'><tr><th>policy</th><th>avg queue s</th><th>p95 queue s</th>"
        "<th>avg JCT s</th><th>utilization</th><th>leaves per multi-host job</th><th>fragmentation</th>"
        "<th>preemptions</th><th>replay s</th></tr>" + rows + "</table>" + extra
        + "".join(f"<p>{html.escape(n)}</p>" for n in notes)
        + fig.to_html(full_html=False, include_plotlyjs=True) + "</body></html>")
    paths[1].write_text(page)
    if images:
        for suffix in ("png", "svg"):
            path = out / f"report.{suffix}"
            fig.write_image(str(path))
            paths.append(path)
    return paths
