"""What ``make bench`` (:mod:`bench.run`) observes of the operator and the local cluster
while it runs: the operator's requests as the API server's audit log recorded them (and their
summary per phase, Lease traffic apart), its ``/metrics`` (scraped, summed, the mean reconcile
duration between two scrapes), the leaderships it lost as its log says, and the CPU time of
each control-plane process. Nothing here starts or changes anything."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import itertools
import json
import math
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx

from bench.common import cpu_seconds_or_zero
from stateward_local.cluster import LocalCluster
from stateward_local.controlplane.components import OPERATOR_USER

WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
READ_VERBS = frozenset({"get", "list", "watch"})


# --- /metrics and processes -------------------------------------------------------------------


def scrape(port: int) -> dict[str, float]:
    """The operator's /metrics as {'name{labels}': value} (empty if unreachable)."""
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    except httpx.HTTPError:
        return {}
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                samples[key] = float(value)
    return samples


def metric(samples: dict[str, float], name: str, *labels: str) -> float:
    total = 0.0
    for key, value in samples.items():
        base = key.split("{", 1)[0]
        if base == name and all(label in key for label in labels):
            total += value
    return total


def reconcile_mean_ms(before: dict[str, float], after: dict[str, float]) -> float:
    """Mean reconcile duration between two scrapes of /metrics."""
    name = "stateward_reconcile_duration_seconds"
    count = metric(after, f"{name}_count") - metric(before, f"{name}_count")
    total = metric(after, f"{name}_sum") - metric(before, f"{name}_sum")
    return round(1000 * total / count, 1) if count > 0 else math.nan


def component_cpu(cluster: LocalCluster) -> dict[str, float]:
    return {
        record.name: cpu_seconds_or_zero(record.pid)
        for record in cluster.status()
        if record.running
    }


def leadership_losses(log: Path) -> int:
    """How often the operator said it lost the leader Lease (it then stops and campaigns)."""
    try:
        return log.read_text(errors="replace").count("lost leadership")
    except OSError:
        return 0


# --- the audit log ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Request:
    at: float
    verb: str
    resource: str
    code: int


def operator_requests(cluster: LocalCluster) -> list[Request]:
    """Every request of the operator's user in the audit log (rotated files included)."""
    seen: dict[str, Request] = {}
    for path in sorted(cluster.audit_log.parent.glob("audit*.log")):
        with path.open() as lines:
            for line in lines:
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue  # a line being written
                if entry.get("user", {}).get("username") != OPERATOR_USER:
                    continue
                if entry["auditID"] in seen:
                    continue  # watches are logged at ResponseStarted and ResponseComplete
                ref = entry.get("objectRef") or {}
                resource = ref.get("resource", "non-resource") + (
                    f"/{ref['subresource']}" if ref.get("subresource") else ""
                )
                at = datetime.datetime.fromisoformat(entry["requestReceivedTimestamp"]).timestamp()
                code = (entry.get("responseStatus") or {}).get("code", 0)
                seen[entry["auditID"]] = Request(at, entry["verb"], resource, code)
    return sorted(seen.values(), key=lambda r: r.at)


def first_writes(cluster: LocalCluster, namespace: str) -> dict[tuple[str, str], float]:
    """When each object in ``namespace`` was first written by the operator with success:
    (resource, name) -> the time the API server answered (epoch seconds)."""
    found: dict[tuple[str, str], float] = {}
    for path in sorted(cluster.audit_log.parent.glob("audit*.log")):
        with path.open() as lines:
            found_in(lines, namespace, found)
    return found


def found_in(lines: Iterable[str], namespace: str, found: dict[tuple[str, str], float]) -> None:
    """:func:`first_writes` of some audit log lines, into ``found``."""
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a line being written
        if entry.get("stage") != "ResponseComplete" or entry.get("verb") not in WRITE_VERBS:
            continue
        if entry.get("user", {}).get("username") != OPERATOR_USER:
            continue
        ref = entry.get("objectRef") or {}
        if ref.get("namespace") != namespace or ref.get("subresource") or not ref.get("name"):
            continue
        if (entry.get("responseStatus") or {}).get("code", 0) >= 400:
            continue
        at = datetime.datetime.fromisoformat(entry["stageTimestamp"]).timestamp()
        key = (ref.get("resource", ""), ref["name"])
        if key not in found or at < found[key]:
            found[key] = at


def summarize(requests: list[Request], start: float, end: float) -> dict[str, Any]:
    """The operator's requests received in [start, end), leader-election Lease traffic apart."""
    window = [r for r in requests if start <= r.at < end]
    lease = [r for r in window if r.resource == "leases"]
    other = [r for r in window if r.resource != "leases"]
    writes = [r for r in other if r.verb in WRITE_VERBS]
    reads = [r for r in other if r.verb in READ_VERBS]
    return {
        "writes": len(writes),
        "writes_by": dict(Counter(f"{r.verb} {r.resource}" for r in writes).most_common()),
        "write_errors": sum(1 for r in writes if r.code >= 400),
        "reads": len(reads),
        "reads_by": dict(Counter(f"{r.verb} {r.resource}" for r in reads).most_common()),
        "lease_writes": sum(1 for r in lease if r.verb in WRITE_VERBS),
        "lease_reads": sum(1 for r in lease if r.verb in READ_VERBS),
        # The renewal runs every 2 s on the operator's event loop: a longer gap between two
        # Lease requests is a stall of that loop (or of the API server).
        "lease_max_gap_s": round(
            max((b.at - a.at for a, b in itertools.pairwise(lease)), default=0.0), 1
        ),
    }
