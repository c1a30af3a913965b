"""The report of ``make bench`` (:mod:`bench.run`): the environment a run is dated and
described by (machine, Kubernetes, etcd and kwok versions, Python packages, commit), the
results table with one column per size N (each row a label and how to render its cell),
the per-size breakdown of writes, reads and CPU, and the generated block of
docs/benchmarks.md it all goes into between the ``BEGIN GENERATED RESULTS`` markers."""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import statistics
import subprocess
from typing import Any

from bench.common import DOC, ROOT, cpu_model, memory_gib, utc_minute, write_block
from stateward_local import binaries

BEGIN = "<!-- BEGIN GENERATED RESULTS: written by `make bench` (bench/run.py); edits are lost -->"
END = "<!-- END GENERATED RESULTS -->"


def environment() -> dict[str, str]:
    """When and on what the runs ran: the machine, the versions of the control plane, kwok,
    Python and its Kubernetes libraries, and the commit."""
    cpu, memory = cpu_model(), memory_gib()
    paths = binaries.ensure()
    commit = "?"
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    versions = {
        "kubernetes": paths.kube_apiserver.parent.name.removeprefix("kubernetes-"),
        "etcd": paths.etcd.parent.name.removeprefix("etcd-"),
        "kwok": paths.kwok.parent.name.removeprefix("kwok-"),
    }
    python_packages = []
    for package in ("lightkube", "httpx2"):
        with contextlib.suppress(Exception):
            from importlib.metadata import version

            python_packages.append(f"{package} {version(package)}")
    return {
        "date": utc_minute(),
        "machine": f"{os.cpu_count()} CPUs ({cpu}), {memory:.0f} GiB RAM, "
        f"Linux {platform.release()}",
        "versions": f"Kubernetes {versions['kubernetes']}, etcd {versions['etcd']}, "
        f"kwok {versions['kwok']}, Python {platform.python_version()}, "
        + ", ".join(python_packages),
        "commit": commit,
    }


def _fmt(value: Any, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, float):
        text = f"{value:.0f}" if abs(value) >= 100 else f"{value:.1f}".rstrip("0").rstrip(".")
        if abs(value) < 1 and value:
            text = f"{value:.2f}"
        return text + unit
    return f"{value}{unit}"


def _per_cluster(result: dict[str, Any], key: str, field: str) -> float | None:
    section = result.get(key)
    return float(section[field]) / int(result["clusters"]) if section else None


def _per_minute(result: dict[str, Any], field: str) -> float | None:
    section = result.get("audit_steady")
    if not section:
        return None
    return float(section[field]) * 60 / float(result["steady_window_s"])


def _converged(r: dict[str, Any]) -> str:
    if r.get("converge_seconds"):
        return f"**{_fmt(r['converge_seconds'], ' s')}**"
    return f"{r['converged']}/{r['clusters']} ({r.get('note', '')})"


def _cluster_latency(r: dict[str, Any]) -> str:
    p50, p95, top = r["cluster_latency_p50"], r["cluster_latency_p95"], r["cluster_latency_max"]
    return f"{_fmt(p50)} / {_fmt(p95)} / {_fmt(top)} s"


def _ready(r: dict[str, Any]) -> str:
    if r.get("ready_seconds"):
        return _fmt(r["ready_seconds"], " s")
    return f"{r.get('ready', 0)}/{r['clusters']} Ready"


def _status_patches(r: dict[str, Any]) -> str:
    found = r.get("status_patches_until_ready")
    if not found:
        return "—"
    between = found.get("between") or {}
    said = f"**{_fmt(found['mean'])} / {found['max']}**"
    if any(between.values()):
        said += f" (between first and Ready: {between.get('progress', 0)} progress,"
        said += f" {between.get('problem', 0)} problem)"
    return said


def _reads(r: dict[str, Any]) -> str:
    if not r.get("audit_ready"):
        return "—"
    return f"{r['audit_ready']['reads']} ({_fmt(_per_cluster(r, 'audit_ready', 'reads'))})"


def _change_latency(r: dict[str, Any]) -> str:
    samples = r.get("change_latencies") or []
    values = [v for v in samples if v is not None]
    if not values:
        return f"none of {len(samples)} acted on" if samples else "—"
    missed = len(samples) - len(values)
    text = f"{_fmt(statistics.median(values))} s / {_fmt(max(values))} s"
    return text + (f" ({missed} of {len(samples)} not acted on in time)" if missed else "")


def _ratio(r: dict[str, Any], operator: str, limit: str) -> str:
    if not r.get(operator) or not r.get(limit):
        return "—"
    return f"{r[operator] / r[limit]:.2f}"


def _leadership(r: dict[str, Any]) -> str:
    gap = r.get("lease_max_gap_run_s")
    losses = r.get("leadership_losses", r.get("leadership_losses_converge"))
    text = f"{losses} ({r.get('leadership_losses_steady', '—')} in the window)"
    return text + (f"; longest gap {_fmt(gap, ' s')}" if gap is not None else "")


ROWS: list[tuple[str, Any]] = [
    (
        "PostgresClusters x replicas (pods)",
        lambda r: f"{r['clusters']} x {r['replicas']} ({r['pods']})",
    ),
    ("kwok nodes", lambda r: str(r["nodes"])),
    ("all create calls returned after", lambda r: _fmt(r.get("created_seconds"), " s")),
    ("**first create → every cluster converged**", _converged),
    ("per cluster, its create → converged: p50 / p95 / max", _cluster_latency),
    ("first create → every cluster Ready (simulated pods)", _ready),
    (
        "operator: first create → its last converging write",
        lambda r: _fmt(r.get("last_write_seconds"), " s"),
    ),
    (
        "bare client, the operator's writes and nothing else: first create → last write",
        lambda r: _fmt(r.get("bare_last_write_seconds"), " s"),
    ),
    (
        "**operator ÷ bare client: last converging write** (goal ≤ 1.2)",
        lambda r: f"**{_ratio(r, 'last_write_seconds', 'bare_last_write_seconds')}**",
    ),
    (
        "first create → every StatefulSet ready: operator / bare client",
        lambda r: (
            f"{_fmt(r.get('statefulsets_ready_seconds'), ' s')}"
            f" / {_fmt(r.get('bare_statefulsets_ready_seconds'), ' s')}"
        ),
    ),
    (
        "**operator ÷ bare client: every StatefulSet ready** (goal ≤ 1.2)",
        lambda r: (
            f"**{_ratio(r, 'statefulsets_ready_seconds', 'bare_statefulsets_ready_seconds')}**"
        ),
    ),
    (
        "**operator peak RSS (VmHWM), until converged**",
        lambda r: f"**{_fmt(r['rss_peak_converged_mib'], ' MiB')}**",
    ),
    ("operator peak RSS (VmHWM), whole run", lambda r: _fmt(r.get("rss_peak_mib"), " MiB")),
    ("operator RSS at steady state", lambda r: _fmt(r.get("rss_steady_mib"), " MiB")),
    ("operator CPU until converged", lambda r: _fmt(r["operator_cpu_converge_s"], " s")),
    (
        "reconciles until converged (mean duration)",
        lambda r: f"{r['reconciles_converge']} ({_fmt(r['reconcile_mean_ms'], ' ms')})",
    ),
    ("max work-queue depth seen", lambda r: str(r["max_queue_depth"])),
    (
        "**writes per cluster, until converged**",
        lambda r: f"**{_fmt(_per_cluster(r, 'audit_converge', 'writes'))}**",
    ),
    ("writes per cluster, until Ready", lambda r: _fmt(_per_cluster(r, "audit_ready", "writes"))),
    ("**status patches per cluster until its Ready: mean / max** (goal ≤ 2)", _status_patches),
    ("reads until Ready, total (per cluster)", _reads),
    ("**steady state: writes per minute**", lambda r: f"**{_fmt(_per_minute(r, 'writes'))}**"),
    ("steady state: reads per minute", lambda r: _fmt(_per_minute(r, "reads"))),
    (
        "steady state: Lease writes per minute (leader election)",
        lambda r: _fmt(_per_minute(r, "lease_writes")),
    ),
    (
        "steady state: operator CPU in the window (mean reconcile)",
        lambda r: (
            f"{_fmt(r.get('operator_cpu_steady_s'), ' s')}"
            f" ({_fmt(r.get('steady_reconcile_mean_ms'), ' ms')})"
        ),
    ),
    ("**leader Lease lost, whole run; longest gap between renewals (2 s)**", _leadership),
    (
        "steady state: reconciles in the window",
        lambda r: f"{r.get('steady_reconciles', '—')} in {_fmt(r.get('steady_window_s'), ' s')}",
    ),
    ("**one spec change → StatefulSet updated: median / max**", _change_latency),
    ("whole run (bring-up to teardown)", lambda r: _fmt(r.get("run_seconds"), " s")),
]


RATIOS: list[tuple[str, str, str]] = [
    ("last converging write", "last_write_seconds", "bare_last_write_seconds"),
    ("every StatefulSet ready", "statefulsets_ready_seconds", "bare_statefulsets_ready_seconds"),
]
"""The two overheads over the bare client: (what, the operator's field, the bare client's)."""


def _size(r: dict[str, Any]) -> tuple[int, int]:
    return r["clusters"], r["replicas"]


def _heading(r: dict[str, Any], results: list[dict[str, Any]]) -> str:
    same = [x for x in results if _size(x) == _size(r)]
    label = f"N = {r['clusters']}"
    return label if len(same) == 1 else f"{label}, run {same.index(r) + 1}"


def medians(results: list[dict[str, Any]]) -> str:
    """For each size run more than once, the median of each run's operator ÷ bare ratio.

    Each ratio pairs an operator and a bare client on the same control plane minutes apart,
    so it is the meaningful unit; between runs both sides move (the bare client's last write
    varied from 11 to 18 s at 100 x 3 on this machine), so one run's ratio is a sample, not
    the figure."""
    lines = []
    for size in sorted({_size(r) for r in results}):
        runs = [r for r in results if _size(r) == size]
        if len(runs) < 2:
            continue
        parts = []
        for what, operator, bare in RATIOS:
            values = [r[operator] / r[bare] for r in runs if r.get(operator) and r.get(bare)]
            if values:
                each = ", ".join(f"{v:.2f}" for v in values)
                parts.append(f"{what} **{statistics.median(values):.2f}** ({each})")
        if parts:
            lines.append(
                f"**Operator ÷ bare client at N = {size[0]} x {size[1]}, median of"
                f" {len(runs)} runs** (goal ≤ 1.2): " + "; ".join(parts) + "."
            )
    return "\n\n".join(lines)


def table(results: list[dict[str, Any]]) -> str:
    header = "| | " + " | ".join(_heading(r, results) for r in results) + " |"
    rule = "|---|" + "---|" * len(results)
    body = [f"| {label} | " + " | ".join(cell(r) for r in results) + " |" for label, cell in ROWS]
    return "\n".join([header, rule, *body])


def breakdown(result: dict[str, Any], heading: str | None = None) -> str:
    lines = [f"**{heading or 'N = ' + str(result['clusters'])}**, per cluster until converged:"]
    section = result.get("audit_converge")
    if section:
        n = result["clusters"]
        lines.append(
            "writes "
            + ", ".join(f"{k} {v / n:.2f}" for k, v in section["writes_by"].items())
            + (f" (failed: {section['write_errors']})" if section["write_errors"] else "")
            + "; reads (whole run until Ready, all clusters): "
            + ", ".join(
                f"{k.replace(' ?', ' non-resource')} {v}"
                for k, v in result["audit_ready"]["reads_by"].items()
            )
            + "."
        )
        steady = result["audit_steady"]
        if steady["writes"]:
            lines.append("Steady-state writes: " + json.dumps(steady["writes_by"]) + ".")
    lines.append(
        "CPU seconds of each process until converged: "
        + ", ".join(f"{k} {v:g}" for k, v in sorted(result["component_cpu_converge_s"].items()))
        + f", operator {result['operator_cpu_converge_s']:g}"
        + (
            f", this script {result['bench_cpu_converge_s']:g}; the machine's CPUs were busy"
            f" {result['cpus_busy_converge']:g} of {os.cpu_count()} on average, of which"
            f" {result['other_cpu_converge_s']:g} CPU-s were processes foreign to this run."
            if "other_cpu_converge_s" in result
            else "."
        )
    )
    if "bare_component_cpu_s" in result:
        lines.append(
            "The bare client's replay, until its last write: "
            + ", ".join(f"{k} {v:g}" for k, v in sorted(result["bare_component_cpu_s"].items()))
            + f", the client itself {result['bare_client_cpu_s']:g} CPU-s."
        )
    return "\n".join(lines)


def markdown(results: list[dict[str, Any]], env: dict[str, str]) -> str:
    parts = [
        "## Results",
        "",
        f"Run {env['date']} on {env['machine']}; {env['versions']}; HEAD `{env['commit']}`"
        " (the working tree, as it was).",
        "",
        table(results),
        "",
        *([summary, ""] if (summary := medians(results)) else []),
        *[breakdown(r, _heading(r, results)) + "\n" for r in results],
    ]
    return "\n".join(parts).rstrip() + "\n"


def write_doc(text: str) -> None:
    """``text`` between the generated-results markers of docs/benchmarks.md (appended,
    without a method, the first time)."""
    DOC.parent.mkdir(parents=True, exist_ok=True)
    write_block(DOC, text, "", begin=BEGIN, end=END)
