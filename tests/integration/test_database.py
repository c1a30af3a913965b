"""The Database resource against a real control plane (kwok nodes: no database runs, so
MySQL and MariaDB servers never answer and stay Pending, which is what must be reported):
admission of every field, children and owner references for each engine, status, zero
writes at rest, a name already taken, and deletion."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from lab.waiting import wait_for
from lightkube import ApiError, Client, codecs
from lightkube.resources.apps_v1 import StatefulSet
from lightkube.resources.core_v1 import ConfigMap, PersistentVolumeClaim, Secret, Service
from lightkube.resources.networking_v1 import NetworkPolicy
from lightkube.resources.policy_v1 import PodDisruptionBudget
from lightkube.types import PatchType

from stateward.controllers.kube import DatabaseResource
from stateward_local.run import OperatorProcess, PostgresClusterResource
from tests.integration.conftest import AuditLog, assert_no_writes_at_rest, gone, pgc_body

pytestmark = pytest.mark.integration

VERSIONS = {"postgres": "16", "mysql": "8.4", "mariadb": "10.11"}


def db_body(name: str, namespace: str, engine: str = "mariadb", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "stateward.io/v1alpha1",
        "kind": "Database",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "engine": engine,
            "version": VERSIONS[engine],
            "replicas": 3,
            "storage": {"size": "1Gi"},
            **spec,
        },
    }


def get_db(kube: Client, name: str, namespace: str) -> dict[str, Any]:
    found: dict[str, Any] = kube.get(DatabaseResource, name, namespace=namespace).to_dict()
    return found


def refused(kube: Client, body: dict[str, Any]) -> str:
    try:
        kube.create(codecs.from_dict(body))
    except ApiError as error:
        return error.status.message or ""
    kube.delete(DatabaseResource, body["metadata"]["name"], namespace=body["metadata"]["namespace"])
    raise AssertionError(f"accepted: {body['spec']}")


def refused_change(kube: Client, name: str, namespace: str, spec: dict[str, Any]) -> str:
    try:
        kube.patch(DatabaseResource, name, {"spec": spec}, namespace=namespace,
                   patch_type=PatchType.MERGE)  # fmt: skip
    except ApiError as error:
        return error.status.message or ""
    raise AssertionError(f"accepted the change {spec}")


def condition(obj: dict[str, Any], type: str) -> dict[str, Any]:
    for entry in (obj.get("status") or {}).get("conditions") or []:
        if entry["type"] == type:
            return dict(entry)
    return {}


def owned_by(obj: Any, database: dict[str, Any]) -> bool:
    return any(
        r.uid == database["metadata"]["uid"] and r.kind == "Database" and r.controller
        for r in obj.metadata.ownerReferences or []
    )


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ({"engine": "oracle"}, "spec.engine"),
        ({"version": "16"}, "spec.version 16 is not a supported mariadb version"),
        ({"engine": "mysql", "version": "10.11"}, "not a supported mysql version"),
        ({"engine": "postgres", "version": "12"}, "not a supported postgres version"),
        ({"replicas": 0}, "spec.replicas"),
        ({"replicas": 11}, "spec.replicas"),
        ({"storage": {"size": "10GB"}}, "spec.storage.size"),
        ({"storage": {"size": "0Gi"}}, "spec.storage.size must be a positive size"),
        ({"storage": {}}, "spec.storage.size"),
        (
            {"engine": "mysql", "version": "8.4", "tls": {"caSecretName": "corp-ca"}},
            "spec.tls.caSecretName: MySQL servers serve no TLS yet",
        ),
        ({"tls": {"caSecretName": "Corp_CA"}}, "spec.tls.caSecretName"),
        (
            {"engine": "mysql", "version": "8.4", "tls": {"serverSecretName": "web"}},
            "spec.tls.serverSecretName: MySQL servers serve no TLS yet",
        ),
        ({"tls": {"serverSecretName": "Web_Cert"}}, "spec.tls.serverSecretName"),
    ],
)
def test_invalid_databases_are_refused_with_the_field_named(
    kube: Client, namespace: str, crds: None, spec: dict[str, Any], named: str
) -> None:
    body = db_body("bad", namespace)
    body["spec"].update(spec)
    assert named in refused(kube, body)


def test_changes_that_would_lose_data_are_refused_and_growth_is_not(
    kube: Client, namespace: str, crds: None
) -> None:
    storage = {"size": "2Gi", "storageClassName": "a"}
    kube.create(codecs.from_dict(db_body("fixed", namespace, storage=storage)))
    engine = {"engine": "mysql", "version": "8.4"}
    assert "spec.engine is immutable" in refused_change(kube, "fixed", namespace, engine)
    assert "cannot change the major version (from 10.11 to 11.4)" in refused_change(
        kube, "fixed", namespace, {"version": "11.4"}
    )
    assert "spec.storage.size may grow but never shrink (from 2Gi to 1Gi)" in refused_change(
        kube, "fixed", namespace, {"storage": {"size": "1Gi"}}
    )
    assert "spec.storage.storageClassName is immutable" in refused_change(
        kube, "fixed", namespace, {"storage": {"storageClassName": "b"}}
    )
    # A patch level and more storage are fine.
    allowed = {"spec": {"version": "10.11.9", "storage": {"size": "3Gi"}}}
    kube.patch(DatabaseResource, "fixed", allowed, namespace=namespace, patch_type=PatchType.MERGE)
    assert get_db(kube, "fixed", namespace)["spec"]["version"] == "10.11.9"


def test_a_postgres_database_owns_a_postgrescluster_and_reports_its_state(
    kube: Client, namespace: str, operator: OperatorProcess, audit: AuditLog
) -> None:
    kube.create(codecs.from_dict(db_body("shop", namespace, "postgres", replicas=2)))
    database = wait_for(
        lambda: (
            (d := get_db(kube, "shop", namespace)).get("status", {}).get("phase") == "Running" and d
        ),
        what="the postgres Database Running (its PostgresCluster Ready on kwok's roles)",
        timeout=90,
    )
    cluster = kube.get(PostgresClusterResource, "shop", namespace=namespace)
    assert owned_by(cluster, database)
    assert cluster["spec"]["replicas"] == 2 and cluster["spec"]["version"] == "16"
    # The PostgresCluster's own defaults fill the rest: synchronous replication, app database.
    assert cluster["spec"]["synchronous"]["mode"] == "Preferred"
    assert kube.get(StatefulSet, "shop", namespace=namespace).spec.replicas == 2  # type: ignore[union-attr]
    status = database["status"]
    assert status["readyReplicas"] == 2 and status["primaryPod"] == "shop-0"
    assert condition(database, "Ready")["status"] == "True"
    assert status["observedGeneration"] == database["metadata"]["generation"]

    # Scaling the Database scales its cluster.
    kube.patch(DatabaseResource, "shop", {"spec": {"replicas": 3}}, namespace=namespace,
               patch_type=PatchType.MERGE)  # fmt: skip
    wait_for(
        lambda: kube.get(StatefulSet, "shop", namespace=namespace).spec.replicas == 3,  # type: ignore[union-attr]
        what="the StatefulSet scaled through the PostgresCluster",
    )
    wait_for(
        lambda: (
            get_db(kube, "shop", namespace)["status"].get("readyReplicas") == 3
            and get_db(kube, "shop", namespace)["status"]["phase"] == "Running"
        ),
        what="three ready servers reported",
        timeout=90,
    )
    assert_no_writes_at_rest(audit, operator, namespace)

    # Deleting the Database deletes its cluster, and only then the Database goes.
    kube.delete(DatabaseResource, "shop", namespace=namespace)
    wait_for(lambda: gone(kube, DatabaseResource, "shop", namespace), what="the Database gone",
             timeout=120)  # fmt: skip
    assert gone(kube, PostgresClusterResource, "shop", namespace)


@pytest.mark.parametrize("engine", ["mariadb", "mysql"])
def test_servers_get_their_children_and_wait_for_a_primary_that_answers(
    kube: Client, namespace: str, operator: OperatorProcess, audit: AuditLog, engine: str
) -> None:
    kube.create(codecs.from_dict(db_body("orders", namespace, engine)))
    database = wait_for(
        lambda: (d := get_db(kube, "orders", namespace)).get("status", {}).get("phase") and d,
        what="a status",
        timeout=60,
    )
    children = [
        (StatefulSet, "orders"), (Service, "orders-primary"), (Service, "orders-replicas"),
        (Service, "orders-headless"), (ConfigMap, "orders-config"),
        (PodDisruptionBudget, "orders"), (NetworkPolicy, "orders"),
        (Secret, "orders-credentials"), (Secret, "orders-app"),
    ]  # fmt: skip
    for resource, name in children:
        found = wait_for(
            lambda r=resource, n=name: kube.get(r, n, namespace=namespace),
            what=f"{resource.__name__} {name}",
        )
        assert owned_by(found, database), (resource.__name__, name)
        assert found.metadata.labels["app.kubernetes.io/name"] == engine
    sts = kube.get(StatefulSet, "orders", namespace=namespace)
    (container,) = sts.spec.template.spec.containers  # type: ignore[union-attr]
    assert container.image == {"mariadb": "ghcr.io/stateward/mariadb-instance:10.11",
                               "mysql": "docker.io/library/mysql:8.4"}[engine]  # fmt: skip
    # kwok's pods run no server: nothing answers over SQL, so no primary is claimed.
    waiting = wait_for(
        lambda: (d := get_db(kube, "orders", namespace))["status"].get("readyReplicas") == 3 and d,
        what="three pods ready (simulated)",
        timeout=60,
    )
    assert waiting["status"]["phase"] == "Pending"
    assert condition(waiting, "Ready")["reason"] == "NoPrimary"
    assert "primaryPod" not in waiting["status"]
    assert_no_writes_at_rest(audit, operator, namespace)

    # Storage grows: the volumes are expanded in place.
    kube.patch(DatabaseResource, "orders", {"spec": {"storage": {"size": "2Gi"}}},
               namespace=namespace, patch_type=PatchType.MERGE)  # fmt: skip
    wait_for(
        lambda: all(
            c.spec.resources.requests["storage"] == "2Gi"  # type: ignore[union-attr, index]
            for c in kube.list(PersistentVolumeClaim, namespace=namespace)
        ),
        what="every data volume asked to grow to 2Gi",
    )
    kube.delete(DatabaseResource, "orders", namespace=namespace)
    wait_for(lambda: gone(kube, DatabaseResource, "orders", namespace), what="the Database gone",
             timeout=120)  # fmt: skip
    assert not list(kube.list(PersistentVolumeClaim, namespace=namespace)), "volumes left behind"


def test_a_name_taken_by_a_postgrescluster_is_reported_and_the_cluster_left_alone(
    kube: Client, namespace: str, operator: OperatorProcess
) -> None:
    name = f"taken-{uuid.uuid4().hex[:4]}"
    kube.create(codecs.from_dict(pgc_body(name, namespace, replicas=1)))
    kube.create(codecs.from_dict(db_body(name, namespace, "postgres", replicas=3)))
    database = wait_for(
        lambda: (
            (d := get_db(kube, name, namespace)).get("status", {}).get("phase") == "Failed" and d
        ),
        what="the Database Failed",
    )
    degraded = condition(database, "Degraded")
    assert degraded["reason"] == "NameTaken" and "PostgresCluster" in degraded["message"]
    cluster = kube.get(PostgresClusterResource, name, namespace=namespace)
    assert cluster["spec"]["replicas"] == 1, "the user's cluster was changed"
    # Deleting the Database leaves the cluster it never owned.
    kube.delete(DatabaseResource, name, namespace=namespace)
    wait_for(lambda: gone(kube, DatabaseResource, name, namespace), what="the Database gone")
    assert kube.get(PostgresClusterResource, name, namespace=namespace)["spec"]["replicas"] == 1
