"""Databases on the real nodes: a postgres Database runs through its PostgresCluster, and a
MariaDB Database runs real MariaDB servers — a primary the operator made writable, replicas
replicating from it with GTIDs, the Services following the roles — through scaling 1 → 3 → 1,
storage growth and deletion."""

from __future__ import annotations

import base64
import contextlib
import itertools
import threading
import time
from collections.abc import Iterator
from typing import Any

import pymysql
import pytest
from lightkube import ApiError, Client, codecs
from lightkube.resources.core_v1 import Event, PersistentVolumeClaim, Pod, Secret, Service
from lightkube.types import PatchType

from stateward.cli.run import OperatorProcess
from stateward.controllers.kube import DatabaseResource
from stateward.local.cluster import LocalCluster
from tests.integration.conftest import AuditLog, assert_no_writes_at_rest
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


def test_a_mariadb_database_replicates_scales_grows_and_goes(
    real_cluster: LocalCluster, client: Client, db_operator: OperatorProcess, ns: str
) -> None:
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
    # Converged: reconciles read every server over SQL and write nothing.
    assert_no_writes_at_rest(AuditLog(real_cluster.audit_log), db_operator, ns)
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


class Writer:
    """Inserts numbered rows through the ``-primary`` Service (as an application would) and
    records each acknowledged one with the moment it was acknowledged."""

    def __init__(self, address: str, app: dict[str, str]) -> None:
        self.address, self.app = address, app
        self.acked: list[tuple[int, float]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        connection: Any = None
        number = 0
        while not self.stop.is_set():
            try:
                if connection is None:
                    connection = pymysql.connect(
                        host=self.address, port=3306, user=self.app["user"],
                        password=self.app["password"], database=self.app["dbname"],
                        autocommit=True, connect_timeout=2, read_timeout=5, write_timeout=5,
                    )  # fmt: skip
                with connection.cursor() as cursor:
                    cursor.execute("INSERT INTO acked (n) VALUES (%s)", (number + 1,))
                number += 1
                self.acked.append((number, time.monotonic()))
            except pymysql.MySQLError:
                with contextlib.suppress(Exception):
                    if connection is not None:
                        connection.close()
                connection = None
                number += 1  # a row that may or may not have been written: never reused
                self.stop.wait(0.1)

    def __enter__(self) -> Writer:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)

    def since(self, moment: float) -> int:
        return sum(1 for _, at in self.acked if at > moment)

    def longest_gap(self) -> float:
        stamps = [at for _, at in self.acked]
        return max((b - a for a, b in itertools.pairwise(stamps)), default=0.0)


def test_a_lost_mariadb_primary_is_replaced_without_losing_an_acknowledged_write(
    client: Client, ns: str
) -> None:
    create(client, ns, "ha", "mariadb", "10.11", 3)
    status = running(client, ns, "ha", 3)["status"]
    old = status["primaryPod"]
    app = secret(client, ns, "ha-app")
    query(pod_ip(client, ns, old), app, "CREATE TABLE acked (n INT PRIMARY KEY)")
    service = client.get(Service, "ha-primary", namespace=ns).spec.clusterIP  # type: ignore[union-attr]
    assert service

    with Writer(service, app) as writer:
        wait_for(lambda: len(writer.acked) >= 50, what="the writer under way", timeout=60)
        deleted_at = time.monotonic()
        client.delete(Pod, old, namespace=ns)
        failover = wait_for(
            lambda: (
                (s := client.get(DatabaseResource, "ha", namespace=ns).to_dict().get("status"))
                and (s.get("lastFailover") or {}).get("fromPod") == old
                and s
            ),
            what="the operator to fail over",
            timeout=120,
        )["lastFailover"]
        new = failover["toPod"]
        assert new != old
        wait_for(lambda: writer.since(deleted_at) >= 50, what="writes again through the Service",
                 timeout=120)  # fmt: skip
    assert roles(client, ns)[new] == "primary"
    acknowledged = {n for n, _ in writer.acked}
    stored = {row[0] for row in query(pod_ip(client, ns, new), app, "SELECT n FROM acked")}
    assert acknowledged <= stored, f"lost acknowledged writes: {sorted(acknowledged - stored)[:10]}"
    print(
        f"MariaDB failover: {len(acknowledged)} writes acknowledged, none lost; the longest"
        f" gap between acknowledged writes {writer.longest_gap():.1f} s"
    )
    reasons = [e.reason for e in client.list(Event, namespace=ns)]
    assert "Failover" in reasons
    # The old primary comes back as a replica of the new one (recloned if it held writes the
    # new primary never had), and the Database is whole again.
    running(client, ns, "ha", 3)
    assert roles(client, ns) == {
        pod: ("primary" if pod == new else "replica") for pod in ("ha-0", "ha-1", "ha-2")
    }
    rejoined = pod_ip(client, ns, old)
    wait_for(
        lambda: {r[0] for r in query(rejoined, app, "SELECT n FROM acked")} >= acknowledged,
        what=f"{old} to hold every acknowledged write",
        timeout=120,
    )
    # Scaling down to one would remove the new primary (a higher ordinal): it moves first.
    resize(client, ns, "ha", {"replicas": 1})
    status = running(client, ns, "ha", 1)["status"]
    assert status["primaryPod"] == "ha-0"
    stored = {row[0] for row in query(pod_ip(client, ns, "ha-0"), app, "SELECT n FROM acked")}
    assert acknowledged <= stored, "a write was lost in the switchover before the scale-down"
    assert "SwitchedOver" in [e.reason for e in client.list(Event, namespace=ns)]
