"""The cost and speed of real nodes: bring-up, idle CPU and memory, per-pod overhead, teardown.

Starts a fresh local cluster with N real nodes (kubelet, containerd and kube-proxy per node,
each node in its own namespaces and cgroup subtree ``/stateward/NODE``) and no kwok nodes,
in a temporary state directory on free ports, with the binaries and images already cached
(they are built first, untimed, if they are not), and measures:

1. **bring-up**: the wall time of ``LocalCluster.up()``, when every real node was registered
   and Ready, and how long importing the images into each node's containerd took;
2. **idle cost**: after a settle period, CPU time (utime + stime, /proc/PID/stat) and RSS
   (VmRSS) / PSS (smaps_rollup) of each node's containerd, kubelet and kube-proxy, sampled
   over a window; plus the CPU of each node's whole cgroup subtree (children included);
3. **per-pod overhead**: P pause pods spread over the nodes, create → Ready per pod, and the
   memory added to the nodes' cgroup subtrees (sum over their processes) per pod, with the
   containerd shim's share;
4. **teardown**: the wall time of ``down()`` (pods still running).

Prints a table and writes it into docs/benchmarks.md between ``<!-- nodes:begin -->`` and
``<!-- nodes:end -->``; the rest of that file is left alone. Needs root, and no other cluster
with real nodes on this host (they share the bridge ``stw0``).

    .venv/bin/python -m bench.nodes [--nodes 3] [--pods 10] [--idle 60] [--keep]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx

from bench.common import (
    DOC,
    ROOT,
    Interrupted,
    children,
    cpu_seconds,
    environment,
    output_flags,
    pss_kib,
    ready_for_real_nodes,
    replace_block,
    say,
    status_kib,
)
from stateward_local import binaries
from stateward_local.cluster import NODE_COMPONENTS, Config, LocalCluster, Progress
from stateward_local.controlplane.components import Ports
from stateward_local.controlplane.processes import free_port_base
from stateward_local.images import cache, catalog, nodestore
from stateward_local.nodes import host, layout

BEGIN = "<!-- nodes:begin -->"
END = "<!-- nodes:end -->"
SECTION = "## Real nodes"
METHOD = f"""\
{SECTION}

What a real node costs and how fast it is: `.venv/bin/python -m bench.nodes` (`--nodes 3
--pods 10 --idle 60` by default; `--help` for the rest) rewrites the part between the
markers below; the rest of this section is written by hand.

**Method.** A fresh local cluster with N real nodes and no kwok nodes, in a temporary
state directory on free ports, with binaries and images already in the cache (built first,
untimed, if missing). *Bring-up* is the wall time of `LocalCluster.up()`; node registration
and Ready are when `up()`'s own checks first passed (polled every 0.2 s; a node is Ready when
its condition is True and it has no taint left, i.e. the controller-manager has removed
`node.kubernetes.io/not-ready`), and the image import per node is timed around each `ctr
images import` (one thread per node, while the control plane starts; `up()` returns only
when they are done). *Idle cost*: after a settle period with nothing scheduled
on the nodes, CPU time (`utime + stime` of `/proc/PID/stat`, the process alone) and RSS
(`VmRSS`) and PSS (`smaps_rollup`) of each node's containerd, kubelet and kube-proxy are
sampled every 2 s over the window; CPU is in % of one core over the window, memory the mean
of the samples. The cgroup figure is the CPU of the node's whole cgroup subtree
(`cpuacct.usage`), which also counts short-lived children such as kube-proxy's `nft`.
*Per pod*: P pods of the locally built pause image (`imagePullPolicy: Never`), spread over
the nodes by a topology spread constraint, are created at once; a pod's latency runs from
its create request to the first LIST (every 0.2 s) that shows it Ready. Memory is the sum of
RSS (and of PSS) over every process in the nodes' cgroup subtrees (the memory hierarchy),
averaged over 5 samples, before the pods and 10 s after the last is Ready; the difference
per pod includes what containerd and the kubelet grew by. *Teardown* is `down()` with the
pods still running. The machine is shared with other work; figures are of a small
development machine.
"""

NAMESPACE = "default"
POD_LABEL = {"app": "stateward-bench-nodes"}
SAMPLE_EVERY = 2.0
FAILED_REASONS = frozenset(
    {
        "ErrImageNeverPull",
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CreateContainerError",
        "CreateContainerConfigError",
        "RunContainerError",
        "CrashLoopBackOff",
    }
)


# --- /proc and cgroups ----------------------------------------------------------------------


def executable(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(os.readlink(f"/proc/{pid}/exe")).name
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/comm").read_text().strip()
    return "?"


def resolve(pid: int, name: str) -> int:
    """The process running binary ``name``: ``pid`` itself, or a descendant of it (node
    processes start as ``sh -c ... exec nsenter ... exec BINARY``)."""
    queue = [pid]
    while queue:
        current = queue.pop(0)
        if executable(current) == name:
            return current
        queue.extend(children(current))
    return pid


def memory_path(node: layout.Node) -> Path:
    """The node's cgroup in the memory hierarchy (v1 ``memory``, or the v2 unified tree)."""
    paths = host.cgroup_paths(node)
    for path in paths:
        if (path / "memory.usage_in_bytes").exists() or (path / "memory.current").exists():
            return path
    raise RuntimeError(f"no memory cgroup for {node.name} among {[str(p) for p in paths]}")


def cgroup_cpu_seconds(node: layout.Node) -> float | None:
    """CPU time of everything that ran in the node's cgroup subtree (cpuacct / cpu.stat)."""
    paths = host.cgroup_paths(node)
    for path in paths:
        with contextlib.suppress(OSError, ValueError):
            return int((path / "cpuacct.usage").read_text()) / 1e9
    for path in paths:
        with contextlib.suppress(OSError, ValueError):
            for line in (path / "cpu.stat").read_text().splitlines():
                if line.startswith("usage_usec "):
                    return int(line.split()[1]) / 1e6
    return None


def cgroup_anon_mib(node: layout.Node) -> float | None:
    """Anonymous memory charged to the node's memory cgroup, descendants included."""
    path = memory_path(node)
    with contextlib.suppress(OSError):
        stat = dict(line.split() for line in (path / "memory.stat").read_text().splitlines())
        value = stat.get("total_rss", stat.get("anon"))
        if value is not None:
            return int(value) / 2**20
    return None


@dataclasses.dataclass(frozen=True)
class Component:
    node: str
    name: str  # containerd, kubelet, kube-proxy
    pid: int


def components(cluster: LocalCluster) -> list[Component]:
    found: list[Component] = []
    running = {s.name: s for s in cluster.status() if s.running}
    binary = {"containerd": "containerd", "kubelet": "kubelet", "kube-proxy": "kube-proxy"}
    for node in cluster.real_nodes():
        for name in NODE_COMPONENTS:
            record = running.get(f"{node.name}.{name}")
            if record is None:
                raise RuntimeError(f"{node.name}.{name} is not running")
            found.append(Component(node.name, name, resolve(record.pid, binary[name])))
    return found


def subtree_memory(cluster: LocalCluster, daemons: set[int]) -> dict[str, float]:
    """RSS and PSS (MiB) summed over every process in the real nodes' memory cgroups,
    split into the node daemons, containerd shims and everything else (the pods)."""
    totals = dict.fromkeys(
        (f"{kind}_{what}" for kind in ("all", "daemons", "shims", "pods") for what in "rp"), 0.0
    )
    totals["shim_count"] = totals["pod_processes"] = 0.0
    for node in cluster.real_nodes():
        for pid in host.cgroup_pids(memory_path(node)):
            rss, pss = status_kib(pid, "VmRSS"), pss_kib(pid)
            if rss is None:
                continue  # gone meanwhile
            if pid in daemons:
                kind = "daemons"
            elif executable(pid).startswith("containerd-shim"):
                kind = "shims"
                totals["shim_count"] += 1
            else:
                kind = "pods"
                totals["pod_processes"] += 1
            for group in ("all", kind):
                totals[f"{group}_r"] += rss / 1024
                totals[f"{group}_p"] += (pss if pss is not None else rss) / 1024
    totals["cgroup_anon"] = sum(cgroup_anon_mib(n) or 0.0 for n in cluster.real_nodes())
    return totals


def mean_memory(
    cluster: LocalCluster, daemons: set[int], samples: int = 5, every: float = 1.0
) -> dict[str, float]:
    taken = []
    for index in range(samples):
        taken.append(subtree_memory(cluster, daemons))
        if index + 1 < samples:
            time.sleep(every)
    return {key: statistics.fmean(s[key] for s in taken) for key in taken[0]}


# --- the cluster under test --------------------------------------------------------------------


class TimedCluster(LocalCluster):
    """The local cluster, noting when its bring-up checks first pass and how long each
    node's containerd root takes to copy from the node image store."""

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.t0 = time.monotonic()
        self.registered_at: float | None = None
        self.ready_at: float | None = None
        self.node_ready_at: dict[str, float] = {}
        self.node_first_ready_at: dict[str, float] = {}
        self.node_ready_since: dict[str, float] = {}
        self.node_history: dict[str, list[tuple[float, str]]] = {}
        self.store: dict[str, Any] = {}
        self.seeds: dict[str, float] = {}

    def elapsed(self) -> float:
        return round(time.monotonic() - self.t0, 2)

    def _network_nodes(self) -> bool:
        done = super()._network_nodes()
        if done and self.registered_at is None:
            self.registered_at = self.elapsed()
        return done

    def _nodes_ready(self) -> bool:
        with self.http_client() as client:
            items = client.get("/api/v1/nodes").json().get("items", [])
        now = self.elapsed()
        for item in items:
            name = item["metadata"]["name"]
            ready = any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in item.get("status", {}).get("conditions", [])
            )
            taints = sorted(t["key"] for t in item.get("spec", {}).get("taints") or [])
            state = f"Ready={ready} taints={','.join(taints) or 'none'}"
            if self.node_history.get(name, [(0.0, "")])[-1][1] != state:
                self.node_history.setdefault(name, []).append((now, state))
            if ready and not taints:
                self.node_first_ready_at.setdefault(name, now)
                self.node_ready_since.setdefault(name, now)
            else:
                self.node_ready_since.pop(name, None)
        done = super()._nodes_ready()
        if done and self.ready_at is None:
            self.ready_at = self.elapsed()
            self.node_ready_at = dict(self.node_ready_since)
        return done

    def _node_store(
        self, archives: list[catalog.Archive], paths: binaries.Binaries, progress: Progress
    ) -> Path:
        began = time.monotonic()
        cached = nodestore.store_root(archives).is_dir()
        root = super()._node_store(archives, paths, progress)
        self.store = {"took": round(time.monotonic() - began, 2), "cached": cached}
        return root

    def _seed_node(self, node: layout.Node, store: Path) -> None:
        began = time.monotonic()
        super()._seed_node(node, store)
        self.seeds[node.name] = round(time.monotonic() - began, 2)


# --- pods ------------------------------------------------------------------------------------


def pod_body(name: str, image: str, command: list[str] | None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": image, "imagePullPolicy": "Never"}
    if command:
        container["command"] = command
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": dict(POD_LABEL)},
        "spec": {
            "nodeSelector": {layout.NODE_TYPE_LABEL: "real"},
            "topologySpreadConstraints": [
                {
                    "maxSkew": 1,
                    "topologyKey": "kubernetes.io/hostname",
                    "whenUnsatisfiable": "DoNotSchedule",
                    "labelSelector": {"matchLabels": dict(POD_LABEL)},
                }
            ],
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 1,
            "containers": [container],
        },
    }


def pod_ready(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def pod_failure(pod: dict[str, Any]) -> str | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        state = status.get("state") or {}
        reason = (state.get("waiting") or {}).get("reason")
        if reason in FAILED_REASONS:
            return f"{pod['metadata']['name']}: {reason}"
        if "terminated" in state or status.get("restartCount"):
            return f"{pod['metadata']['name']}: container exited"
    return None


def list_pods(client: httpx.Client) -> list[dict[str, Any]]:
    selector = ",".join(f"{k}={v}" for k, v in POD_LABEL.items())
    response = client.get(
        f"/api/v1/namespaces/{NAMESPACE}/pods", params={"labelSelector": selector}
    )
    response.raise_for_status()
    items: list[dict[str, Any]] = response.json().get("items") or []
    return items


def run_pods(
    client: httpx.Client, count: int, image: str, command: list[str] | None, timeout: float
) -> dict[str, Any]:
    """Create ``count`` pods at once; wait until all are Ready (or one fails, or time out)."""
    created: dict[str, float] = {}
    first = time.monotonic()
    for index in range(count):
        name = f"overhead-{index:03d}"
        sent = time.monotonic()
        response = client.post(
            f"/api/v1/namespaces/{NAMESPACE}/pods", json=pod_body(name, image, command)
        )
        if response.status_code not in (200, 201):
            raise RuntimeError(f"creating pod {name}: {response.status_code} {response.text}")
        created[name] = sent
    ready_at: dict[str, float] = {}
    placement: dict[str, str] = {}
    failure: str | None = None
    deadline = first + timeout
    while len(ready_at) < count and time.monotonic() < deadline:
        now = time.monotonic()
        for pod in list_pods(client):
            name = pod["metadata"]["name"]
            if (pod.get("spec") or {}).get("nodeName"):
                placement[name] = pod["spec"]["nodeName"]
            if name in created and name not in ready_at and pod_ready(pod):
                ready_at[name] = now
            failure = failure or pod_failure(pod)
        if failure:
            break
        time.sleep(0.2)
    latencies = [ready_at[n] - created[n] for n in ready_at]
    result: dict[str, Any] = {
        "image": image,
        "command": command,
        "ready": len(ready_at),
        "placement": {
            n: sum(1 for v in placement.values() if v == n) for n in set(placement.values())
        },
        "failure": failure,
    }
    if len(ready_at) == count:
        result["all_ready_s"] = round(max(ready_at.values()) - first, 2)
        result["create_calls_s"] = round(max(created.values()) - first, 2)
        result["latency_p50_s"] = round(statistics.median(latencies), 2)
        result["latency_max_s"] = round(max(latencies), 2)
        result["latency_min_s"] = round(min(latencies), 2)
    return result


def delete_pods(client: httpx.Client, timeout: float = 120) -> None:
    selector = ",".join(f"{k}={v}" for k, v in POD_LABEL.items())
    client.request(
        "DELETE",
        f"/api/v1/namespaces/{NAMESPACE}/pods",
        params={"labelSelector": selector, "gracePeriodSeconds": 0},
    )
    deadline = time.monotonic() + timeout
    while list_pods(client) and time.monotonic() < deadline:
        time.sleep(0.5)


# --- one run ------------------------------------------------------------------------------------


def wait_idle(cluster: LocalCluster, settle: float) -> None:
    say(f"==> settling {settle:.0f}s")
    end = time.monotonic() + settle
    while time.monotonic() < end:
        time.sleep(min(5.0, end - time.monotonic()))
        check_alive(cluster)


def check_alive(cluster: LocalCluster) -> None:
    dead = [s.name for s in cluster.status() if not s.running]
    if dead:
        raise RuntimeError(f"cluster processes died: {', '.join(dead)}")


def measure_idle(cluster: LocalCluster, window: float) -> dict[str, Any]:
    found = components(cluster)
    real = cluster.real_nodes()
    say(f"==> idle window {window:.0f}s, sampling every {SAMPLE_EVERY:g}s")
    for c in found:
        say(f"    {c.node}.{c.name}: pid {c.pid} ({executable(c.pid)})")
    rss: dict[Component, list[float]] = {c: [] for c in found}
    pss: dict[Component, list[float]] = {c: [] for c in found}
    cpu_start = {c: cpu_seconds(c.pid) for c in found}
    cgroup_start = {n.name: cgroup_cpu_seconds(n) for n in real}
    started = time.monotonic()
    end = started + window
    while True:
        for c in found:
            value = status_kib(c.pid, "VmRSS")
            if value is None:
                raise RuntimeError(f"{c.node}.{c.name} (pid {c.pid}) exited during the window")
            rss[c].append(value / 1024)
            p = pss_kib(c.pid)
            if p is not None:
                pss[c].append(p / 1024)
        now = time.monotonic()
        if now >= end:
            break
        time.sleep(min(SAMPLE_EVERY, end - now))
    elapsed = time.monotonic() - started
    cpu_end = {c: cpu_seconds(c.pid) for c in found}
    cgroup_end = {n.name: cgroup_cpu_seconds(n) for n in real}
    per: list[dict[str, Any]] = []
    for c in found:
        begin, finish = cpu_start[c], cpu_end[c]
        per.append(
            {
                "node": c.node,
                "component": c.name,
                "pid": c.pid,
                "cpu_s": None if begin is None or finish is None else round(finish - begin, 2),
                "cpu_pct": None
                if begin is None or finish is None
                else round(100 * (finish - begin) / elapsed, 2),
                "rss_mib": round(statistics.fmean(rss[c]), 1),
                "pss_mib": round(statistics.fmean(pss[c]), 1) if pss[c] else None,
            }
        )
    cgroup = {}
    for n in real:
        a, b = cgroup_start[n.name], cgroup_end[n.name]
        cgroup[n.name] = None if a is None or b is None else round(100 * (b - a) / elapsed, 2)
    return {
        "window_s": round(elapsed, 1),
        "samples": len(next(iter(rss.values()))),
        "components": per,
        "cgroup_cpu_pct": cgroup,
    }


def execute(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"nodes": args.nodes, "pods_requested": args.pods}
    # Warm caches: build whatever is missing now, outside the clock.
    began = time.monotonic()
    paths = binaries.ensure(progress=lambda m: say(f"    {m}"))
    archives = cache.ensure(progress=lambda m: say(f"    {m}"))
    result["ensure_s"] = round(time.monotonic() - began, 1)
    result["archives_mib"] = {
        f"{a.spec.name}:{a.spec.tag}": round(a.path.stat().st_size / 2**20, 1)
        for a in archives
        if a.spec.on_nodes
    }
    result["versions"] = {
        "kubernetes": paths.kubelet.parent.name.removeprefix("kubernetes-"),
        "containerd": paths.containerd.parent.name.removeprefix("containerd-"),
    }
    if host.link_exists(layout.Slot().bridge):
        raise RuntimeError(
            f"the bridge {layout.Slot().bridge} exists: another cluster with real nodes is up"
            " on this host; wait for it to stop"
        )

    state = Path(tempfile.mkdtemp(prefix="stateward-bench-nodes-"))
    cluster = TimedCluster(
        Config(
            state_dir=state / "local",
            ports=Ports.from_base(free_port_base()),
            kwok_nodes=0,
            real_nodes=args.nodes,
        )
    )
    log: list[tuple[float, str]] = []

    def progress(message: str) -> None:
        log.append((cluster.elapsed(), message))
        say(f"    [{cluster.elapsed():6.1f}s] {message}")

    keep = args.keep
    went_up = False
    try:
        say(f"==> up: {args.nodes} real nodes, 0 kwok nodes, state {state}")
        cluster.t0 = time.monotonic()
        try:
            cluster.up(progress=progress)
        finally:
            went_up = True  # up() cleans up after itself on failure; down() is harmless
        result["up_s"] = cluster.elapsed()
        result["registered_s"] = cluster.registered_at
        result["nodes_ready_s"] = cluster.ready_at
        result["node_ready_s"] = {
            n.name: cluster.node_ready_at.get(n.name) for n in cluster.real_nodes()
        }
        result["node_first_ready_s"] = {
            n.name: cluster.node_first_ready_at.get(n.name) for n in cluster.real_nodes()
        }
        result["node_history"] = cluster.node_history
        result["store"] = cluster.store
        result["seeds"] = cluster.seeds
        result["progress"] = [f"{t:.1f}s {m}" for t, m in log]
        for t, message in log:
            if message.startswith("Local cluster ready in"):
                result["up_reported_s"] = float(message.split()[-1].rstrip(".s"))
                result["up_reported_at"] = t

        wait_idle(cluster, args.settle)
        result["idle"] = measure_idle(cluster, args.idle)
        check_alive(cluster)

        daemons = {c.pid for c in components(cluster)}
        say("==> memory of the nodes' cgroup subtrees before the pods")
        before = mean_memory(cluster, daemons)
        attempts = [(catalog.PAUSE_REF, None), (catalog.BASE_REF, ["sleep", "infinity"])]
        with cluster.http_client() as client:
            client.timeout = httpx.Timeout(30)
            for image, command in attempts:
                say(
                    f"==> {args.pods} pods of {image}"
                    + (f" ({' '.join(command)})" if command else "")
                )
                pods = run_pods(client, args.pods, image, command, args.pod_timeout)
                if pods.get("all_ready_s") is not None:
                    break
                say(f"    not all Ready ({pods['ready']}/{args.pods}; {pods['failure']})")
                result.setdefault("pod_attempts_failed", []).append(pods)
                delete_pods(client)
                wait_idle(cluster, 10)
                before = mean_memory(cluster, daemons)
            else:
                raise RuntimeError("no pod image became Ready; see the kubelet logs")
        say(
            f"    all Ready {pods['all_ready_s']}s after the first create; per pod p50"
            f" {pods['latency_p50_s']}s, max {pods['latency_max_s']}s; spread {pods['placement']}"
        )
        time.sleep(10)
        check_alive(cluster)
        say("==> memory of the nodes' cgroup subtrees with the pods")
        after = mean_memory(cluster, daemons)
        result["pods"] = pods
        result["memory_before"] = {k: round(v, 2) for k, v in before.items()}
        result["memory_after"] = {k: round(v, 2) for k, v in after.items()}
        count = args.pods
        result["per_pod"] = {
            "rss_mib": round((after["all_r"] - before["all_r"]) / count, 2),
            "pss_mib": round((after["all_p"] - before["all_p"]) / count, 2),
            "shim_rss_mib": round((after["shims_r"] - before["shims_r"]) / count, 2),
            "shim_pss_mib": round((after["shims_p"] - before["shims_p"]) / count, 2),
            "pod_processes_rss_mib": round((after["pods_r"] - before["pods_r"]) / count, 2),
            "pod_processes_pss_mib": round((after["pods_p"] - before["pods_p"]) / count, 2),
            "daemons_rss_mib": round((after["daemons_r"] - before["daemons_r"]) / count, 2),
            "daemons_pss_mib": round((after["daemons_p"] - before["daemons_p"]) / count, 2),
            "cgroup_anon_mib": round((after["cgroup_anon"] - before["cgroup_anon"]) / count, 2),
            "shims": int(after["shim_count"]),
            "pod_processes": int(after["pod_processes"]),
        }
    except BaseException:
        keep = True
        raise
    finally:
        if went_up:
            say("==> down")
            began = time.monotonic()
            try:
                cluster.down(keep=keep)
            finally:
                result["down_s"] = round(time.monotonic() - began, 2)
                say(f"    down took {result['down_s']}s")
        if keep:
            say(f"    state and logs kept in {state}")
        else:
            shutil.rmtree(state, ignore_errors=True)
    return result


# --- report ---------------------------------------------------------------------------------


def _n(value: Any, unit: str = "", digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:.{digits}f}{unit}"


def _mean(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def _sum(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def markdown(r: dict[str, Any], env: dict[str, str]) -> str:
    node_names = list(r["node_ready_s"])
    lines = [
        f"Run {env['date']} on {env['machine']}; Kubernetes {r['versions']['kubernetes']},"
        f" containerd {r['versions']['containerd']}; {r['nodes']} real nodes, 0 kwok nodes.",
        "",
        "**Bring-up and teardown** (seconds from the `up()` call; binaries and images cached)",
        "",
        "| | |",
        "|---|---|",
        f"| **`up()` wall time (warm)** | **{_n(r['up_s'])} s** |",
        f"| `up()`'s own figure (after the cache checks) | {_n(r.get('up_reported_s'))} s |",
        f"| real nodes registered, CNI configured | {_n(r['registered_s'])} s |",
        f"| **every real node Ready** | **{_n(r['nodes_ready_s'])} s** |",
        "| each node Ready and untainted: first seen / for good | "
        + ", ".join(
            f"{n} {_n(r['node_first_ready_s'].get(n))} / {_n(t)} s"
            for n, t in r["node_ready_s"].items()
        )
        + " |",
    ]
    store = r.get("store", {})
    lines.append(
        f"| node image store (every image imported once per image set) | {_n(store.get('took'))} s"
        + (" (a cache hit)" if store.get("cached") else " (imported now)")
        + " |"
    )
    for name, took in r.get("seeds", {}).items():
        lines.append(f"| {name}'s containerd root, hard-linked from the store | {_n(took)} s |")
    sizes = ", ".join(f"{k} {_n(v)} MiB" for k, v in r["archives_mib"].items())
    lines += [
        f"| image archives in the store | {sizes} |",
        f"| **`down()` wall time ({r['pods']['ready']} pods running)** | **{_n(r['down_s'])} s** |",
        "",
    ]
    idle = r["idle"]
    lines += [
        f"**Idle cost per node** (nothing scheduled; {_n(idle['window_s'], digits=0)} s window,"
        f" {idle['samples']} samples, after a {_n(r['settle_s'], digits=0)} s settle): CPU in %"
        " of one core / RSS MiB / PSS MiB",
        "",
        "| component | " + " | ".join(node_names) + " | mean per node |",
        "|---|" + "---|" * (len(node_names) + 1),
    ]

    def cell(entries: list[dict[str, Any]]) -> str:
        cpu = _sum(e["cpu_pct"] for e in entries)
        rss = _sum(e["rss_mib"] for e in entries)
        pss = _sum(e["pss_mib"] for e in entries)
        return f"{_n(cpu, ' %', 2)} / {_n(rss)} / {_n(pss)}"

    comps = idle["components"]
    for component in NODE_COMPONENTS:
        row = [
            [e for e in comps if e["node"] == n and e["component"] == component] for n in node_names
        ]
        mean_cpu = _mean(e["cpu_pct"] for e in comps if e["component"] == component)
        mean_rss = _mean(e["rss_mib"] for e in comps if e["component"] == component)
        mean_pss = _mean(e["pss_mib"] for e in comps if e["component"] == component)
        lines.append(
            f"| {component} | "
            + " | ".join(cell(entries) for entries in row)
            + f" | {_n(mean_cpu, ' %', 2)} / {_n(mean_rss)} / {_n(mean_pss)} |"
        )
    totals = [[e for e in comps if e["node"] == n] for n in node_names]
    per_node = [
        (
            _sum(e["cpu_pct"] for e in t),
            _sum(e["rss_mib"] for e in t),
            _sum(e["pss_mib"] for e in t),
        )
        for t in totals
    ]
    lines.append(
        "| **node total** | "
        + " | ".join(f"**{cell(t)}**" for t in totals)
        + f" | **{_n(_mean(p[0] for p in per_node), ' %', 2)} / {_n(_mean(p[1] for p in per_node))}"
        f" / {_n(_mean(p[2] for p in per_node))}** |"
    )
    cg = idle["cgroup_cpu_pct"]
    lines.append(
        "| node cgroup subtree CPU (children included) | "
        + " | ".join(_n(cg.get(n), " %", 2) for n in node_names)
        + f" | {_n(_mean(cg.values()), ' %', 2)} |"
    )
    pods, pp, b, a = r["pods"], r["per_pod"], r["memory_before"], r["memory_after"]
    image = pods["image"] + (f" (`{' '.join(pods['command'])}`)" if pods["command"] else "")
    spread = ", ".join(f"{n} {c}" for n, c in sorted(pods["placement"].items()))
    lines += [
        "",
        f"**Per pod** ({r['pods']['ready']} pods of `{image}`, `imagePullPolicy: Never`,"
        f" spread {spread})",
        "",
        "| | |",
        "|---|---|",
        f"| **create → every pod Ready** | **{_n(pods['all_ready_s'])} s** (create calls"
        f" {_n(pods['create_calls_s'], digits=2)} s) |",
        f"| **per pod, create → Ready: p50 / max** | **{_n(pods['latency_p50_s'])} /"
        f" {_n(pods['latency_max_s'])} s** (min {_n(pods['latency_min_s'])} s) |",
        f"| nodes' cgroup subtrees, RSS sum: before → with pods | {_n(b['all_r'])} →"
        f" {_n(a['all_r'])} MiB |",
        f"| nodes' cgroup subtrees, PSS sum: before → with pods | {_n(b['all_p'])} →"
        f" {_n(a['all_p'])} MiB |",
        f"| **added per pod: RSS / PSS** | **{_n(pp['rss_mib'], digits=2)} /"
        f" {_n(pp['pss_mib'], digits=2)} MiB** |",
        f"| of which the pod's containerd shim: RSS / PSS | {_n(pp['shim_rss_mib'], digits=2)} /"
        f" {_n(pp['shim_pss_mib'], digits=2)} MiB ({pp['shims']} shims) |",
        "| of which the pod's own processes: RSS / PSS |"
        f" {_n(pp['pod_processes_rss_mib'], digits=2)} /"
        f" {_n(pp['pod_processes_pss_mib'], digits=2)} MiB ({pp['pod_processes']} processes) |",
        f"| of which containerd + kubelet + kube-proxy grew: RSS / PSS |"
        f" {_n(pp['daemons_rss_mib'], digits=2)} / {_n(pp['daemons_pss_mib'], digits=2)} MiB |",
        f"| memory cgroups' anonymous memory added per pod (`total_rss` / `anon`) |"
        f" {_n(pp['cgroup_anon_mib'], digits=2)} MiB |",
    ]
    for failed in r.get("pod_attempts_failed", []):
        lines.append(
            f"| (first try with `{failed['image']}` failed) | {failed['ready']} Ready;"
            f" {failed['failure'] or 'timed out'} |"
        )
    return "\n".join(lines) + "\n"


def write_doc(text: str) -> None:
    current = DOC.read_text() if DOC.exists() else "# Benchmarks\n"
    if not (BEGIN in current and END in current) and SECTION in current.splitlines():
        # The hand-written section exists without markers: put them at its end.
        block = f"{BEGIN}\n{text}{END}\n"
        head, _, rest = current.partition(f"\n{SECTION}\n")
        body, marker, tail = rest.partition("\n## ")
        DOC.write_text(
            f"{head}\n{SECTION}\n{body.rstrip()}\n\n{block}" + (f"\n## {tail}" if marker else "")
        )
        return
    DOC.write_text(replace_block(current, text, METHOD, begin=BEGIN, end=END))


# --- entry point --------------------------------------------------------------------------------


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.nodes", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--nodes", type=int, default=3, help="real nodes (3)")
    parser.add_argument("--pods", type=int, default=10, help="pods for the per-pod overhead (10)")
    parser.add_argument("--idle", type=float, default=60, help="idle window, seconds (60)")
    parser.add_argument("--settle", type=float, default=30, help="pause before it, seconds (30)")
    parser.add_argument(
        "--pod-timeout", type=float, default=180, help="give up on the pods after (180) s"
    )
    output_flags(parser)
    args = parser.parse_args(argv)
    if args.nodes < 1 or args.pods < 1:
        parser.error("--nodes and --pods must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if not ready_for_real_nodes():
        return 2
    env = environment()
    say(f"==> Stateward real-node benchmark: {env['machine']}")
    try:
        result = execute(args)
    except (KeyboardInterrupt, Interrupted):
        say("\n==> interrupted; everything started was stopped")
        return 130
    result["settle_s"] = args.settle
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
