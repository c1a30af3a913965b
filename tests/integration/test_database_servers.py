"""Databases on the real nodes: a postgres Database runs through its PostgresCluster, and a
MariaDB Database runs real MariaDB servers — a primary the operator made writable, replicas
replicating from it with GTIDs, the Services following the roles — through scaling 1 → 3 → 1,
storage growth and deletion."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import pymysql
import pytest
from lightkube import ApiError, Client, codecs
from lightkube.resources.core_v1 import PersistentVolumeClaim, Pod, Secret
from lightkube.types import PatchType

from stateward.cli.run import OperatorProcess
from stateward.controllers.kube import DatabaseResource
from stateward.local.cluster import LocalCluster
from tests.support.dataplane import client_of, fresh_namespace, operator_on, sql
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def client(real_cluster: LocalCluster) -> Client:
    return client_of(real_cluster)


@pytest.fixture(scope="module")
def db_operator(real_cluster: LocalCluster, client: Client) -> Iterator[OperatorProcess]:
    with operator_on(real_cluster, client, "database-operator") as handle:
        yield handle


@pytest.fixture
def ns(client: Client, db_operator: OperatorProcess) -> Iterator[str]:
    with fresh_namespace(client) as name:
        yield name


def create(client: Client, ns: str, name: str, engine: str, version: str, replicas: int) -> None:
    client.create(
        codecs.from_dict(
            {
                "apiVersion": "stateward.io/v1alpha1",
                "kind": "Database",
                "metadata": {"name": name, "namespace": ns},
                "spec": {"engine": engine, "version": version, "replicas": replicas,
                         "storage": {"size": "1Gi"}},
            }
        )
    )  # fmt: skip


def running(client: Client, ns: str, name: str, replicas: int) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        found: dict[str, Any] = client.get(DatabaseResource, name, namespace=ns).to_dict()
        status = found.get("status") or {}
        done = status.get("phase") == "Running" and status.get("readyReplicas") == replicas
        return found if done and status.get("observedGeneration") == found["metadata"][
            "generation"] else None  # fmt: skip

    return wait_for(check, what=f"{ns}/{name} Running with {replicas}", timeout=300, interval=1)


def resize(client: Client, ns: str, name: str, spec: dict[str, Any]) -> None:
    client.patch(DatabaseResource, name, {"spec": spec}, namespace=ns,
                 patch_type=PatchType.MERGE)  # fmt: skip


def secret(client: Client, ns: str, name: str) -> dict[str, str]:
    found = client.get(Secret, name, namespace=ns)
    return {k: base64.b64decode(v).decode() for k, v in (found.data or {}).items()}


def pod_ip(client: Client, ns: str, pod: str) -> str:
    found = client.get(Pod, pod, namespace=ns)
    assert found.status is not None and found.status.podIP
    return found.status.podIP


def query(address: str, app: dict[str, str], statement: str) -> tuple[Any, ...]:
    connection = pymysql.connect(host=address, port=3306, user=app["user"],
                                 password=app["password"], database=app["dbname"],
                                 autocommit=True, connect_timeout=5)  # fmt: skip
    try:
        with connection.cursor() as cursor:
            cursor.execute(statement)
            return tuple(cursor.fetchall())
    finally:
        connection.close()


def roles(client: Client, ns: str) -> dict[str, str | None]:
    return {
        p.metadata.name: (p.metadata.labels or {}).get("stateward.io/role")  # type: ignore[union-attr]
        for p in client.list(Pod, namespace=ns, labels={"app.kubernetes.io/name": "mariadb"})
        if p.metadata is not None and p.metadata.deletionTimestamp is None
    }


def test_a_postgres_database_runs_on_the_real_nodes(
    real_cluster: LocalCluster, client: Client, ns: str
) -> None:
    create(client, ns, "pgdb", "postgres", "15", 2)
    status = running(client, ns, "pgdb", 2)["status"]
    assert sql(real_cluster, ns, status["primaryPod"], "select pg_is_in_recovery()") == "f"
    app = secret(client, ns, "pgdb-app")
    assert app["host"] == f"pgdb-primary.{ns}.svc"


def test_a_mariadb_database_replicates_scales_grows_and_goes(client: Client, ns: str) -> None:
    create(client, ns, "shop", "mariadb", "10.11", 1)
    status = running(client, ns, "shop", 1)["status"]
    assert status["primaryPod"] == "shop-0"
    app = secret(client, ns, "shop-app")
    primary = pod_ip(client, ns, "shop-0")
    query(primary, app, "CREATE TABLE orders (n INT PRIMARY KEY)")
    query(primary, app, "INSERT INTO orders VALUES (1), (2), (3)")

    # Three servers: the new ones replicate what the primary had and what it writes next.
    resize(client, ns, "shop", {"replicas": 3})
    running(client, ns, "shop", 3)
    query(primary, app, "INSERT INTO orders VALUES (4)")
    assert roles(client, ns) == {"shop-0": "primary", "shop-1": "replica", "shop-2": "replica"}
    for replica in ("shop-1", "shop-2"):
        address = pod_ip(client, ns, replica)
        wait_for(
            lambda a=address: query(a, app, "SELECT count(*), max(n) FROM orders") == ((4, 4),),
            what=f"{replica} to have every row",
            timeout=60,
        )
        with pytest.raises(pymysql.err.OperationalError) as refused:
            query(address, app, "INSERT INTO orders VALUES (99)")
        assert refused.value.args[0] == 1290, "a replica took a write (it must be read-only)"

    # Back to one: the replicas go, the primary stays and keeps its data.
    resize(client, ns, "shop", {"replicas": 1})
    running(client, ns, "shop", 1)
    assert query(primary, app, "SELECT count(*) FROM orders") == ((4,),)

    # Storage grows in place.
    resize(client, ns, "shop", {"storage": {"size": "2Gi"}})
    wait_for(
        lambda: all(
            c.spec.resources.requests["storage"] == "2Gi"  # type: ignore[union-attr, index]
            for c in client.list(PersistentVolumeClaim, namespace=ns)
        ),
        what="the data volumes asked to grow",
    )

    client.delete(DatabaseResource, "shop", namespace=ns)

    def gone() -> bool:
        try:
            client.get(DatabaseResource, "shop", namespace=ns)
        except ApiError as error:
            return error.status.code == 404
        return False

    wait_for(gone, what="the Database gone", timeout=180)
    assert not list(client.list(PersistentVolumeClaim, namespace=ns)), "volumes left behind"
