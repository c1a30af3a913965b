"""The config/ kustomize tree and the Make verbs that apply it, against real API servers.

The dry run goes to the session's full control plane; everything that really writes goes to
the apiserver-only cluster, so the CRD other tests install there is never touched.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from lab.waiting import wait_for
from lightkube import ApiError, Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import Namespace
from lightkube.resources.rbac_authorization_v1 import ClusterRoleBinding

from stateward.api import v1alpha1
from stateward.api.v1alpha1 import PostgresCluster
from stateward.runtime import rbac
from stateward.specs import postgres as postgres_specs
from stateward.specs.postgres import backup, config, secrets
from stateward_local import binaries
from stateward_local.cluster import LocalCluster
from stateward_local.run import OPERATOR_NAMESPACE, ensure_namespace
from tests.conftest import client_for
from tests.support import clusters, incluster

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CRD_NAME = f"{v1alpha1.PLURAL}.{v1alpha1.GROUP}"
OPERATOR = f"system:serviceaccount:{rbac.NAMESPACE}:{rbac.SERVICE_ACCOUNT}"


def kubectl(
    cluster: LocalCluster, *args: str, stdin: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(binaries.locate().kubectl), f"--kubeconfig={cluster.kubeconfig}", *args],
        cwd=REPO,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check:
        assert result.returncode == 0, f"kubectl {' '.join(args)}:\n{result.stdout}{result.stderr}"
    return result


def make(cluster: LocalCluster, target: str, *, timeout: float = 300) -> str:
    """``make TARGET`` as a user runs it, with KUBECONFIG naming ``cluster``."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    env["KUBECONFIG"] = str(cluster.kubeconfig)
    # The tests already run inside the project's virtualenv: -o keeps make from reinstalling
    # it when its stamp is missing or older than pyproject.toml.
    result = subprocess.run(
        ["make", "--no-print-directory", "-o", ".venv/.installed-stamp", target],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, f"make {target}:\n{result.stdout}{result.stderr}"
    return result.stdout


def undeploy(cluster: LocalCluster) -> None:
    """``make undeploy``; if it does not finish, what it waits for (a CRD cannot go while an
    object of it waits for a finalizer, a namespace while a pod in it terminates)."""
    try:
        make(cluster, "undeploy", timeout=150)
    except (AssertionError, subprocess.TimeoutExpired):
        what = "namespaces,pods,postgresclusters.stateward.io,databases.stateward.io"
        left = kubectl(cluster, "get", what, "-A", "-o", "wide", check=False)
        print(f"make undeploy did not finish; the cluster holds:\n{left.stdout}{left.stderr}")
        raise


def crd_established(kube: Client) -> bool:
    found = kube.get(CustomResourceDefinition, CRD_NAME)
    conditions = (found.status.conditions if found.status else None) or []
    return any(c.type == "Established" and c.status == "True" for c in conditions)


def absent(kube: Client, resource: Any, name: str, namespace: str | None = None) -> bool:
    try:
        kube.get(resource, name, namespace=namespace)
    except ApiError as error:
        return error.status.code == 404
    return False


def test_default_tree_is_valid_to_the_api_server(control_plane: LocalCluster, kube: Client) -> None:
    # A dry run creates no Namespace, so the namespaced objects need it to exist already
    # (it is the operator's namespace, which the other integration tests also use).
    ensure_namespace(kube, OPERATOR_NAMESPACE)

    result = kubectl(control_plane, "apply", "--dry-run=server", "-k", "config/default")

    lines = result.stdout.splitlines()
    for name in (
        f"customresourcedefinition.apiextensions.k8s.io/{CRD_NAME}",
        f"serviceaccount/{rbac.SERVICE_ACCOUNT}",
        f"clusterrole.rbac.authorization.k8s.io/{rbac.CLUSTER_ROLE}",
        f"clusterrolebinding.rbac.authorization.k8s.io/{rbac.CLUSTER_ROLE}",
        f"role.rbac.authorization.k8s.io/{rbac.LEADER_ELECTION_ROLE}",
        f"rolebinding.rbac.authorization.k8s.io/{rbac.LEADER_ELECTION_ROLE}",
        "service/stateward-webhook",
        "service/stateward-metrics",
        "deployment.apps/stateward-operator",
    ):
        assert any(line.startswith(f"{name} ") and "(server dry run)" in line for line in lines), (
            name,
            result.stdout,
        )
    # Only a warning is acceptable: the Namespace was created without kubectl apply.
    assert "error" not in result.stderr.lower(), result.stderr
    # Nothing was written. (The ClusterRole itself may exist: the local operator user is
    # bound to it by its own binding, stateward_local.run.grant_operator.)
    assert absent(kube, Deployment, "stateward-operator", OPERATOR_NAMESPACE)
    assert absent(kube, ClusterRoleBinding, rbac.CLUSTER_ROLE)


def test_make_install_then_uninstall_adds_and_removes_the_crd(apiserver: LocalCluster) -> None:
    kube = client_for(apiserver)

    make(apiserver, "install")
    wait_for(lambda: crd_established(kube), what=f"{CRD_NAME} to be Established", timeout=30)

    make(apiserver, "uninstall")
    wait_for(lambda: absent(kube, CustomResourceDefinition, CRD_NAME), what=f"{CRD_NAME} gone")
    # A second uninstall finds nothing to delete and still succeeds.
    make(apiserver, "uninstall")


def test_make_deploy_gives_the_operator_every_right_it_uses(apiserver: LocalCluster) -> None:
    kube = client_for(apiserver)
    make(apiserver, "deploy")
    make(apiserver, "deploy")  # server-side apply again: no conflict, nothing to change

    wait_for(lambda: crd_established(kube), what=f"{CRD_NAME} to be Established", timeout=30)
    deployment = kube.get(Deployment, "stateward-operator", namespace=rbac.NAMESPACE)
    assert deployment.spec is not None
    assert deployment.spec.replicas == 2

    # As the operator's ServiceAccount, make every child of a cluster the way the reconciler
    # does. The instance Role only passes the API server's escalation check if the operator
    # holds each right it grants; the RoleBinding only if it may bind that Role.
    namespace = f"t-{uuid.uuid4().hex[:10]}"
    kube.create(Namespace(metadata=ObjectMeta(name=namespace)))
    cluster = PostgresCluster.model_validate(
        {
            "metadata": {"name": "demo", "namespace": namespace, "uid": str(uuid.uuid4())},
            "spec": {
                "version": "16",
                "replicas": 3,
                "storageSize": "1Gi",
                "backupSchedule": "0 3 * * *",
                "backup": clusters.BACKUP,
            },
        }
    )
    children = [
        *postgres_specs.children(cluster, patroni_config=config.patroni_config(cluster)),
        secrets.superuser_secret(cluster, password="not-a-secret-1"),
        secrets.replication_secret(cluster, password="not-a-secret-2"),
        backup.final_backup_job(cluster),
    ]
    created = kubectl(
        apiserver,
        f"--as={OPERATOR}",
        "apply",
        "--server-side",
        "--field-manager=stateward",
        "-f",
        "-",
        stdin=yaml.safe_dump_all(children),
    )
    assert len(created.stdout.splitlines()) == len(children), created.stdout

    def can(verb: str, resource: str, *scope: str) -> bool:
        answer = kubectl(
            apiserver, "auth", "can-i", f"--as={OPERATOR}", verb, resource, *scope, check=False
        )
        return answer.stdout.strip() == "yes"

    assert can("delete", "pods", "-n", namespace)
    assert can("patch", "postgresclusters.stateward.io", "--subresource=status", "-n", namespace)
    assert can("update", "leases.coordination.k8s.io", "-n", rbac.NAMESPACE)
    assert not can("update", "leases.coordination.k8s.io", "-n", "kube-node-lease")
    assert can("patch", f"validatingwebhookconfigurations/{rbac.WEBHOOK_CONFIGURATION}")
    assert not can("patch", "validatingwebhookconfigurations/someone-elses")
    assert not can("create", "pods", "-n", namespace)


def test_make_deploy_runs_the_operator_in_the_cluster_and_undeploy_removes_it(
    real_cluster: LocalCluster,
) -> None:
    """The operator image on the real nodes, with exactly the generated RBAC: two replicas,
    one leading, admission through the webhook Service, and a cluster brought to Ready with
    no operator process on the host."""
    kube = client_for(real_cluster)
    make(real_cluster, "deploy")
    try:
        leader = incluster.wait_running(kube, rbac.NAMESPACE, replicas=2)
        nodes = {p.spec.nodeName for p in incluster.pods(kube, rbac.NAMESPACE)}  # type: ignore[union-attr]
        assert len(nodes) == 2, f"the replicas share a node: {nodes}"
        wait_for(
            lambda: incluster.webhook_points_at_the_service(kube, rbac.NAMESPACE),
            what="the leader to point the webhook configuration at its Service",
        )
        with incluster.a_ready_cluster(kube) as (ns, cluster):
            assert "backupSchedule" in incluster.refused_by_the_webhook(kube, ns)
            assert cluster["status"]["primaryPod"] == "incluster-0"
            conditions = {c["type"]: c["status"] for c in cluster["status"]["conditions"]}
            assert conditions.get("Degraded") != "True", cluster["status"]["conditions"]
        # The operator logs JSON lines at the configured level (INFO: no DEBUG line).
        logs = kubectl(real_cluster, "logs", "-n", rbac.NAMESPACE, leader.metadata.name)  # type: ignore[union-attr]
        records = [json.loads(line) for line in logs.stderr.splitlines() + logs.stdout.splitlines()
                   if line.startswith("{")]  # fmt: skip
        assert records, logs.stdout[-2000:]
        assert {r["level"] for r in records} <= {"INFO", "WARNING", "ERROR"}, records[-5:]
    finally:
        undeploy(real_cluster)
    wait_for(
        lambda: absent(kube, Namespace, rbac.NAMESPACE),
        what=f"namespace {rbac.NAMESPACE} removed by make undeploy",
        timeout=180,
    )
    assert absent(kube, incluster.ValidatingWebhookConfiguration, "stateward.io")
