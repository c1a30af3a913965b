"""The data plane on real nodes: Patroni-managed PostgreSQL 15 in the instance pods.

The operator runs as a process against the session's cluster with real nodes; each test
makes its own PostgresCluster in its own namespace. Clusters here opt out of the final
backup (`stateward-instance backup` is not written yet), so their namespaces can go.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import ApiError, Client, codecs
from lightkube.config.kubeconfig import KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Pod
from lightkube.types import PatchType

from stateward.cli.run import (
    OPERATOR_NAMESPACE,
    OperatorProcess,
    PostgresClusterResource,
    ensure_namespace,
    install_crds,
    start_operator,
)
from stateward.local import binaries
from stateward.local.cluster import LocalCluster
from tests.integration.conftest import RESYNC_SECONDS, get_pgc, wait_leading
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def client(real_cluster: LocalCluster) -> Client:
    return Client(KubeConfig.from_file(real_cluster.kubeconfig), field_manager="stateward-tests")


@pytest.fixture(scope="module")
def real_operator(real_cluster: LocalCluster, client: Client) -> Iterator[OperatorProcess]:
    install_crds(client)
    ensure_namespace(client, OPERATOR_NAMESPACE)
    handle = start_operator(
        real_cluster, extra=[f"--resync-interval={RESYNC_SECONDS}"], name="data-plane-operator"
    )
    try:
        wait_leading(handle)
        yield handle
    finally:
        handle.stop()


@pytest.fixture
def ns(client: Client, real_operator: OperatorProcess) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    client.create(Namespace(metadata=ObjectMeta(name=name)))
    yield name
    client.delete(Namespace, name)


def create_cluster(client: Client, ns: str, name: str, replicas: int, **spec: Any) -> None:
    body: dict[str, Any] = {
        "apiVersion": "stateward.io/v1alpha1",
        "kind": "PostgresCluster",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "version": "15",
            "replicas": replicas,
            "storageSize": "1Gi",
            "deletionPolicy": {"finalBackup": False},
            **spec,
        },
    }
    client.create(codecs.from_dict(body))


def ready(client: Client, ns: str, name: str, timeout: float = 240) -> dict[str, Any]:
    return wait_for(
        lambda: (
            (obj := get_pgc(client, name, ns)).get("status", {}).get("phase") == "Ready" and obj
        ),
        what=f"{ns}/{name} Ready",
        timeout=timeout,
        interval=1,
    )


def sql(real: LocalCluster, ns: str, pod: str, statement: str) -> str:
    """Run SQL as the superuser over the pod's own socket; '' if the pod cannot answer."""
    result = subprocess.run(
        [
            str(binaries.locate().kubectl), "exec", "-n", ns, pod, "--",
            "psql", "-h", "/var/run/postgresql", "-U", "postgres", "-v", "ON_ERROR_STOP=1",
            "-tAc", statement,
        ],
        env={**os.environ, "KUBECONFIG": str(real.kubeconfig)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )  # fmt: skip
    return result.stdout.strip() if result.returncode == 0 else ""


def test_a_single_instance_bootstraps_to_a_writable_primary(
    real_cluster: LocalCluster, client: Client, ns: str
) -> None:
    create_cluster(client, ns, "solo", replicas=1)
    status = ready(client, ns, "solo")["status"]
    assert status["primaryPod"] == "solo-0"
    assert status.get("replicaPods", []) == []
    assert sql(real_cluster, ns, "solo-0", "select pg_is_in_recovery()") == "f"
    assert sql(real_cluster, ns, "solo-0", "select version()").startswith("PostgreSQL 15")


def test_parameters_are_applied_through_patroni_without_restarting_pods(
    real_cluster: LocalCluster, client: Client, ns: str
) -> None:
    create_cluster(client, ns, "tuned", replicas=1)
    ready(client, ns, "tuned")
    before = client.get(Pod, "tuned-0", namespace=ns)
    assert sql(real_cluster, ns, "tuned-0", "show max_connections") == "100"

    client.patch(
        PostgresClusterResource,
        "tuned",
        {"spec": {"postgresql": {"parameters": {"work_mem": "12MB", "max_connections": "120"}}}},
        namespace=ns,
        patch_type=PatchType.MERGE,
    )
    # work_mem takes effect on reload: Patroni applies it within a loop or two.
    wait_for(
        lambda: sql(real_cluster, ns, "tuned-0", "show work_mem") == "12MB",
        what="work_mem to be applied on the running instance",
        timeout=90,
        interval=1,
    )
    # max_connections needs a restart: reported, not silently half-applied.
    wait_for(
        lambda: get_pgc(client, "tuned", ns).get("status", {}).get("pendingRestart") == ["tuned-0"],
        what="status.pendingRestart to list the instance",
        timeout=90,
    )
    assert sql(real_cluster, ns, "tuned-0", "show max_connections") == "100"
    # Neither change restarted the pod.
    after = client.get(Pod, "tuned-0", namespace=ns)
    assert after.metadata.uid == before.metadata.uid  # type: ignore[union-attr]
    statuses = after.status.containerStatuses or []  # type: ignore[union-attr]
    assert statuses and all(c.restartCount == 0 for c in statuses)


def test_three_instances_replicate_and_a_replica_takes_over_when_the_primary_pod_goes(
    real_cluster: LocalCluster, client: Client, ns: str
) -> None:
    create_cluster(client, ns, "trio", replicas=3)
    status = ready(client, ns, "trio")["status"]
    primary, replicas = status["primaryPod"], status["replicaPods"]
    assert sorted([primary, *replicas]) == ["trio-0", "trio-1", "trio-2"]
    assert sql(real_cluster, ns, primary, "select pg_is_in_recovery()") == "f"

    # Data written on the primary reaches every replica.
    assert sql(real_cluster, ns, primary, "create table t (n int)") == "CREATE TABLE"
    assert (
        sql(real_cluster, ns, primary, "insert into t select generate_series(1, 100)")
        == "INSERT 0 100"
    )
    for replica in replicas:
        assert sql(real_cluster, ns, replica, "select pg_is_in_recovery()") == "t"
        wait_for(
            lambda replica=replica: (
                sql(real_cluster, ns, replica, "select count(*) from t") == "100"
            ),
            what=f"the rows on replica {replica}",
        )

    # The primary pod goes: a replica is promoted and the status follows it.
    client.delete(Pod, primary, namespace=ns)
    promoted = wait_for(
        lambda: next(
            (
                candidate
                for candidate in replicas
                if sql(real_cluster, ns, candidate, "select pg_is_in_recovery()") == "f"
            ),
            None,
        ),
        what="a replica to be promoted after the primary pod was deleted",
        timeout=120,
        interval=1,
    )
    wait_for(
        lambda: get_pgc(client, "trio", ns).get("status", {}).get("primaryPod") == promoted,
        what=f"status.primaryPod to follow the promotion to {promoted}",
        timeout=60,
    )
    # psql prints every statement's result, so write and count in separate calls.
    assert sql(real_cluster, ns, promoted, "insert into t values (101)") == "INSERT 0 1"
    assert sql(real_cluster, ns, promoted, "select count(*) from t") == "101"

    # The old primary's pod comes back as a replica of the new primary, with every row.
    wait_for(
        lambda: sql(real_cluster, ns, primary, "select pg_is_in_recovery()") == "t",
        what=f"{primary} to rejoin as a replica",
        timeout=180,
        interval=1,
    )
    wait_for(
        lambda: sql(real_cluster, ns, primary, "select count(*) from t") == "101",
        what=f"{primary} to replay the row written after the failover",
    )
    ready(client, ns, "trio", timeout=120)


def test_a_final_backup_that_cannot_start_says_why_and_can_be_skipped(
    real_cluster: LocalCluster, client: Client, ns: str
) -> None:
    # An image no node has and no registry serves: every pod of this cluster, the final
    # backup's included, stays in ErrImagePull/ImagePullBackOff.
    create_cluster(
        client,
        ns,
        "stuck",
        replicas=1,
        image="localhost/stateward/not-built:1",
        deletionPolicy={"finalBackup": True},
    )
    wait_for(
        lambda: (
            "stateward.io/finalizer"
            in (get_pgc(client, "stuck", ns)["metadata"].get("finalizers") or [])
        ),
        what="the finalizer",
    )
    client.delete(PostgresClusterResource, "stuck", namespace=ns)
    stuck = wait_for(
        lambda: next(
            (
                c
                for c in get_pgc(client, "stuck", ns).get("status", {}).get("conditions", [])
                if c["type"] == "FinalBackup" and c["reason"] == "PodNotRunning"
            ),
            None,
        ),
        what="the FinalBackup condition to say why the backup pod does not run",
        timeout=120,
    )
    assert "ErrImagePull" in stuck["message"] or "ImagePullBackOff" in stuck["message"]
    assert "spec.deletionPolicy.finalBackup=false" in stuck["message"]
    # The documented way out, applied while Terminating, is honoured.
    client.patch(
        PostgresClusterResource,
        "stuck",
        {"spec": {"deletionPolicy": {"finalBackup": False}}},
        namespace=ns,
        patch_type=PatchType.MERGE,
    )

    def gone() -> bool:
        try:
            get_pgc(client, "stuck", ns)
        except ApiError as error:
            return error.status.code == 404
        return False

    wait_for(gone, what="the cluster to be deleted without a final backup", timeout=90)
