"""The operator as a process, as the tests and the benchmarks drive it: its resync interval,
its metrics, its leadership, and the PostgresClusters it reconciles."""

from __future__ import annotations

from typing import Any

import httpx
from lightkube import Client

from lab.waiting import wait_for
from stateward_local.run import OperatorProcess, PostgresClusterResource

RESYNC_SECONDS = 3
"""The operator's resync interval under test (``--resync-interval``)."""


def metric(port: int, name: str, labels: str = "") -> float:
    """One sample from the operator's /metrics (0 when absent)."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + ("{" if labels else "")) or line.startswith(name + " "):
            if labels and labels not in line:
                continue
            total += float(line.rsplit(" ", 1)[1])
    return total


def wait_leading(handle: OperatorProcess, timeout: float = 60) -> None:
    def leading() -> bool:
        if handle.process.poll() is not None:
            raise AssertionError(f"operator exited; log:\n{handle.log.read_text()[-3000:]}")
        response = httpx.get(f"http://127.0.0.1:{handle.probe_port}/readyz", timeout=2)
        return response.status_code == 200 and metric(handle.probe_port, "stateward_leader") == 1

    wait_for(leading, what="the operator to lead and be ready", timeout=timeout)


def get_pgc(kube: Client, name: str, namespace: str) -> dict[str, Any]:
    result: dict[str, Any] = kube.get(PostgresClusterResource, name, namespace=namespace).to_dict()
    return result
