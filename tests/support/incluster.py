"""The operator running in the cluster (``make deploy``, the Helm chart): its pods on the real
nodes, which of them leads, admission through the webhook Service, and a PostgresCluster
brought to Ready by it alone — no operator process on the host."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import httpx
from lab.dataplane import create_cluster, fresh_namespace, ready
from lab.waiting import wait_for
from lightkube import ApiError, Client, codecs
from lightkube.generic_resource import create_global_resource
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Pod

from stateward.runtime import webhook
from stateward_local.run import PostgresClusterResource

DEPLOYMENT = "stateward-operator"
LEASE = "stateward-operator-leader"
SELECTOR = {"app.kubernetes.io/name": "stateward", "app.kubernetes.io/component": "operator"}
ValidatingWebhookConfiguration = create_global_resource(
    "admissionregistration.k8s.io", "v1", "ValidatingWebhookConfiguration",
    "validatingwebhookconfigurations",
)  # fmt: skip


def pods(client: Client, namespace: str) -> list[Pod]:
    """The operator's pods, less those terminating (a rollout's old ones)."""
    return [
        pod
        for pod in client.list(Pod, namespace=namespace, labels=SELECTOR)
        if pod.metadata is not None and pod.metadata.deletionTimestamp is None
    ]


def is_leader(pod: Pod) -> bool:
    """The pod's own /metrics says it leads (the host reaches pod IPs)."""
    assert pod.status is not None
    text = httpx.get(f"http://{pod.status.podIP}:8081/metrics", timeout=5).text
    return "\nstateward_leader 1.0" in f"\n{text}"


def wait_running(client: Client, namespace: str, replicas: int, timeout: float = 240) -> Pod:
    """Every replica of the Deployment available on a real node, and exactly one leading;
    returns the leader."""

    def available() -> bool:
        deployment = client.get(Deployment, DEPLOYMENT, namespace=namespace)
        status = deployment.status
        return bool(
            status is not None
            and status.observedGeneration == deployment.metadata.generation  # type: ignore[union-attr]
            and status.updatedReplicas == replicas
            and status.availableReplicas == replicas
            and (status.replicas or 0) == replicas
        )

    wait_for(available, what=f"{replicas} operator replicas available", timeout=timeout, interval=1)

    def one_leader() -> Pod | None:
        running = pods(client, namespace)
        leaders = [p for p in running if is_leader(p)]
        if len(running) != replicas or len(leaders) != 1:
            return None
        lease = client.get(Lease, LEASE, namespace=namespace)
        holder = lease.spec.holderIdentity or ""  # type: ignore[union-attr]
        # The identity is hostname-pid, and a pod's hostname is its name.
        return leaders[0] if holder.startswith(f"{leaders[0].metadata.name}-") else None  # type: ignore[union-attr]

    return wait_for(one_leader, what="exactly one operator replica leading", timeout=90, interval=1)


def webhook_points_at_the_service(client: Client, namespace: str) -> bool:
    configuration = client.get(ValidatingWebhookConfiguration, webhook.CONFIGURATION_NAME)
    (hook,) = configuration["webhooks"]
    service = hook["clientConfig"].get("service") or {}
    return bool(service.get("namespace") == namespace and service.get("name"))


def refused_by_the_webhook(client: Client, ns: str) -> str:
    """A PostgresCluster only the webhook refuses (a schedule CEL cannot judge): the
    message the API server relays from the in-cluster webhook."""
    body: dict[str, Any] = {
        "apiVersion": "stateward.io/v1alpha1",
        "kind": "PostgresCluster",
        "metadata": {"name": "never", "namespace": ns},
        "spec": {"version": "15", "replicas": 1, "storageSize": "1Gi",
                 "backupSchedule": "0 0 30 2 *"},
    }  # fmt: skip
    try:
        client.create(codecs.from_dict(body))
    except ApiError as error:
        return error.status.message or ""
    client.delete(PostgresClusterResource, "never", namespace=ns)
    return ""


@contextlib.contextmanager
def a_ready_cluster(
    client: Client, name: str = "incluster"
) -> Iterator[tuple[str, dict[str, Any]]]:
    """A one-instance PostgresCluster in a fresh namespace, Ready; deleted afterwards while
    the operator still runs (its finalizer needs the operator)."""
    with fresh_namespace(client) as ns:
        create_cluster(client, ns, name, replicas=1)
        try:
            yield ns, ready(client, ns, name)
        finally:
            client.delete(PostgresClusterResource, name, namespace=ns)
            wait_for(
                lambda: not list(client.list(PostgresClusterResource, namespace=ns)),
                what=f"{ns}/{name} deleted by the operator",
                timeout=120,
            )
