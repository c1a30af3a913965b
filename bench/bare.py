"""The bare-client limit of ``make bench``: the operator's own writes, replayed without an
operator, on the same control plane in the same run.

After the operator has converged N clusters, ``bench.run`` stops it and this module replays,
for N new clusters in another namespace, exactly the writes the operator sent: every create,
patch and delete its user made while converging, as the API server's audit log recorded
them (level Request for the operator's writes, so each carries its body), cluster by
cluster in the order sent, by as many concurrent workers as the operator has, each creating
its cluster first as the benchmark did. Nothing is computed, read, watched or waited for:
what is left is the cost of the writes themselves, the floor any operator sending them
stands on. The operator's time over this floor is its overhead.

A replayed body is the recorded one with its namespace and its owner's uid (and an Event's
involved object) rewritten for the new namespace; server-side applies stay applies, merge
and JSON patches stay what they were. Writes the API server refuses are counted, not
retried (none are expected: the operator's writes succeeded).

Pure parts (:func:`recorded_writes`, :func:`rewrite`) are unit tested; :func:`replay` and
:func:`wait_statefulsets_ready` talk to the API server.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import json
import re
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

WRITE_VERBS = frozenset({"create", "update", "patch", "delete"})
CLUSTER = re.compile(r"^(pg-\d+)(?:$|[-.])")
"""A cluster's name at the start of each of its children's (and Events') names."""

APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


@dataclasses.dataclass(frozen=True)
class Write:
    at: float
    verb: str
    uri: str
    body: Any
    """The recorded request body: an object (create, apply, merge patch) or a list (JSON
    patch); None for a delete."""

    @property
    def content_type(self) -> str:
        if self.verb != "patch":
            return "application/json"
        if isinstance(self.body, list):
            return JSON_PATCH
        if "fieldManager=" in self.uri and "force=true" in self.uri:
            return APPLY
        return MERGE


def recorded_writes(
    lines: Iterable[str], user: str, namespace: str, start: float, end: float
) -> dict[str, list[Write]]:
    """The writes ``user`` sent in ``namespace`` in [start, end), by cluster, in the order
    sent (each request once: the audit log may record a stage twice)."""
    seen: set[str] = set()
    by_cluster: dict[str, list[Write]] = {}
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("user", {}).get("username") != user or entry.get("verb") not in WRITE_VERBS:
            continue
        ref = entry.get("objectRef") or {}
        if ref.get("namespace") != namespace or entry["auditID"] in seen:
            continue
        seen.add(entry["auditID"])
        at = datetime.datetime.fromisoformat(entry["requestReceivedTimestamp"]).timestamp()
        if not start <= at < end:
            continue
        if (entry.get("responseStatus") or {}).get("code", 0) >= 400:
            continue  # what failed for the operator is no part of converging
        matched = CLUSTER.match(ref.get("name") or "")
        if matched is None:
            continue
        write = Write(at, entry["verb"], entry["requestURI"], entry.get("requestObject"))
        by_cluster.setdefault(matched.group(1), []).append(write)
    for writes in by_cluster.values():
        writes.sort(key=lambda w: w.at)
    return by_cluster


def status_patches_until_ready(by_cluster: Mapping[str, Sequence[Write]]) -> dict[str, Any]:
    """Per cluster, the status patches it took to reach Ready, the one saying so included
    (all of them for one that never said so): their mean and max over the clusters. The goal
    of issue 24 is at most 2: one while it comes up, one when it is Ready. ``between`` counts
    the patches that were neither a cluster's first nor its Ready, by what they said: a
    ``problem`` (phase Failing or Degraded True) or only ``progress``."""
    counts = []
    between = {"problem": 0, "progress": 0}
    for writes in by_cluster.values():
        count = 0
        for write in writes:
            if write.verb != "patch" or not write.uri.split("?")[0].endswith("/status"):
                continue
            count += 1
            status = (write.body.get("status") or {}) if isinstance(write.body, dict) else {}
            if status.get("phase") == "Ready":
                break
            if count > 1:
                between["problem" if _says_problem(status) else "progress"] += 1
        counts.append(count)
    if not counts:
        return {"mean": 0.0, "max": 0, "between": between}
    return {"mean": round(sum(counts) / len(counts), 2), "max": max(counts), "between": between}


def _says_problem(status: Mapping[str, Any]) -> bool:
    conditions = status.get("conditions") or []
    degraded = any(
        isinstance(c, dict) and c.get("type") == "Degraded" and c.get("status") == "True"
        for c in conditions
    )
    return degraded or status.get("phase") == "Failing"


def rewrite(value: Any, *, source: str, target: str, uid: str) -> Any:
    """``value`` (a recorded body or URI) for the replayed cluster: the namespace ``source``
    becomes ``target``; every owner reference (and an Event's involved object) of kind
    PostgresCluster points at ``uid``."""
    if isinstance(value, str):
        return value.replace(f"/namespaces/{source}/", f"/namespaces/{target}/")
    if isinstance(value, list):
        return [rewrite(item, source=source, target=target, uid=uid) for item in value]
    if not isinstance(value, dict):
        return value
    out = {key: rewrite(item, source=source, target=target, uid=uid) for key, item in value.items()}
    if out.get("namespace") == source:
        out["namespace"] = target
    if out.get("kind") == "PostgresCluster" and "uid" in out:
        out["uid"] = uid
    out.pop("resourceVersion", None)
    return out


class Http(Protocol):
    def request(
        self, method: str, url: str, *, content: bytes, headers: Mapping[str, str]
    ) -> Any: ...


@dataclasses.dataclass
class Replayed:
    first_sent: float
    last_answered: float
    writes: int
    refused: dict[str, int]


def replay(
    http: Http,
    create_cluster: Any,
    names: Sequence[str],
    writes: Mapping[str, Sequence[Write]],
    *,
    source: str,
    target: str,
    workers: int,
) -> Replayed:
    """Each cluster of ``names``: ``create_cluster(name)`` (returns its uid), then the writes
    the operator sent for the cluster of that name, in order, on ``workers`` threads."""
    missing = [name for name in names if not writes.get(name)]
    if missing:
        raise RuntimeError(f"no recorded write of the operator for {len(missing)} clusters")
    methods = {"create": "POST", "update": "PUT", "patch": "PATCH", "delete": "DELETE"}
    lock = threading.Lock()
    refused: dict[str, int] = {}
    count = 0
    last = 0.0

    def one(name: str) -> None:
        nonlocal count, last
        uid = create_cluster(name)
        for write in writes[name]:
            body = b""
            if write.body is not None:
                replayed = rewrite(write.body, source=source, target=target, uid=uid)
                body = json.dumps(replayed).encode()
            response = http.request(
                methods[write.verb],
                rewrite(write.uri, source=source, target=target, uid=uid),
                content=body,
                headers={"Content-Type": write.content_type},
            )
            with lock:
                count += 1
                last = max(last, time.time())
                if response.status_code >= 400:
                    key = f"{write.verb} {response.status_code}"
                    refused[key] = refused.get(key, 0) + 1

    first = time.time()
    with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="bare") as pool:
        for future in [pool.submit(one, name) for name in names]:
            future.result()
    return Replayed(first, last, count, refused)


def audit_lines(directory: Path) -> Iterable[str]:
    """Every line of the audit log, rotated files included."""
    for path in sorted(directory.glob("audit*.log")):
        with path.open() as lines:
            yield from lines


def statefulsets_ready(items: Sequence[Mapping[str, Any]], names: Sequence[str]) -> int:
    """How many of the StatefulSets ``names`` have every replica ready."""
    ready = {
        item["metadata"]["name"]
        for item in items
        if (item.get("status") or {}).get("readyReplicas", 0)
        >= ((item.get("spec") or {}).get("replicas") or 0)
        > 0
    }
    return len(ready & set(names))
