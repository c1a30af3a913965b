"""The real data plane: apply → Ready, write downtime when the primary moves, idle memory.

Starts a fresh local cluster with 3 real nodes and no kwok nodes, in a temporary state
directory on free ports (binaries and images are built first, untimed, if missing), installs
the CRDs, starts the operator as a process (``stateward_local.run.start_operator``, as the tests
do), and measures, each ``--runs`` times (median and max reported):

1. **apply → Ready**: a 1-instance and a 3-instance PostgresCluster (version 15, 1Gi, no
   final backup), each in its own namespace, from the create call until ``status.phase`` is
   ``Ready`` (the object polled every 0.2 s); the namespace is deleted and waited for before
   the next;
2. **switchover write downtime**: on one 3-instance cluster, a writer on the host inserts
   numbered rows in a loop (one ``psql`` per insert, libpq ``target_session_attrs=read-write``
   over every pod IP) while the annotation ``stateward.io/switchover: any`` is set;
   downtime is the longest gap between consecutive acknowledged inserts around the
   switchover (the writer's own monotonic clock), and every acknowledged row must be on the
   new primary;
3. **pod-delete failover downtime**: the same writer while the primary's pod is deleted;
   then the cluster is waited for until it is Ready again with every instance;
4. **memory of the idle 3-instance cluster**: after Ready and a settle period, each instance
   pod's memory cgroup (under ``/sys/fs/cgroup/.../stateward/NODE/kubepods``): anonymous
   memory, shared memory and working set, plus the PSS of its processes; and the operator's
   RSS;
5. **pgbench through the pooler across 5 switchovers** (:mod:`bench.pgbench`): failed
   transactions and the latency each switchover costs an application on persistent
   connections.

Prints a table and writes it into docs/benchmarks.md between ``<!-- dataplane:begin -->``
and ``<!-- dataplane:end -->``; the rest of that file is left alone. Needs root, and no other
cluster with real nodes on this host: run it under the host's real-node lock,

    flock /tmp/stateward-real-nodes.lock .venv/bin/python -m bench.dataplane [--runs 3]
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import functools
import itertools
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx
from lightkube import Client
from lightkube.config.kubeconfig import KubeConfig

from bench import pgbench
from bench.common import (
    DOC,
    ROOT,
    Interrupted,
    environment,
    output_flags,
    pss_kib,
    ready_for_real_nodes,
    replace_block,
    say,
    status_kib,
    write_block,
)
from bench.nodes import memory_path
from stateward.api import v1alpha1
from stateward_local import binaries
from stateward_local.cluster import Config, LocalCluster
from stateward_local.controlplane.components import Ports
from stateward_local.controlplane.processes import free_port_base
from stateward_local.errors import LocalClusterError
from stateward_local.images import cache
from stateward_local.nodes import host, layout
from stateward_local.run import (
    OPERATOR_NAMESPACE,
    OperatorProcess,
    ensure_namespace,
    install_crds,
    start_operator,
)

BEGIN = "<!-- dataplane:begin -->"
END = "<!-- dataplane:end -->"
SECTION = "## Data plane"
METHOD = f"""\
{SECTION}

How fast the real data plane is and what it costs: `flock /tmp/stateward-real-nodes.lock
.venv/bin/python -m bench.dataplane` (`make bench-dataplane`; `--runs 3` by default, `--help`
for the rest) rewrites the part between the markers below; the rest of this section is
written by hand.

**Method.** A fresh local cluster with 3 real nodes and no kwok nodes (temporary state
directory, free ports, binaries and images cached), the CRDs, and the operator as a process
on the host. Every PostgresCluster is version 15, 1Gi, `deletionPolicy.finalBackup: false`.
*apply → Ready* runs from the create call to the first GET (every 0.2 s) showing
`status.phase: Ready`; each cluster has its own namespace, deleted and waited for before the
next. *Write downtime*: a writer on the host runs one `psql` per insert of a numbered row
(libpq `target_session_attrs=read-write` over the three pod IPs, `connect_timeout=2`,
retrying at once after an error) and notes when each insert was acknowledged; downtime is
the longest gap between consecutive acknowledged inserts whose interval overlaps the event
(from the request, or the pod delete, until the switchover is `Succeeded` with its
annotation gone, or until `status.primaryPod` names another pod), so it includes one insert's
own time (a few tens of ms). *Lost rows* are acknowledged numbers missing on the new primary.
A switchover is `stateward.io/switchover: any` set by a merge patch; a failover is a DELETE of
the primary's pod (default grace period), after which the cluster is waited for until Ready
with every instance again. *Through the pooler*: the measured 3-instance cluster has
`spec.pooler` (2 PgBouncer pods, transaction pooling); during each switchover and failover a
second writer does the same through the pooler's Service address (`sslmode=require`), and
its downtime, failed inserts and lost rows are counted the same way. *pgbench through the
pooler*: afterwards, pgbench (`-i -s 1` on the primary, then 4 clients, 2 threads,
`--protocol=simple`, `--log`, 240 s) through the pooler's Service while 5 switchovers are
requested one after another (each once the cluster is settled); failed transactions are
pgbench's count (and its log's) plus the clients it aborted; latency percentiles are over
the transactions completed outside the switchovers' windows (request until 5 s after
`Succeeded`), and each window reports its worst latency and its longest time with no
transaction completed. *Memory*: after Ready
and a settle period with no client, each instance pod's memory cgroup (pause and
PostgreSQL/Patroni container together; cgroup v1 `total_rss`/`total_shmem`, v2
`anon`/`shmem`; working set = usage minus inactive file), the PSS summed over the pod's
processes (shared buffers counted once), and the operator's VmRSS; means
of 5 samples 1 s apart. The machine is shared with other work; figures are of a small
development machine.
"""

API = f"/apis/{v1alpha1.GROUP}/{v1alpha1.VERSION}"
NODES = 3
POOLERS = 2
"""PgBouncer pods of the measured cluster (``spec.pooler.instances``)."""
POLL = 0.2
T = TypeVar("T")


# --- pure helpers ---------------------------------------------------------------------------


def longest_gap(stamps: Sequence[float], start: float = -math.inf, end: float = math.inf) -> float:
    """The longest interval between consecutive ``stamps`` that overlaps [start, end]."""
    return max(
        (b - a for a, b in itertools.pairwise(stamps) if b >= start and a <= end), default=0.0
    )


def lost_rows(acknowledged: Iterable[int], present: Iterable[int]) -> list[int]:
    """Acknowledged row numbers that are not present, in order."""
    return sorted(set(acknowledged) - set(present))


def parse_rows(text: str) -> set[int]:
    """Row numbers from ``string_agg(n::text, ',')`` output ('' when the table is empty)."""
    return {int(part) for part in text.strip().split(",") if part}


def median_max(values: Sequence[float]) -> tuple[float, float]:
    if not values:
        return math.nan, math.nan
    return statistics.median(values), max(values)


def memory_stat(text: str) -> dict[str, float]:
    """anon, shmem, file and inactive_file in MiB from a memory cgroup's ``memory.stat``
    (v1: the hierarchical ``total_*`` fields; v2: the plain ones)."""
    stat = {k: int(v) for k, v in (line.split() for line in text.splitlines() if line.strip())}
    names = {
        "anon": ("total_rss", "anon"),
        "shmem": ("total_shmem", "shmem"),
        "file": ("total_cache", "file"),
        "inactive_file": ("total_inactive_file", "inactive_file"),
    }
    return {
        key: next((stat[n] for n in candidates if n in stat), 0) / 2**20
        for key, candidates in names.items()
    }


def stamp(seconds_ago: float = 1.0) -> str:
    """An RFC 3339 UTC time, like the operator's ``startedAt``, slightly in the past."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - seconds_ago))


def wait_until(
    check: Callable[[], T | None], what: str, timeout: float, interval: float = POLL
) -> T:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


# --- the API --------------------------------------------------------------------------------


class Kube:
    """The few API calls this needs, over the admin client of the local cluster."""

    def __init__(self, client: httpx.Client) -> None:
        self.client = client

    def _json(self, response: httpx.Response) -> dict[str, Any]:
        response.raise_for_status()
        body: dict[str, Any] = response.json()
        return body

    def pgc(self, ns: str, name: str) -> dict[str, Any]:
        return self._json(self.client.get(f"{API}/namespaces/{ns}/{v1alpha1.PLURAL}/{name}"))

    def status(self, ns: str, name: str) -> dict[str, Any]:
        return dict(self.pgc(ns, name).get("status") or {})

    def create_pgc(
        self,
        ns: str,
        name: str,
        replicas: int,
        pooler: dict[str, Any] | None = None,
        storage: str = "1Gi",
        extra: dict[str, Any] | None = None,
    ) -> None:
        spec: dict[str, Any] = {
            "version": "15",
            "replicas": replicas,
            "storageSize": storage,
            "deletionPolicy": {"finalBackup": False},
            **(extra or {}),
        }
        if pooler is not None:
            spec["pooler"] = pooler
        body = {
            "apiVersion": v1alpha1.API_VERSION,
            "kind": v1alpha1.KIND,
            "metadata": {"name": name, "namespace": ns},
            "spec": spec,
        }
        self._json(self.client.post(f"{API}/namespaces/{ns}/{v1alpha1.PLURAL}", json=body))

    def annotate(self, ns: str, name: str, key: str, value: str) -> None:
        self._merge(ns, name, {"metadata": {"annotations": {key: value}}})

    def patch_spec(self, ns: str, name: str, spec: dict[str, Any]) -> None:
        self._merge(ns, name, {"spec": spec})

    def _merge(self, ns: str, name: str, patch: dict[str, Any]) -> None:
        self._json(
            self.client.patch(
                f"{API}/namespaces/{ns}/{v1alpha1.PLURAL}/{name}",
                content=json.dumps(patch),
                headers={"Content-Type": "application/merge-patch+json"},
            )
        )

    def service_ip(self, ns: str, name: str) -> str:
        body = self._json(self.client.get(f"/api/v1/namespaces/{ns}/services/{name}"))
        return str(body["spec"]["clusterIP"])

    def pod(self, ns: str, name: str) -> dict[str, Any] | None:
        response = self.client.get(f"/api/v1/namespaces/{ns}/pods/{name}")
        return None if response.status_code == 404 else self._json(response)

    def delete_pod(self, ns: str, name: str) -> None:
        self._json(self.client.delete(f"/api/v1/namespaces/{ns}/pods/{name}"))

    def secret(self, ns: str, name: str, key: str) -> str:
        data = self._json(self.client.get(f"/api/v1/namespaces/{ns}/secrets/{name}"))["data"]
        return base64.b64decode(data[key]).decode()

    def create_namespace(self, ns: str) -> None:
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
        self._json(self.client.post("/api/v1/namespaces", json=body))

    def delete_namespace(self, ns: str, timeout: float) -> float | None:
        """Delete ``ns`` and wait until it is gone: the seconds it took, None on timeout."""
        began = time.monotonic()
        self._json(self.client.delete(f"/api/v1/namespaces/{ns}"))
        deadline = began + timeout
        while time.monotonic() < deadline:
            if self.client.get(f"/api/v1/namespaces/{ns}").status_code == 404:
                return round(time.monotonic() - began, 1)
            time.sleep(1)
        return None


def pod_ready(pod: dict[str, Any] | None) -> bool:
    return pod is not None and any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def instance_names(name: str, replicas: int) -> list[str]:
    return [f"{name}-{index}" for index in range(replicas)]


# --- the writer -----------------------------------------------------------------------------


def psql(dsn: str, password: str, statement: str, timeout: float = 30) -> str | None:
    """One statement through the host's psql; its output, or None if it failed."""
    try:
        result = subprocess.run(
            ["psql", dsn, "-X", "-v", "ON_ERROR_STOP=1", "-tAc", statement],
            env={**os.environ, "PGPASSWORD": password},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def dsn(hosts: Iterable[str], *, read_write: bool = True) -> str:
    # The application's role and database: the superuser may not log in over the network.
    text = f"host={','.join(hosts)} port=5432 dbname=app user=app sslmode=require connect_timeout=2"
    return text + (" target_session_attrs=read-write" if read_write else "")


class Writer:
    """Inserts numbered rows, one psql each, through whichever instance accepts writes, and
    notes which inserts were acknowledged and when (monotonic)."""

    def __init__(
        self, hosts: list[str], password: str, table: str, connection: str | None = None
    ) -> None:
        self.dsn = connection or dsn(hosts)
        self.password = password
        self.table = table
        self.acknowledged: list[tuple[int, float]] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        for n in itertools.count(1):
            if self._stop.is_set():
                return
            statement = f"insert into {self.table} values ({n:d})"  # noqa: S608 - our own
            if psql(self.dsn, self.password, statement) == "INSERT 0 1":
                self.acknowledged.append((n, time.monotonic()))
            else:
                self.failures += 1

    def stamps(self) -> list[float]:
        return [t for _, t in self.acknowledged]

    def wait_acks_after(self, since: float, count: int, timeout: float = 120) -> None:
        wait_until(
            lambda: sum(1 for t in self.stamps() if t > since) >= count,
            what=f"{count} acknowledged inserts",
            timeout=timeout,
        )

    def __enter__(self) -> Writer:
        create = f"create table if not exists {self.table} (n int primary key)"
        if psql(self.dsn, self.password, create) is None:
            raise RuntimeError(f"could not create the table {self.table} through {self.dsn}")
        self._thread.start()
        self.wait_acks_after(0.0, 10, timeout=60)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def writer_for(kube: Kube, ns: str, name: str, table: str) -> Writer:
    pods = [kube.pod(ns, pod) for pod in instance_names(name, NODES)]
    hosts = [ip for p in pods if p and (ip := (p.get("status") or {}).get("podIP"))]
    return Writer(hosts, kube.secret(ns, f"{name}-app", "password"), table)


def pooler_writer_for(kube: Kube, ns: str, name: str, table: str) -> Writer:
    """The same application through the pooler's Service (its address: the host has no
    cluster DNS), TLS required as PgBouncer requires it."""
    address = kube.service_ip(ns, f"{name}-pooler")
    connection = f"host={address} port=5432 dbname=app user=app sslmode=require connect_timeout=2"
    return Writer([], kube.secret(ns, f"{name}-app", "password"), table, connection)


def rows_on(kube: Kube, ns: str, pod: str, password: str, table: str) -> set[int]:
    """The row numbers in ``table`` on ``pod`` itself (by its IP, whatever its role)."""
    ip = ((kube.pod(ns, pod) or {}).get("status") or {}).get("podIP")
    query = f"select coalesce(string_agg(n::text, ','), '') from {table}"  # noqa: S608
    output = psql(dsn([ip], read_write=False), password, query) if ip else None
    if output is None:
        raise RuntimeError(f"could not read {table} on {pod} ({ip})")
    return parse_rows(output)


def outcome(writer: Writer, start: float, end: float, present: set[int]) -> dict[str, Any]:
    """What the writer saw around [start, end]: the downtime and the rows lost."""
    stamps = writer.stamps()
    steady = [b - a for a, b in itertools.pairwise(stamps) if b < start]
    lost = lost_rows((n for n, _ in writer.acknowledged), present)
    return {
        "downtime_s": round(longest_gap(stamps, start, end), 3),
        "acknowledged": len(writer.acknowledged),
        "lost": len(lost),
        "lost_sample": lost[:20],
        "failed_attempts": writer.failures,
        "insert_gap_before_s": round(statistics.median(steady), 3) if steady else None,
    }


# --- measurements ---------------------------------------------------------------------------


def measure_ready(
    kube: Kube,
    ns: str,
    name: str,
    replicas: int,
    timeout: float,
    pooler: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Seconds from the create call until status.phase is Ready, and until each instance
    pod was first seen Ready (the same 0.2 s polls)."""
    began = time.monotonic()
    kube.create_pgc(ns, name, replicas, pooler, extra=extra)
    pods_ready: dict[str, float] = {}

    def ready() -> bool:
        now = round(time.monotonic() - began, 2)
        for pod in instance_names(name, replicas):
            if pod not in pods_ready and pod_ready(kube.pod(ns, pod)):
                pods_ready[pod] = now
        return kube.status(ns, name).get("phase") == "Ready"

    wait_until(ready, what=f"{ns}/{name} Ready", timeout=timeout)
    took = round(time.monotonic() - began, 2)
    return {"ready_s": took, "pods_ready_s": dict(sorted(pods_ready.items()))}


def ready_runs(kube: Kube, replicas: int, runs: int, timeout: float) -> dict[str, Any]:
    entries: list[dict[str, Any]] = []
    for run in range(1, runs + 1):
        ns = f"bench-ready{replicas}-{run}"
        kube.create_namespace(ns)
        entry = measure_ready(kube, ns, "pg", replicas, timeout)
        say(
            f"    {replicas} instance(s), run {run}: Ready after {entry['ready_s']:.1f}s;"
            f" pods Ready at {entry['pods_ready_s']}"
        )
        entry["namespace_deleted_s"] = kube.delete_namespace(ns, timeout=240)
        entries.append(entry)
    return {
        "runs_s": [e["ready_s"] for e in entries],
        "first_pod_s": [min(e["pods_ready_s"].values(), default=math.nan) for e in entries],
        "last_pod_s": [max(e["pods_ready_s"].values(), default=math.nan) for e in entries],
        "runs": entries,
    }


def settled(kube: Kube, ns: str, name: str, replicas: int) -> dict[str, Any] | None:
    """The status when the cluster is Ready with every instance and has a synchronous
    standby (what a switchover to ``any`` needs); else None."""
    status = kube.status(ns, name)
    roles = sorted(i.get("role", "") for i in status.get("instances") or [])
    if (
        status.get("phase") == "Ready"
        and status.get("readyReplicas") == replicas
        and "sync_standby" in roles
        and roles.count("primary") == 1
        and all(pod_ready(kube.pod(ns, p)) for p in instance_names(name, replicas))
    ):
        return status
    return None


def wait_switchover(kube: Kube, ns: str, name: str, after: str) -> dict[str, Any]:
    def finished() -> dict[str, Any] | None:
        obj = kube.pgc(ns, name)
        record = dict((obj.get("status") or {}).get("switchover") or {})
        annotations = obj["metadata"].get("annotations") or {}
        done = record.get("phase") in ("Succeeded", "Failed")
        fresh = record.get("startedAt", "") >= after
        return (
            record if done and fresh and v1alpha1.SWITCHOVER_ANNOTATION not in annotations else None
        )

    return wait_until(finished, what=f"{ns}/{name}'s switchover to finish", timeout=180)


def switchover_once(kube: Kube, ns: str, name: str, run: int) -> dict[str, Any]:
    status = wait_until(
        lambda: settled(kube, ns, name, NODES), what="a settled cluster", timeout=240
    )
    old = status["primaryPod"]
    with (
        writer_for(kube, ns, name, f"switchover_{run}") as writer,
        pooler_writer_for(kube, ns, name, f"switchover_pooled_{run}") as pooled,
    ):
        after = stamp()
        requested = time.monotonic()
        kube.annotate(ns, name, v1alpha1.SWITCHOVER_ANNOTATION, "any")
        record = wait_switchover(kube, ns, name, after)
        done = time.monotonic()
        if record.get("phase") != "Succeeded":
            raise RuntimeError(f"switchover {run} failed: {record}")
        writer.wait_acks_after(done, 20)
        pooled.wait_acks_after(done, 20)
    new = kube.status(ns, name)["primaryPod"]
    present = rows_on(kube, ns, new, writer.password, writer.table)
    result = outcome(writer, requested, done, present)
    pooled_rows = rows_on(kube, ns, new, pooled.password, pooled.table)
    result["pooler"] = outcome(pooled, requested, done, pooled_rows)
    result |= {"from": old, "to": new, "took_s": round(done - requested, 2), "record": record}
    return result


def failover_once(kube: Kube, ns: str, name: str, run: int, timeout: float) -> dict[str, Any]:
    status = wait_until(
        lambda: settled(kube, ns, name, NODES), what="a settled cluster", timeout=240
    )
    old = status["primaryPod"]
    old_uid = (kube.pod(ns, old) or {})["metadata"]["uid"]
    with (
        writer_for(kube, ns, name, f"failover_{run}") as writer,
        pooler_writer_for(kube, ns, name, f"failover_pooled_{run}") as pooled,
    ):
        deleted = time.monotonic()
        kube.delete_pod(ns, old)
        new = wait_until(
            lambda: (p := kube.status(ns, name).get("primaryPod")) != old and p,
            what=f"status.primaryPod to leave {old}",
            timeout=180,
        )
        moved = time.monotonic()
        writer.wait_acks_after(moved, 20)
        pooled.wait_acks_after(moved, 20)
    present = rows_on(kube, ns, new, writer.password, writer.table)
    result = outcome(writer, deleted, moved, present)
    pooled_rows = rows_on(kube, ns, new, pooled.password, pooled.table)
    result["pooler"] = outcome(pooled, deleted, moved, pooled_rows)

    pod_back: list[float] = []

    def back() -> bool:
        pod = kube.pod(ns, old)
        if not pod_back and pod and pod["metadata"]["uid"] != old_uid and pod_ready(pod):
            pod_back.append(time.monotonic())
        return bool(pod_back) and settled(kube, ns, name, NODES) is not None

    wait_until(back, what=f"{old} back and the cluster Ready", timeout=timeout, interval=0.5)
    result |= {
        "from": old,
        "to": new,
        "primary_moved_s": round(moved - deleted, 2),
        "pod_back_s": round(pod_back[0] - deleted, 2),
        "ready_again_s": round(time.monotonic() - deleted, 2),
    }
    return result


# --- memory ---------------------------------------------------------------------------------


def pod_cgroup(cluster: LocalCluster, node_name: str, uid: str) -> Path:
    """The pod's directory in the memory hierarchy under its node's ``kubepods``."""
    root = memory_path(cluster.node(node_name)) / "kubepods"
    for pattern in (f"pod{uid}", f"pod{uid.replace('-', '_')}", f"*pod{uid.replace('-', '_')}*"):
        found = sorted(root.rglob(pattern))
        if found:
            return found[0]
    raise RuntimeError(f"no memory cgroup for pod {uid} under {root}")


def cgroup_sample(path: Path) -> dict[str, float]:
    stat = memory_stat((path / "memory.stat").read_text())
    usage_file = path / "memory.usage_in_bytes"
    if not usage_file.exists():
        usage_file = path / "memory.current"
    usage = int(usage_file.read_text()) / 2**20
    pss = sum(pss_kib(pid) or 0 for pid in host.cgroup_pids(path)) / 1024
    return {
        "anon_mib": stat["anon"],
        "shmem_mib": stat["shmem"],
        "working_set_mib": usage - stat["inactive_file"],
        "pss_mib": pss,
        "usage_mib": usage,
    }


def mean_samples(sample: Callable[[], dict[str, float]], count: int = 5) -> dict[str, float]:
    taken = []
    for index in range(count):
        taken.append(sample())
        if index + 1 < count:
            time.sleep(1)
    return {key: round(statistics.fmean(s[key] for s in taken), 1) for key in taken[0]}


def measure_memory(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, ns: str, name: str
) -> dict[str, Any]:
    status = kube.status(ns, name)
    roles = {i["name"]: i.get("role", "") for i in status.get("instances") or []}
    instances = []
    for pod_name in instance_names(name, NODES):
        pod = kube.pod(ns, pod_name) or {}
        node = pod["spec"]["nodeName"]
        path = pod_cgroup(cluster, node, pod["metadata"]["uid"])
        memory = mean_samples(functools.partial(cgroup_sample, path))
        instances.append({"pod": pod_name, "node": node, "role": roles.get(pod_name), **memory})
    pid = operator.process.pid
    return {
        "instances": instances,
        "image": (kube.pod(ns, instance_names(name, 1)[0]) or {})["spec"]["containers"][0]["image"],
        "operator_rss_mib": round((status_kib(pid, "VmRSS") or 0) / 1024, 1),
        "operator_hwm_mib": round((status_kib(pid, "VmHWM") or 0) / 1024, 1),
    }


# --- one session ----------------------------------------------------------------------------


def wait_operator(handle: OperatorProcess, timeout: float = 90) -> None:
    def leading() -> bool:
        if handle.process.poll() is not None:
            raise RuntimeError(f"the operator exited; see {handle.log}")
        with contextlib.suppress(httpx.HTTPError):
            base = f"http://127.0.0.1:{handle.probe_port}"
            if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                text = httpx.get(f"{base}/metrics", timeout=2).text
                return any(line.startswith("stateward_leader 1") for line in text.splitlines())
        return False

    wait_until(leading, what="the operator to lead and be ready", timeout=timeout)


def warm_caches() -> dict[str, Any]:
    """Build whatever is missing now, outside every clock; the versions in use."""
    paths = binaries.ensure(progress=lambda m: say(f"    {m}"))
    cache.ensure(progress=lambda m: say(f"    {m}"))
    if host.link_exists(layout.Slot().bridge):
        raise RuntimeError(
            f"the bridge {layout.Slot().bridge} exists: another cluster with real nodes is up"
            " in slot 0 on this host; wait for it to stop (run this under flock"
            " /tmp/stateward-real-nodes.lock)"
        )
    return {
        "kubernetes": paths.kubelet.parent.name.removeprefix("kubernetes-"),
        "containerd": paths.containerd.parent.name.removeprefix("containerd-"),
    }


def bring_up(failures: list[str], attempts: int = 2) -> tuple[LocalCluster, Path]:
    """A fresh cluster with real nodes in a temporary directory. A failed ``up()`` (which
    stops what it started and keeps its logs) is tried once more, and noted in ``failures``:
    the nodes' containerds can race for the host's NRI socket (/run/nri/nri.sock)."""
    for attempt in range(1, attempts + 1):
        state = Path(tempfile.mkdtemp(prefix="stateward-bench-dataplane-"))
        config = Config(
            state_dir=state / "local",
            ports=Ports.from_base(free_port_base()),
            kwok_nodes=0,
            real_nodes=NODES,
        )
        cluster = LocalCluster(config)
        say(f"==> up: {NODES} real nodes, 0 kwok nodes, state {state}")
        try:
            cluster.up(progress=lambda m: say(f"    {m}"))
        except LocalClusterError as error:
            failures.append(f"{error} (logs kept in {state})")
            say(f"    up() failed: {error}")
            if attempt == attempts:
                raise
            continue
        return cluster, state
    raise AssertionError("unreachable")


@contextlib.contextmanager
def local_cluster(keep: bool, failures: list[str]) -> Iterator[LocalCluster]:
    """The cluster of :func:`bring_up`, stopped afterwards; its state is kept (with the
    logs) when asked to, or when something failed."""
    cluster, state = bring_up(failures)
    try:
        yield cluster
    except BaseException:
        keep = True
        raise
    finally:
        say("==> down")
        cluster.down(keep=keep)
        if keep:
            say(f"    state and logs kept in {state}")
        else:
            shutil.rmtree(state, ignore_errors=True)


@contextlib.contextmanager
def operator_for(cluster: LocalCluster) -> Iterator[OperatorProcess]:
    client = Client(KubeConfig.from_file(cluster.kubeconfig), field_manager="stateward-bench")
    install_crds(client)
    ensure_namespace(client, OPERATOR_NAMESPACE)
    handle = start_operator(cluster, name="bench-operator")
    say(f"==> operator pid {handle.process.pid}, log {handle.log}")
    try:
        wait_operator(handle)
        yield handle
    finally:
        handle.stop()


def measure(
    cluster: LocalCluster, kube: Kube, operator: OperatorProcess, args: argparse.Namespace
) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for replicas in (1, 3):
        say(f"==> apply → Ready, {replicas} instance(s), {args.runs} runs")
        result[f"ready_{replicas}"] = ready_runs(kube, replicas, args.runs, args.ready_timeout)
    ns, name = "bench-dataplane", "dp"
    kube.create_namespace(ns)
    result["dp_ready_s"] = measure_ready(
        kube, ns, name, NODES, args.ready_timeout, pooler={"instances": POOLERS}
    )
    wait_until(lambda: settled(kube, ns, name, NODES), what="a settled cluster", timeout=240)
    wait_until(
        lambda: (kube.status(ns, name).get("pooler") or {}).get("readyInstances") == POOLERS,
        what="the pooler's pods ready",
        timeout=240,
    )
    say(f"==> idle memory after a {args.settle:.0f}s settle")
    time.sleep(args.settle)
    result["memory"] = measure_memory(cluster, kube, operator, ns, name)
    for kind in ("switchover", "failover"):
        result[kind] = []
        for run in range(1, args.runs + 1):
            if kind == "switchover":
                entry = switchover_once(kube, ns, name, run)
            else:
                entry = failover_once(kube, ns, name, run, args.ready_timeout)
            pooled = entry["pooler"]
            say(
                f"    {kind} {run}: {entry['from']} → {entry['to']}, downtime"
                f" {entry['downtime_s']:.2f}s, lost {entry['lost']} of {entry['acknowledged']};"
                f" through the pooler {pooled['downtime_s']:.2f}s, lost {pooled['lost']},"
                f" {pooled['failed_attempts']} failed"
            )
            result[kind].append(entry)
    say(f"==> pgbench through the pooler across {pgbench.SWITCHOVERS} switchovers")
    result["pgbench"] = pgbench_across_switchovers(kube, ns, name)
    p = result["pgbench"]
    say(
        f"    {p['processed']} transactions, {p['failed']} failed, aborted clients"
        f" {p['aborted_clients'] or 'none'}; p99 {p['steady_p99_ms']:.1f} ms steady,"
        f" worst in a switchover {max(w['max_ms'] for w in p['windows'] or [{'max_ms': 0}]):.0f} ms"
    )
    return result


def pgbench_across_switchovers(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    """:func:`bench.pgbench.across_switchovers` on the measured cluster's pooler."""
    status = wait_until(
        lambda: settled(kube, ns, name, NODES), what="a settled cluster", timeout=240
    )
    password = kube.secret(ns, f"{name}-app", "password")
    primary_ip = (kube.pod(ns, status["primaryPod"]) or {}).get("status", {}).get("podIP")
    pgbench.initialize(dsn([primary_ip]), password)
    address = kube.service_ip(ns, f"{name}-pooler")
    pooled = f"host={address} port=5432 dbname=app user=app sslmode=require connect_timeout=5"

    def switch(n: int) -> tuple[float, float]:
        wait_until(lambda: settled(kube, ns, name, NODES), what="a settled cluster", timeout=240)
        after = stamp()
        requested = time.time()
        kube.annotate(ns, name, v1alpha1.SWITCHOVER_ANNOTATION, "any")
        record = wait_switchover(kube, ns, name, after)
        if record.get("phase") != "Succeeded":
            raise RuntimeError(f"pgbench switchover {n} failed: {record}")
        return requested, time.time()

    return pgbench.across_switchovers(pooled, password, switch)


def execute(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"runs": args.runs, "settle_s": args.settle}
    result["versions"] = warm_caches()
    result["up_failures"] = []
    with (
        local_cluster(args.keep, result["up_failures"]) as cluster,
        operator_for(cluster) as operator,
    ):
        with cluster.http_client() as client:
            client.timeout = httpx.Timeout(30)
            result |= measure(cluster, Kube(client), operator, args)
        result["operator_log"] = str(operator.log)
        if operator.process.poll() is not None:
            raise RuntimeError(f"the operator exited during the run; see {operator.log}")
    return result


# --- report ---------------------------------------------------------------------------------


def _s(value: float | None, digits: int = 1, unit: str = " s") -> str:
    return "—" if value is None or math.isnan(value) else f"{value:.{digits}f}{unit}"


def _row(
    label: str,
    found: Sequence[float | None],
    target: str = "",
    digits: int = 1,
    unit: str = " s",
) -> str:
    values = [v for v in found if v is not None]
    middle, top = median_max(values)
    runs = ", ".join(f"{v:.{digits}f}" for v in values)
    return f"| {label} | {_s(middle, digits, unit)} | {_s(top, digits, unit)} | {runs} | {target} |"


def timing_rows(r: dict[str, Any]) -> list[str]:
    sw, fo = r["switchover"], r["failover"]

    def lost(kind: str, entries: list[dict[str, Any]]) -> str:
        total = sum(e["lost"] for e in entries)
        acked = sum(e["acknowledged"] for e in entries)
        return f"| {kind}: acknowledged rows lost, all runs | **{total}** of {acked} | | | 0 |"

    gaps = [e["insert_gap_before_s"] for e in sw + fo if e["insert_gap_before_s"] is not None]
    return [
        "| | median | max | runs | target |",
        "|---|---|---|---|---|",
        _row("**apply → Ready, 1 instance**", r["ready_1"]["runs_s"]),
        _row("**apply → Ready, 3 instances**", r["ready_3"]["runs_s"], "≤ 20 s"),
        _row("3 instances: apply → first instance pod Ready", r["ready_3"]["first_pod_s"]),
        _row("3 instances: apply → every instance pod Ready", r["ready_3"]["last_pod_s"]),
        _row("**switchover: write downtime**", [e["downtime_s"] for e in sw], "≤ 2 s", 2),
        _row("switchover: request → `Succeeded`, annotation gone", [e["took_s"] for e in sw]),
        lost("switchover", sw),
        _row("**primary pod deleted: write downtime**", [e["downtime_s"] for e in fo], "", 2),
        _row("pod delete → `status.primaryPod` moved", [e["primary_moved_s"] for e in fo]),
        _row("pod delete → the deleted pod recreated and Ready", [e.get("pod_back_s") for e in fo]),
        _row(
            "pod delete → Ready again with every instance and a sync standby",
            [e["ready_again_s"] for e in fo],
        ),
        lost("failover", fo),
        _row("writer: gap between inserts, normally (median)", gaps, "", 3),
        *pooler_rows(sw, fo),
    ]


def pooler_rows(sw: list[dict[str, Any]], fo: list[dict[str, Any]]) -> list[str]:
    """The same events as seen by a second writer through the pooler, at the same time."""
    rows = []
    for kind, entries in (("switchover", sw), ("primary pod deleted", fo)):
        pooled = [e["pooler"] for e in entries if "pooler" in e]
        if not pooled:
            continue
        rows += [
            _row(
                f"**{kind}, through the pooler: write downtime**",
                [p["downtime_s"] for p in pooled],
                "",
                2,
            ),
            _row(
                f"{kind}, through the pooler: inserts that failed",
                [float(p["failed_attempts"]) for p in pooled],
                "0",
                0,
                unit="",
            ),
            f"| {kind}, through the pooler: acknowledged rows lost, all runs |"
            f" **{sum(p['lost'] for p in pooled)}** of {sum(p['acknowledged'] for p in pooled)}"
            " | | | 0 |",
        ]
    return rows


def pgbench_rows(p: dict[str, Any]) -> list[str]:
    """pgbench's view of the switchovers through the pooler: failures, latency, stalls."""
    windows = p["windows"]

    def one(label: str, value: str, target: str = "") -> str:
        return f"| {label} | {value} | | | {target} |"

    return [
        f"**pgbench through the pooler across {p['switchovers']} switchovers** ({p['clients']}"
        f" clients on persistent connections, transaction pooling, {p['seconds']} s,"
        f" {p['tps']:.0f} tps)",
        "",
        "| | median | max | runs | target |",
        "|---|---|---|---|---|",
        one("transactions", str(p["processed"])),
        one("**failed transactions**", f"**{max(p['failed'], p['logged_failed'])}**", "0"),
        one("**clients aborted by an error**", f"**{len(p['aborted_clients'])}**", "0"),
        one(
            "latency p50 / p99 away from the switchovers",
            f"{_s(p['steady_p50_ms'], 1, ' ms')} / {_s(p['steady_p99_ms'], 1, ' ms')}",
        ),
        one("latency p99 over the whole run", _s(p["overall_p99_ms"], 1, " ms")),
        _row(
            "worst latency in a switchover's window", [w["max_ms"] / 1000 for w in windows], "", 2
        ),
        _row("longest stall in a switchover's window", [w["stall_s"] for w in windows], "", 2),
    ]


def memory_rows(m: dict[str, Any]) -> list[str]:
    lines = [
        "| instance | role | node | anon (RSS) | shmem | working set | PSS of its processes |",
        "|---|---|---|---|---|---|---|",
    ]
    keys = ("anon_mib", "shmem_mib", "working_set_mib", "pss_mib")
    for i in m["instances"]:
        cells = " | ".join(f"{i[k]:.1f} MiB" for k in keys)
        lines.append(f"| {i['pod']} | {i['role']} | {i['node']} | {cells} |")
    totals = " | ".join(f"**{sum(i[k] for i in m['instances']):.1f} MiB**" for k in keys)
    lines.append(f"| **3 instances** | | | {totals} |")
    lines.append(
        f"| operator (VmRSS, peak VmHWM) | | | {m['operator_rss_mib']:.1f} MiB"
        f" (peak {m['operator_hwm_mib']:.1f}) | | | |"
    )
    return lines


def markdown(r: dict[str, Any], env: dict[str, str]) -> str:
    switches = ", ".join(f"{e['from']} → {e['to']}" for e in r["switchover"])
    failovers = ", ".join(f"{e['from']} → {e['to']}" for e in r["failover"])
    lines = [
        f"Run {env['date']} on {env['machine']}; Kubernetes {r['versions']['kubernetes']},"
        f" containerd {r['versions']['containerd']}; {NODES} real nodes, 0 kwok nodes;"
        f" `{r['memory']['image']}`; runs: {r['runs']} of each.",
        "",
        *timing_rows(r),
        "",
        f"Switchovers {switches}; failovers {failovers}.",
        "",
        f"**Idle 3-instance cluster** (after Ready and a {r['settle_s']:.0f} s settle; mean of"
        " 5 samples; each instance pod's memory cgroup)",
        "",
        *memory_rows(r["memory"]),
    ]
    if r.get("pgbench"):
        lines += ["", *pgbench_rows(r["pgbench"])]
    for failure in r.get("up_failures") or []:
        lines += ["", f"A first `up()` failed and was retried: {failure.split(' (logs')[0]}"]
    return "\n".join(lines) + "\n"


def write_doc(text: str) -> None:
    write_block(DOC, text, METHOD, begin=BEGIN, end=END)


def write_after_dataplane(begin: str, end: str, heading: str, text: str) -> None:
    """``text`` between ``begin`` and ``end`` in docs/benchmarks.md: where it was, or the
    first time as a new ``heading`` section after the data-plane table."""
    current = DOC.read_text()
    if begin in current and end in current:
        DOC.write_text(replace_block(current, text, "", begin=begin, end=end))
    else:
        marker = END + "\n"
        head, _, tail = current.partition(marker)
        block = f"{begin}\n{text}{end}\n"
        DOC.write_text(head + marker + f"\n### {heading}\n\n" + block + tail)


# --- entry point ----------------------------------------------------------------------------


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.dataplane", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--runs", type=int, default=3, help="repetitions of each measure (3)")
    parser.add_argument(
        "--settle", type=float, default=30, help="idle seconds before the memory samples (30)"
    )
    parser.add_argument(
        "--ready-timeout", type=float, default=300, help="give up on Ready after (300) s"
    )
    output_flags(parser)
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if not ready_for_real_nodes():
        return 2
    env = environment()
    say(f"==> Stateward data-plane benchmark: {env['machine']}")
    try:
        result = execute(args)
    except (KeyboardInterrupt, Interrupted):
        say("\n==> interrupted; everything started was stopped")
        return 130
    result["environment"] = env
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    text = markdown(result, env)
    say("")
    say(text)
    if not args.no_doc:
        write_doc(text)
        say(f"==> results written to {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
