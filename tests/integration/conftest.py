"""The operator, as a real process, against the session's real control plane."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from lab.operator import RESYNC_SECONDS, get_pgc, metric, wait_leading
from lab.waiting import wait_for
from lightkube import ApiError, Client, codecs
from lightkube.resources.admissionregistration_v1 import ValidatingWebhookConfiguration
from lightkube.resources.core_v1 import Secret

from stateward.runtime import webhook
from stateward_local.cluster import LocalCluster
from stateward_local.controlplane.components import OPERATOR_USER
from stateward_local.run import (
    OPERATOR_NAMESPACE,
    OperatorProcess,
    ensure_namespace,
    install_crds,
    start_operator,
)
from tests.support import clusters


@pytest.fixture(scope="session")
def crds(control_plane: LocalCluster, kube: Client) -> None:
    install_crds(kube)
    ensure_namespace(kube, OPERATOR_NAMESPACE)


def wait_webhook_registered(kube: Client, handle: OperatorProcess, timeout: float = 60) -> None:
    """The API server sends this operator the reviews: its webhook configuration points at
    this operator's port (the leader writes it shortly after it starts leading)."""
    port = handle.webhook_port

    def registered() -> bool:
        found = kube.get(ValidatingWebhookConfiguration, webhook.CONFIGURATION_NAME)
        return any(f":{port}/" in str(hook.clientConfig.url or "") for hook in found.webhooks or [])

    wait_for(registered, what="the operator's webhook to be registered", timeout=timeout)


@pytest.fixture(scope="session")
def operator(control_plane: LocalCluster, crds: None, kube: Client) -> Iterator[OperatorProcess]:
    handle = start_operator(control_plane, extra=[f"--resync-interval={RESYNC_SECONDS}"])
    try:
        wait_leading(handle)
        wait_webhook_registered(kube, handle)
        yield handle
    finally:
        handle.stop()


class AuditLog:
    """Write requests the API server recorded, read from its audit log."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def writes(
        self, *, user: str = OPERATOR_USER, namespace: str | None = None
    ) -> list[dict[str, Any]]:
        entries = []
        for line in self.path.read_text().splitlines():
            entry = json.loads(line)
            if entry.get("user", {}).get("username") != user:
                continue
            if entry.get("verb") not in ("create", "update", "patch", "delete", "deletecollection"):
                continue
            ref = entry.get("objectRef", {})
            if namespace is not None and ref.get("namespace") != namespace:
                continue
            entries.append(entry)
        return entries


@pytest.fixture(scope="session")
def audit(control_plane: LocalCluster) -> AuditLog:
    return AuditLog(control_plane.audit_log)


def pgc_body(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "stateward.io/v1alpha1",
        "kind": "PostgresCluster",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"version": "16", "replicas": 3, "storageSize": "1Gi", **spec},
    }


@pytest.fixture
def make_cluster(kube: Client, namespace: str, operator: OperatorProcess) -> Callable[..., str]:
    def make(name: str | None = None, **spec: Any) -> str:
        """Create a PostgresCluster; with ``spec.backup`` naming the test repository's
        credentials Secret (``clusters.BACKUP``), that Secret too, holding dummy keys."""
        name = name or f"pg-{uuid.uuid4().hex[:6]}"
        secret = ((spec.get("backup") or {}).get("repository") or {}).get("s3", {})
        if secret.get("credentialsSecret") == clusters.REPOSITORY["s3"]["credentialsSecret"]:
            with contextlib.suppress(ApiError):
                kube.create(
                    Secret.from_dict(
                        {
                            "metadata": {"name": secret["credentialsSecret"]},
                            "stringData": {"accessKeyId": "AK", "secretAccessKey": "SK"},
                        }
                    ),
                    namespace=namespace,
                )
        kube.create(codecs.from_dict(pgc_body(name, namespace, **spec)))
        return name

    return make


def condition(obj: dict[str, Any], type: str) -> dict[str, Any]:
    for entry in (obj.get("status") or {}).get("conditions") or []:
        if entry["type"] == type:
            return dict(entry)
    return {}


def wait_phase(
    kube: Client, name: str, namespace: str, phase: str, timeout: float = 60
) -> dict[str, Any]:
    return wait_for(
        lambda: (
            (obj := get_pgc(kube, name, namespace)).get("status", {}).get("phase") == phase and obj
        ),
        what=f"{name} to reach phase {phase}",
        timeout=timeout,
    )


def wait_condition(
    kube: Client,
    name: str,
    namespace: str,
    type: str,
    reason: str | None = None,
    status: str | None = None,
    timeout: float = 60,
) -> dict[str, Any]:
    """Wait until the cluster has condition ``type`` (with ``reason`` and ``status`` when
    given); the cluster as it was then."""

    def matches() -> dict[str, Any] | None:
        obj = get_pgc(kube, name, namespace)
        found = condition(obj, type)
        wanted = {"reason": reason, "status": status}
        if found and all(v is None or found.get(k) == v for k, v in wanted.items()):
            return obj
        return None

    wanted = "/".join(part for part in (type, status, reason) if part is not None)
    return wait_for(matches, what=f"{name} to have condition {wanted}", timeout=timeout)


def wait_resyncs(operator: OperatorProcess, count: int = 1) -> None:
    """Wait until ``count`` resync periods have passed and been worked off: every cluster was
    enqueued again since, the counter moved and the queue is empty."""
    start = time.monotonic()
    reconciles = metric(operator.probe_port, "stateward_reconcile_total")

    def passed() -> bool:
        return (
            time.monotonic() - start >= count * RESYNC_SECONDS
            and metric(operator.probe_port, "stateward_reconcile_total") >= reconciles + count
            and metric(operator.probe_port, "stateward_workqueue_depth") == 0
        )

    wait_for(passed, what=f"{count} resyncs", timeout=30 + 3 * count * RESYNC_SECONDS)


def _described(entries: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [
        (e["verb"], e["objectRef"].get("resource"), e["objectRef"].get("name")) for e in entries
    ]


def assert_no_writes_at_rest(
    audit: AuditLog, operator: OperatorProcess, namespace: str, *, settle: float = 90
) -> None:
    """Once the operator's writes in ``namespace`` have stopped (two resyncs without one,
    within ``settle`` seconds), three more resyncs must not write anything there."""
    deadline = time.monotonic() + settle
    baseline = len(audit.writes(namespace=namespace))
    while True:
        wait_resyncs(operator, 2)
        now = audit.writes(namespace=namespace)
        if len(now) == baseline:
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"still writing after {settle:.0f}s: {_described(now[baseline:])}")
        baseline = len(now)
    wait_resyncs(operator, 3)
    extra = audit.writes(namespace=namespace)[baseline:]
    assert extra == [], _described(extra)


def gone(kube: Client, resource: Any, name: str, namespace: str) -> bool:
    try:
        kube.get(resource, name, namespace=namespace)
    except ApiError as error:
        return error.status.code == 404
    return False
