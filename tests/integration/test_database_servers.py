"""Databases on the real nodes: a postgres Database runs through its PostgresCluster, and a
MariaDB Database runs real MariaDB servers — a primary the operator made writable, replicas
replicating from it with GTIDs, the Services following the roles — through scaling 1 → 3 → 1,
storage growth and deletion."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pymysql
import pytest
from lab.database_faults import FAULTS, Lab, mariadbd_of, port_dropped, run_fault
from lab.databases import (
    clone_stream_bytes,
    create,
    pod_ip,
    query,
    refused,
    resize,
    roles,
    running,
    secret,
    tls_of,
)
from lab.dataplane import client_of, fresh_namespace, operator_on, scrape, sql
from lab.waiting import wait_for
from lightkube import ApiError, Client
from lightkube.resources.core_v1 import Event, PersistentVolumeClaim

from stateward.controllers.kube import DatabaseResource
from stateward_local.cluster import LocalCluster
from stateward_local.run import OperatorProcess
from tests.integration.conftest import AuditLog, assert_no_writes_at_rest

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
    # The first new one cannot reach the primary's clone port at first (a partition, a policy
    # not yet admitting it): the Database has data, so it waits for its primary, and never
    # starts empty beside it.
    with port_dropped(real_cluster, client, ns, "shop-0", 3307):
        resize(client, ns, "shop", {"replicas": 3})
        wait_for(
            lambda: (
                "the Database has data and no primary answered"
                in "".join(client.log("shop-1", namespace=ns))
            ),
            what="shop-1 to wait for the primary it cannot reach",
            timeout=240,
            interval=2,
        )
    running(client, ns, "shop", 3)
    query(primary, app, "INSERT INTO orders VALUES (4)")
    assert roles(client, ns) == {"shop-0": "primary", "shop-1": "replica", "shop-2": "replica"}
    # They started from a copy of the primary's data, taken over mutual TLS (entrypoint.sh).
    for replica in ("shop-1", "shop-2"):
        log = "".join(client.log(replica, namespace=ns))
        assert "cloned from" in log, f"{replica} did not start from a copy of the primary"
    # With replicas, every commit waits for one to have it, and never stops waiting (no
    # fallback to asynchronous replication after a timeout).
    semi_sync = "SELECT @@rpl_semi_sync_master_enabled, @@rpl_semi_sync_master_timeout"
    wait_for(
        lambda: query(primary, app, semi_sync) == ((1, 4294967295),),
        what="the primary to wait for acknowledgements",
        timeout=60,
    )
    # Converged: reconciles read every server over SQL and write nothing.
    assert_no_writes_at_rest(AuditLog(real_cluster.audit_log), db_operator, ns)
    for replica in ("shop-1", "shop-2"):
        address = pod_ip(client, ns, replica)
        wait_for(
            lambda a=address: query(a, app, "SELECT count(*), max(n) FROM orders") == ((4, 4),),
            what=f"{replica} to have every row",
            timeout=60,
        )
        with pytest.raises(pymysql.err.OperationalError) as denied:
            query(address, app, "INSERT INTO orders VALUES (99)")
        assert denied.value.args[0] == 1290, "a replica took a write (it must be read-only)"

    # Each server serves its metrics (mysqld_exporter on 9104, logged in as a monitoring
    # account of the server's own): up, read-only on the replicas only, their replication
    # threads running and their lag, and the primary's inserts counted.
    def metrics_of(pod: str) -> dict[tuple[str, frozenset[Any]], float]:
        def up() -> dict[tuple[str, frozenset[Any]], float] | None:
            got = scrape(real_cluster, ns, pod, port=9104)
            return got if got.get(("mysql_up", frozenset())) == 1 else None

        return wait_for(up, what=f"{pod}'s metrics", timeout=60)

    def named(found: dict[tuple[str, frozenset[Any]], float], name: str) -> list[float]:
        return [value for (key, _), value in found.items() if key == name]

    on_primary = metrics_of("shop-0")
    assert named(on_primary, "mysql_global_variables_read_only") == [0]
    inserts = frozenset({("command", "insert")})
    before = on_primary[("mysql_global_status_commands_total", inserts)]
    query(primary, app, "INSERT INTO orders VALUES (100)")
    after = metrics_of("shop-0")[("mysql_global_status_commands_total", inserts)]
    assert after > before, "the insert was not counted"
    for replica in ("shop-1", "shop-2"):
        on_replica = metrics_of(replica)
        assert named(on_replica, "mysql_global_variables_read_only") == [1]
        assert named(on_replica, "mysql_slave_status_slave_sql_running") == [1]
        assert named(on_replica, "mysql_slave_status_slave_io_running") == [1]
        assert len(named(on_replica, "mysql_slave_status_seconds_behind_master")) == 1
    query(primary, app, "DELETE FROM orders WHERE n = 100")

    # An attacker on the pod network, holding every password, gets nothing: no login without
    # TLS, no root from the network, the operator's and the replication accounts need their
    # certificates, and the clone port streams no data without a client certificate.
    credentials = secret(client, ns, "shop-credentials")
    trusting = tls_of(app)
    plain = refused(primary, user=app["user"], password=app["password"], ssl_disabled=True)
    assert plain is not None, "a connection without TLS got in"
    assert refused(primary, user=app["user"], password=app["password"], ssl=trusting) is None
    for user, password in (
        ("root", credentials["root-password"]),
        ("replicator", credentials["replication-password"]),
        ("stateward", ""),
    ):
        assert refused(primary, user=user, password=password, ssl=trusting) is not None, (
            f"{user} logged in over the network without its certificate"
        )
    token = credentials["replication-password"]
    assert clone_stream_bytes(primary, 3307, context=None, token=token) == b""
    # Nor do the servers' processes carry a password in their environment (what every child
    # inherits, what /proc shows): the passwords are files the scripts read.
    pid = wait_for(lambda: mariadbd_of(ns, "shop-0"), what="shop-0's mariadbd")
    environment = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    leaked = [k for k, v in {**credentials, "app": app["password"]}.items() if v in environment]
    assert not leaked, f"mariadbd's environment holds {leaked}"
    assert clone_stream_bytes(primary, 3307, context=trusting, token=token) == b""

    # Back to one: the replicas go, the primary stays and keeps its data.
    resize(client, ns, "shop", {"replicas": 1})
    running(client, ns, "shop", 1)
    assert query(primary, app, "SELECT count(*) FROM orders") == ((4,),)
    # Alone, it has nobody to wait for (a commit would never return).
    wait_for(
        lambda: query(primary, app, semi_sync)[0][0] == 0,
        what="the lone primary to stop waiting for acknowledgements",
        timeout=60,
    )
    query(primary, app, "INSERT INTO orders VALUES (5)")

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


@pytest.mark.timeout(600)  # a Database made, failed over, rejoined, then scaled down
def test_a_lost_mariadb_primary_is_replaced_without_losing_an_acknowledged_write(
    real_cluster: LocalCluster, client: Client, ns: str
) -> None:
    # The pod-delete fault of the MariaDB matrix: the departing server is fenced, the most
    # advanced replica promoted; the verdict (every acknowledged row on every server, one
    # server acknowledging at a time, no volume deleted) is ``run_fault``'s.
    create(client, ns, "ha", "mariadb", "10.11", 3)
    lab = Lab(real_cluster, client, ns, "ha")
    outcome = run_fault(lab, FAULTS["pod-delete"])
    new, acknowledged = outcome.primary, outcome.acknowledged
    print(
        f"MariaDB failover: {len(acknowledged)} writes acknowledged, none lost; the longest"
        f" gap between acknowledged writes {outcome.downtime:.1f} s"
    )
    reasons = [e.reason for e in client.list(Event, namespace=ns)]
    assert "Failover" in reasons
    assert roles(client, ns) == {
        pod: ("primary" if pod == new else "replica") for pod in ("ha-0", "ha-1", "ha-2")
    }
    app = secret(client, ns, "ha-app")
    select = f"SELECT n FROM {outcome.table}"  # noqa: S608 - the writer's table
    # Scaling down to one removes ha-1 and ha-2: a primary among them moves to ha-0 first
    # (the first primary is whichever server answered first, so the new one may be ha-0).
    resize(client, ns, "ha", {"replicas": 1})
    status = running(client, ns, "ha", 1)["status"]
    assert status["primaryPod"] == "ha-0"
    stored = {row[0] for row in query(pod_ip(client, ns, "ha-0"), app, select)}
    assert acknowledged <= stored, "a write was lost in the switchover before the scale-down"
    reasons = [e.reason for e in client.list(Event, namespace=ns)]
    assert ("SwitchedOver" in reasons) == (new != "ha-0"), (new, reasons)
    assert reasons.count("Failover") == 1, "the scale-down never removed a primary"
