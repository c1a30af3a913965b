"""The data plane on real nodes: Patroni-managed PostgreSQL 15 in the instance pods.

The operator runs as a process against the session's cluster with real nodes; each test
makes its own PostgresCluster in its own namespace. Clusters here have no backup repository
(test_backups.py covers backups), so they go without a final backup.
"""

from __future__ import annotations

import base64
import http.client
import os
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from lab.dataplane import (
    CONNECT_AS_AN_APPLICATION,
    PATCH_CONFIG_AS_AN_ATTACKER,
    PoolerWriter,
    Writer,
    annotate,
    client_of,
    create_cluster,
    event_reasons,
    fresh_namespace,
    local_repository,
    now_stamp,
    operator_on,
    pooler_dsn,
    ready,
    roles,
    run_in_pod,
    scrape,
    sql,
    status_of,
    switchover_done,
)
from lab.faults import instance_processes
from lab.operator import get_pgc, metric
from lab.waiting import Timeout, wait_for
from lightkube import ApiError, Client
from lightkube.resources.core_v1 import ConfigMap, Pod, Secret
from lightkube.types import PatchType

from stateward.api import v1alpha1
from stateward_local.cluster import LocalCluster
from stateward_local.nodes import host
from stateward_local.run import (
    OperatorProcess,
    PostgresClusterResource,
)
from stateward_local.services import netpol
from tests.support import certificates

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def client(real_cluster: LocalCluster) -> Client:
    return client_of(real_cluster)


@pytest.fixture(scope="module")
def real_operator(real_cluster: LocalCluster, client: Client) -> Iterator[OperatorProcess]:
    with operator_on(real_cluster, client, "data-plane-operator") as handle:
        yield handle


@pytest.fixture
def ns(client: Client, real_operator: OperatorProcess) -> Iterator[str]:
    with fresh_namespace(client) as name:
        yield name


@pytest.mark.timeout(600)
def test_a_single_instance_bootstraps_to_a_writable_primary(
    real_cluster: LocalCluster, client: Client, ns: str, tmp_path: Path
) -> None:
    create_cluster(client, ns, "solo", replicas=1)
    status = ready(client, ns, "solo")["status"]
    assert status["primaryPod"] == "solo-0"
    assert status.get("replicaPods", []) == []
    assert sql(real_cluster, ns, "solo-0", "select pg_is_in_recovery()") == "f"
    assert sql(real_cluster, ns, "solo-0", "select version()").startswith("PostgreSQL 15")

    # The application's Secret connects to its own database as its owner.
    secret = client.get(Secret, "solo-app", namespace=ns)
    app = {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}
    assert app["host"] == f"solo-primary.{ns}.svc" and app["dbname"] == "app"
    assert app["uri"].startswith("postgresql://app:")
    address = client.get(Pod, "solo-0", namespace=ns).status.podIP  # type: ignore[union-attr]
    result = subprocess.run(
        ["psql", f"host={address} port={app['port']} dbname={app['dbname']} user={app['user']}",
         "-tAc", "create table mine (n int); select current_user, current_database()"],
        env={**os.environ, "PGPASSWORD": app["password"]},
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert result.stdout.strip().splitlines()[-1] == "app|app", result.stderr

    # An application in the namespace connects with the Secret's uri as it is: TLS 1.3, the
    # Service's name checked against the certificate by the CA beside it. Without TLS the
    # same user and password are refused before authentication.
    assert "sslmode=verify-full" in app["uri"]

    def password(secret: str) -> str:
        data = client.get(Secret, secret, namespace=ns).data or {}
        return base64.b64decode(data["password"]).decode()

    answers = run_in_pod(
        client, ns, "application", f"{v1alpha1.DEFAULT_IMAGE_REPOSITORY}:15",
        ["sh", "-c", CONNECT_AS_AN_APPLICATION, "sh", app["ca.crt"], app["uri"],
         app["password"], app["host"], password("solo-superuser"),
         password("solo-replication")],
    )  # fmt: skip
    lines = dict(line.split(": ", 1) for line in answers.splitlines() if ": " in line)
    # Credentials are files, not variables: what Patroni and PostgreSQL (and every child
    # they start: archive_command, pgBackRest) carry in their environment holds none.
    processes = instance_processes(ns, "solo-0")
    assert set(processes) == {"patroni", "postmaster"}, processes
    credentials = [password(f"solo-{name}") for name in ("superuser", "replication",
                                                          "patroni-api", "app")]  # fmt: skip
    for name, pid in processes.items():
        environment = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
        assert not [c for c in credentials if c in environment], f"a credential in {name}'s env"
    assert lines["verify-full"] == "TLSv1.3 true", answers
    assert "pg_hba.conf rejects connection" in lines["disable"], answers
    assert "no encryption" in lines["disable"], answers
    # The superuser and the replication role need the instances' client certificates: their
    # passwords alone get nobody in from another pod.
    for role in ("superuser", "replication"):
        assert "requires a valid client certificate" in lines[role], answers

    # A new CA (its Secret deleted): the operator reissues the serving certificate, and the
    # instance serves it after a reload, without a restart. Clients that trust only the new
    # CA get in, over PostgreSQL and over Patroni's REST API.
    old_ca = app["ca.crt"]
    client.delete(Secret, "solo-ca", namespace=ns)

    def new_ca() -> str | None:
        data = client.get(Secret, "solo-app", namespace=ns).data or {}
        ca = base64.b64decode(data.get("ca.crt", "")).decode()
        return ca if ca and ca != old_ca else None

    ca = wait_for(new_ca, what="the app Secret to carry the new CA", timeout=60)
    ca_file = tmp_path / "ca.crt"
    ca_file.write_text(ca)
    verified = (
        f"host={address} port=5432 dbname=app user=app sslmode=verify-ca sslrootcert={ca_file}"
    )

    def served_by_new_ca() -> bool:
        done = subprocess.run(
            ["psql", verified, "-tAc", "select 1"],
            env={**os.environ, "PGPASSWORD": app["password"]},
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        return done.returncode == 0

    wait_for(served_by_new_ca, what="PostgreSQL to serve the reissued certificate", timeout=240)
    trusting_new_ca = ssl.create_default_context(cafile=str(ca_file))
    trusting_new_ca.check_hostname = False  # by IP, as the operator and the members call it
    rest = http.client.HTTPSConnection(address, 8008, context=trusting_new_ca, timeout=30)
    rest.request("GET", "/patroni")
    assert rest.getresponse().status == 200
    pod = client.get(Pod, "solo-0", namespace=ns)
    statuses = pod.status.containerStatuses or []  # type: ignore[union-attr]
    assert statuses and all(c.restartCount == 0 for c in statuses)

    # The organisation's own CA (spec.tls.caSecretName: the Secret cert-manager writes for a
    # CA Certificate, an intermediate under a root): the instance serves a certificate it
    # signed, with the intermediate beside it, so a client that trusts only the root gets
    # in — over PostgreSQL and over Patroni's REST API, still without a restart.
    corp, root = certificates.cert_manager_ca()
    client.create(Secret.from_dict(certificates.tls_secret("corp-ca", corp)), namespace=ns)
    client.patch(
        PostgresClusterResource, "solo", {"spec": {"tls": {"caSecretName": "corp-ca"}}},
        namespace=ns, patch_type=PatchType.MERGE,
    )  # fmt: skip
    ca_file.write_bytes(root.public_bytes(serialization.Encoding.PEM))
    wait_for(served_by_new_ca, what="PostgreSQL to serve a certificate of corp-ca", timeout=240)
    trusting_root = ssl.create_default_context(cafile=str(ca_file))
    trusting_root.check_hostname = False
    rest = http.client.HTTPSConnection(address, 8008, context=trusting_root, timeout=30)
    rest.request("GET", "/patroni")
    assert rest.getresponse().status == 200
    pod = client.get(Pod, "solo-0", namespace=ns)
    statuses = pod.status.containerStatuses or []  # type: ignore[union-attr]
    assert statuses and all(c.restartCount == 0 for c in statuses)

    # The organisation's own serving certificate (spec.tls.serverSecretName: the Secret
    # cert-manager writes for a Certificate from another issuer): served as it is, without a
    # restart; an application trusting only that issuer's root verifies the Service's name.
    host = f"solo-primary.{ns}.svc"
    web, (web_root, web_root_key) = certificates.cert_manager_server((host,))
    client.create(Secret.from_dict(certificates.tls_secret("web", web)), namespace=ns)
    client.patch(
        PostgresClusterResource, "solo", {"spec": {"tls": {"serverSecretName": "web"}}},
        namespace=ns, patch_type=PatchType.MERGE,
    )  # fmt: skip
    web_root_file = tmp_path / "web-root.crt"
    web_root_file.write_bytes(web["ca.crt"])
    by_name = f"host={host} hostaddr={address} port=5432 sslmode=verify-full"
    by_name += f" sslrootcert={web_root_file}"

    def served_web_certificate() -> bool:
        served = ssl.get_server_certificate((address, 8008), timeout=30)
        done = subprocess.run(
            ["psql", f"{by_name} dbname=app user=app", "-tAc", "select 1"],
            env={**os.environ, "PGPASSWORD": app["password"]},
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        leaf = x509.load_pem_x509_certificates(web["tls.crt"])[0]
        patroni_serves = ssl.PEM_cert_to_DER_cert(served) == leaf.public_bytes(
            serialization.Encoding.DER
        )
        if done.returncode != 0 or not patroni_serves:  # the last one is reported on timeout
            raise AssertionError(f"Patroni serves web: {patroni_serves}; psql: {done.stderr}")
        return True

    wait_for(served_web_certificate, what="PostgreSQL and Patroni to serve web", timeout=240)
    # An attacker whom the same issuer gave a client certificate for "postgres" (a namespace
    # Issuer will sign anything asked) is not the superuser: client certificates are taken
    # from the cluster's CA alone.
    forged, forged_key = certificates.leaf("postgres", (web_root, web_root_key), client=True)
    forged_file, forged_key_file = tmp_path / "forged.crt", tmp_path / "forged.key"
    forged_file.write_bytes(certificates.pem(forged))
    forged_key_file.write_bytes(certificates.pem_key(forged_key))
    forged_key_file.chmod(0o600)
    attack = subprocess.run(
        ["psql", f"{by_name} dbname=postgres user=postgres sslcert={forged_file}"
         f" sslkey={forged_key_file}", "-tAc", "select current_user"],
        env={**os.environ, "PGPASSWORD": password("solo-superuser")},
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert attack.returncode != 0 and "postgres" not in attack.stdout, attack
    pod = client.get(Pod, "solo-0", namespace=ns)
    statuses = pod.status.containerStatuses or []  # type: ignore[union-attr]
    assert statuses and all(c.restartCount == 0 for c in statuses)

    # An application that cannot speak TLS (spec.tls.allowPlaintextClients): once the
    # instance runs the new rules, the application logs in without TLS; the superuser, its
    # password in hand, still does not.
    client.patch(
        PostgresClusterResource, "solo", {"spec": {"tls": {"allowPlaintextClients": True}}},
        namespace=ns, patch_type=PatchType.MERGE,
    )  # fmt: skip

    def without_tls(user: str, dbname: str, secret: str) -> subprocess.CompletedProcess[str]:
        current = client.get(Pod, "solo-0", namespace=ns).status.podIP  # type: ignore[union-attr]
        return subprocess.run(
            ["psql", f"host={current} port=5432 dbname={dbname} user={user} sslmode=disable"
             " connect_timeout=5", "-tAc", MY_SSL],
            env={**os.environ, "PGPASSWORD": secret},
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip

    def plaintext_application() -> bool:
        done = without_tls("app", "app", app["password"])
        if done.returncode != 0:
            raise AssertionError(done.stderr)  # the last one is reported on timeout
        return done.stdout.strip() == "f"

    wait_for(plaintext_application, what="the application to log in without TLS", timeout=300)
    superuser = without_tls("postgres", "postgres", password("solo-superuser"))
    assert superuser.returncode != 0, superuser
    assert "no encryption" in superuser.stderr, superuser.stderr


MY_SSL = "select ssl from pg_stat_ssl where pid = pg_backend_pid()"
"""Whether this connection is TLS (``t``) or not (``f``)."""

CUSTOM_QUERIES = """\
tables:
  query: "select relname as relation, n_tup_ins as inserted from pg_stat_user_tables"
  primary: true
  metrics:
    - relation: {usage: LABEL, description: "Table"}
    - inserted: {usage: COUNTER, description: "Rows inserted"}
terminate:
  query: "select count(pg_terminate_backend(pid)) as killed from pg_stat_activity
          where backend_type = 'client backend' and pid <> pg_backend_pid()"
  metrics:
    - killed: {usage: GAUGE, description: "What a superuser could do"}
password_hashes:
  query: "select count(*) as n from pg_authid where rolpassword is not null"
  metrics:
    - n: {usage: GAUGE, description: "What only a superuser may read"}
"""
"""A user's custom queries (spec.monitoring.customQueriesConfigMap): one a monitoring role
may run, and two only a superuser could."""


def test_postgresql_17_runs_replicates_synchronously_and_its_metrics_move(
    real_cluster: LocalCluster, client: Client, ns: str
) -> None:
    client.create(
        ConfigMap.from_dict(
            {"metadata": {"name": "queries"}, "data": {"queries.yaml": CUSTOM_QUERIES}}
        ),
        namespace=ns,
    )
    create_cluster(
        client, ns, "pg17", replicas=2, version="17",
        monitoring={"customQueriesConfigMap": [{"name": "queries"}]},
    )  # fmt: skip
    ready(client, ns, "pg17")
    wait_for(
        lambda: sorted(roles(client, ns, "pg17").values()) == ["primary", "sync_standby"],
        what="the replica to become the synchronous standby",
        timeout=90,
    )
    status = status_of(client, ns, "pg17")
    primary, replica = status["primaryPod"], status["replicaPods"][0]
    assert sql(real_cluster, ns, primary, "show server_version_num").startswith("17")
    assert sql(real_cluster, ns, primary, "create table t (n int)") == "CREATE TABLE"
    assert sql(real_cluster, ns, primary, "insert into t values (1)") == "INSERT 0 1"
    wait_for(
        lambda: sql(real_cluster, ns, replica, "select count(*) from t") == "1",
        what="the row on the PostgreSQL 17 replica",
    )

    # Each instance serves its metrics (9187): role, timeline, commits, sizes, the volume.
    on_primary = wait_for(lambda: scrape(real_cluster, ns, primary), what="the primary's metrics")
    assert on_primary[("stateward_postgres_up", frozenset())] == 1
    assert on_primary[("stateward_postgres_primary", frozenset())] == 1
    assert on_primary[("stateward_postgres_timeline", frozenset())] >= 1
    assert on_primary[("stateward_postgres_volume_capacity_bytes", frozenset())] > 0
    app = frozenset({("database", "app")})
    assert on_primary[("stateward_postgres_database_size_bytes", app)] > 0
    on_replica = wait_for(lambda: scrape(real_cluster, ns, replica), what="the replica's metrics")
    assert on_replica[("stateward_postgres_primary", frozenset())] == 0
    commits = frozenset({("database", "postgres"), ("outcome", "commit")})
    before = on_primary[("stateward_postgres_transactions_total", commits)]
    assert sql(real_cluster, ns, primary, "insert into t values (2)") == "INSERT 0 1"
    wait_for(
        lambda: (
            scrape(real_cluster, ns, primary)[("stateward_postgres_transactions_total", commits)]
            > before
        ),
        what="the commit counter to count the insert",
    )

    # Lag rises, as the primary sees it, while the replica's node is frozen (the inserts
    # commit locally: the synchronous standby cannot answer), and falls back to 0 once thawed.
    def lag_of_replica() -> float | None:
        return next(
            (
                value
                for (name, labels), value in scrape(real_cluster, ns, primary).items()
                if name == "stateward_postgres_replica_lag_bytes" and ("replica", replica) in labels
            ),
            None,
        )

    node = str(client.get(Pod, replica, namespace=ns).spec.nodeName)  # type: ignore[union-attr]
    real_cluster.node_freeze(node)
    try:
        inserted = sql(
            real_cluster,
            ns,
            primary,
            "set synchronous_commit to local; insert into t select generate_series(3, 5000)",
        )
        assert inserted.endswith("INSERT 0 4998"), inserted  # after SET's tag
        wait_for(
            lambda: (lag_of_replica() or 0) > 0,
            what="the primary to report the frozen replica's lag",
        )
    finally:
        real_cluster.node_thaw(node)
    wait_for(lambda: lag_of_replica() == 0, what="the lag back to 0 once thawed", timeout=90)
    on_replica = wait_for(lambda: scrape(real_cluster, ns, replica), what="the replica's metrics")
    assert on_replica[("stateward_postgres_replay_lag_bytes", frozenset())] == 0

    # The custom queries run as the monitoring role: the table counter is served (on the
    # primary only, as asked) and counts the inserts; what only a superuser may do — end
    # the application's sessions, read the password hashes — fails and is counted, and
    # serves nothing.
    table = frozenset({("relation", "t")})
    inserted = "stateward_custom_tables_inserted_total"

    def counted() -> dict[tuple[str, frozenset[Any]], float] | None:
        got = scrape(real_cluster, ns, primary)
        return got if got.get((inserted, table), 0) >= 5000 else None

    found = wait_for(counted, what="the custom query to count the inserted rows", timeout=90)
    for query in ("terminate", "password_hashes"):
        assert found[("stateward_custom_query_errors_total", frozenset({("query", query)}))] >= 1
    assert not [name for name, _ in found if name.startswith("stateward_custom_terminate")]
    assert not [name for name, _ in found if name.startswith("stateward_custom_password")]
    assert (inserted, table) not in scrape(real_cluster, ns, replica)


@pytest.mark.timeout(900)
def test_a_15_cluster_upgrades_in_place_to_17_keeping_its_data(
    real_cluster: LocalCluster, client: Client, ns: str
) -> None:
    create_cluster(client, ns, "up", replicas=3, version="15")
    ready(client, ns, "up")
    primary = status_of(client, ns, "up")["primaryPod"]
    rows = "create table t as select g, md5(g::text) as m from generate_series(1, 20000) g"
    assert sql(real_cluster, ns, primary, rows, database="app") == "SELECT 20000"
    digest = "select md5(string_agg(m, ',' order by g)) from t"
    before = sql(real_cluster, ns, primary, digest, database="app")
    assert len(before) == 32
    wait_for(lambda: status_of(client, ns, "up").get("version") == "15", what="status.version")

    client.patch(
        PostgresClusterResource, "up", {"spec": {"version": "17"}},
        namespace=ns, patch_type=PatchType.MERGE,
    )  # fmt: skip

    def upgraded() -> dict[str, Any] | None:
        record = status_of(client, ns, "up").get("upgrade") or {}
        if record.get("phase") in ("Refused", "Failed"):
            raise AssertionError(f"the upgrade ended {record['phase']}: {record.get('message')}")
        return record if record.get("phase") == "Succeeded" else None

    record = wait_for(upgraded, what="the upgrade to succeed", timeout=600, interval=1)
    assert (record["from"], record["to"]) == ("15", "17")
    status = ready(client, ns, "up")["status"]
    assert status["version"] == "17"
    members = [status["primaryPod"], *status["replicaPods"]]
    assert len(members) == 3
    for pod in members:
        assert sql(real_cluster, ns, pod, "show server_version_num").startswith("17"), pod
    new_primary = status["primaryPod"]
    assert sql(real_cluster, ns, new_primary, digest, database="app") == before
    # The replicas were cloned from the upgraded primary and follow it.
    insert = "insert into t values (20001, 'after')"
    assert sql(real_cluster, ns, new_primary, insert, database="app") == "INSERT 0 1"
    for pod in status["replicaPods"]:
        wait_for(
            lambda pod=pod: sql(real_cluster, ns, pod, "select count(*) from t", "app") == "20001",
            what=f"the new row on {pod}",
        )
    reasons = event_reasons(client, ns)
    for reason in ("UpgradeStarted", "DataUpgraded", "Upgraded"):
        assert reason in reasons, reasons
    # Back below the data's major: refused by the API server.
    with pytest.raises(ApiError) as downgrade:
        client.patch(
            PostgresClusterResource, "up", {"spec": {"version": "15"}},
            namespace=ns, patch_type=PatchType.MERGE,
        )  # fmt: skip
    assert "older than the data files, which are PostgreSQL 17" in str(
        downgrade.value.status.message
    )


@pytest.mark.timeout(600)
def test_an_upgrade_pg_upgrade_refuses_leaves_the_cluster_running_on_15_saying_why(
    real_cluster: LocalCluster, client: Client, ns: str
) -> None:
    create_cluster(client, ns, "stay", replicas=1, version="15")
    primary = ready(client, ns, "stay")["status"]["primaryPod"]
    # aclitem's format changed in 16: pg_upgrade --check refuses a table that stores it.
    made = sql(real_cluster, ns, primary, "CREATE TABLE grants (a aclitem)", database="app")
    assert made == "CREATE TABLE"
    client.patch(
        PostgresClusterResource, "stay", {"spec": {"version": "17"}},
        namespace=ns, patch_type=PatchType.MERGE,
    )  # fmt: skip
    record = wait_for(
        lambda: (
            (r := status_of(client, ns, "stay").get("upgrade") or {}).get("phase")
            in ("Refused", "Failed", "Succeeded")
            and r
        ),
        what="the upgrade to end",
        timeout=300,
    )
    assert record["phase"] == "Refused", record
    assert '"aclitem" data type in user tables' in record["message"]
    assert "public.grants.a" in record["message"]  # pg_upgrade's listing, kept in the status
    # Serving again on 15, Ready; the phase says Failing while Degraded asks for attention.
    status = wait_for(
        lambda: (
            (s := status_of(client, ns, "stay")).get("primaryPod")
            and any(c["type"] == "Ready" and c["status"] == "True" for c in s["conditions"])
            and s
        ),
        what="stay Ready again on 15",
        timeout=240,
    )
    assert status["phase"] == "Failing"
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "UpgradeRefused" and "aclitem" in degraded["message"]
    assert status["version"] == "15"
    primary = status["primaryPod"]
    assert sql(real_cluster, ns, primary, "SHOW server_version_num").startswith("15")
    assert sql(real_cluster, ns, primary, "SELECT count(*) FROM grants", database="app") == "0"
    # Back to 15: the refusal is answered, nothing is degraded any more.
    client.patch(
        PostgresClusterResource, "stay", {"spec": {"version": "15"}},
        namespace=ns, patch_type=PatchType.MERGE,
    )  # fmt: skip
    wait_for(
        lambda: (
            next(c for c in status_of(client, ns, "stay")["conditions"] if c["type"] == "Degraded")[
                "status"
            ]
            == "False"
        ),
        what="Degraded to clear",
        timeout=60,
    )
    ready(client, ns, "stay")


def test_parameters_are_applied_through_patroni_without_recreating_pods(
    real_cluster: LocalCluster, client: Client, ns: str
) -> None:
    create_cluster(client, ns, "tuned", replicas=1)
    ready(client, ns, "tuned")
    before = client.get(Pod, "tuned-0", namespace=ns)
    assert sql(real_cluster, ns, "tuned-0", "show max_connections") == "100"

    # Nobody can change the configuration behind the operator's back through Patroni's REST
    # API. A pod of the namespace does not even reach it (the NetworkPolicy admits only the
    # members and the operator: test_the_network_policy_keeps_other_namespaces_and_non_members_out).
    # Where the policy does admit (the host, where the operator runs here), the API speaks
    # only TLS and asks for credentials that only the operator and the instances hold.
    superuser = client.get(Secret, "tuned-superuser", namespace=ns).data or {}
    admitted = subprocess.run(
        [sys.executable, "-c", PATCH_CONFIG_AS_AN_ATTACKER,
         before.status.podIP,  # type: ignore[union-attr]
         base64.b64decode(superuser["password"]).decode()],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert admitted.stdout.split() == ["http-refused", "401", "401", "401"], admitted
    assert sql(real_cluster, ns, "tuned-0", "show archive_command") == "/bin/true"

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
    # max_connections needs a restart: with no replica to hand over to, Patroni restarts
    # PostgreSQL in place (the pod and its container stay), and says so in an Event.
    wait_for(
        lambda: sql(real_cluster, ns, "tuned-0", "show max_connections") == "120",
        what="max_connections to take effect after the operator's restart",
        timeout=120,
        interval=1,
    )
    wait_for(
        lambda: "InstanceRestarted" in event_reasons(client, ns),
        what="the InstanceRestarted Event",
    )
    wait_for(
        lambda: "pendingRestart" not in status_of(client, ns, "tuned"),
        what="status.pendingRestart to clear",
        timeout=60,
    )
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
    # Both replicas stream over TLS 1.3.
    encrypted = (
        "select count(*) from pg_stat_replication join pg_stat_ssl using (pid)"
        " where ssl and version = 'TLSv1.3'"
    )
    assert sql(real_cluster, ns, primary, encrypted) == "2"

    # The primary pod goes: the synchronous standby is promoted and the status follows it.
    # (Until Patroni has named a synchronous standby, no replica is known to hold every
    # commit, and Patroni rightly promotes none: wait for it, as a user's cluster would be.)
    wait_for(
        lambda: "sync_standby" in roles(client, ns, "trio").values(),
        what="a synchronous standby",
        timeout=90,
    )
    standby = next(n for n, r in roles(client, ns, "trio").items() if r == "sync_standby")
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
    assert promoted == standby
    wait_for(
        lambda: get_pgc(client, "trio", ns).get("status", {}).get("primaryPod") == promoted,
        what=f"status.primaryPod to follow the promotion to {promoted}",
        timeout=60,
    )
    # The operator tells the user what happened, in status and an Event.
    failover = wait_for(
        lambda: status_of(client, ns, "trio").get("lastFailover"),
        what="status.lastFailover",
        timeout=60,
    )
    assert (failover["fromPod"], failover["toPod"]) == (primary, promoted)
    assert "Failover" in event_reasons(client, ns)
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


def test_a_final_backup_that_cannot_be_taken_says_why_and_can_be_skipped(
    real_cluster: LocalCluster, client: Client, ns: str
) -> None:
    # An image no node has and no registry serves: the instance stays in ErrImagePull/
    # ImagePullBackOff. The final backup's pod runs the operator's own image, so it starts,
    # and finds no primary to back up from.
    create_cluster(
        client,
        ns,
        "stuck",
        replicas=1,
        image="localhost/stateward/not-built:1",
        backup=local_repository(client, ns, f"/{ns}/stuck"),
        deletionPolicy={"finalBackup": True},
    )
    wait_for(
        lambda: (
            "stateward.io/finalizer"
            in (get_pgc(client, "stuck", ns)["metadata"].get("finalizers") or [])
        ),
        what="the finalizer",
    )
    # The instance itself cannot start either: status says which image and what to do.
    degraded = wait_for(
        lambda: next(
            (
                c
                for c in get_pgc(client, "stuck", ns).get("status", {}).get("conditions", [])
                if c["type"] == "Degraded" and c["reason"] == "ImageUnavailable"
            ),
            None,
        ),
        what="Degraded/ImageUnavailable",
        timeout=120,
    )
    assert "localhost/stateward/not-built:1" in degraded["message"]
    assert "spec.image" in degraded["message"]
    client.delete(PostgresClusterResource, "stuck", namespace=ns)
    stuck = wait_for(
        lambda: next(
            (
                c
                for c in get_pgc(client, "stuck", ns).get("status", {}).get("conditions", [])
                if c["type"] == "FinalBackup" and c["reason"] == "PodFailed"
            ),
            None,
        ),
        what="the FinalBackup condition to say why the backup cannot be taken",
        timeout=180,
    )
    assert "no running primary" in stuck["message"], stuck["message"]
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


# --- synchronous replication, switchover, restarts, scaling ---------------------------------


def _pooler_works_and_keeps_out_who_must_not_log_in(
    client: Client, ns: str, name: str, tmp_path: Path
) -> str:
    """The pooler of ``name`` (``spec.pooler``) ready: the application logs in through it
    with its own password over TLS verified for the Service's name, and PgBouncer reaches
    PostgreSQL over TLS; without TLS, with a wrong password, or as one of the roles that
    must never log in through it (even with their real passwords), nobody gets in. The CA
    file, for more clients."""
    wait_for(
        lambda: (status_of(client, ns, name).get("pooler") or {}).get("readyInstances") == 2,
        what="both PgBouncer pods ready in status.pooler",
        timeout=180,
    )
    assert status_of(client, ns, name)["pooler"]["host"] == f"{name}-pooler.{ns}.svc"
    ca_file = tmp_path / "ca.crt"
    ca_file.write_bytes(_secret_bytes(client, ns, f"{name}-app", "ca.crt"))

    def login(user: str, password: str, statement: str = "select 1", **extra: str) -> str:
        dsn = pooler_dsn(client, ns, name, str(ca_file), user=user, **extra)
        done = subprocess.run(
            ["psql", dsn, "-XtAc", statement],
            env={**os.environ, "PGPASSWORD": password},
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        return done.stdout.strip() if done.returncode == 0 else f"refused: {done.stderr.strip()}"

    app_password = _secret_bytes(client, ns, f"{name}-app", "password").decode()
    mine = "select current_user || ' ' || ssl from pg_stat_ssl where pid = pg_backend_pid()"
    answers = [""]

    def logged_in() -> bool:
        answers.append(login("app", app_password, mine))
        return answers[-1] == "app true"

    try:
        wait_for(
            logged_in,
            what="the app role through the pooler, TLS from PgBouncer to PostgreSQL",
            timeout=90,
        )
    except Timeout:
        logs = {
            pod.metadata.name: list(client.log(pod.metadata.name, namespace=ns, tail_lines=20))  # type: ignore[union-attr]
            for pod in client.list(
                Pod, namespace=ns, labels={"app.kubernetes.io/component": "pooler"}
            )
        }
        raise AssertionError(f"the pooler answered {answers[-1]!r}; its logs: {logs}") from None
    attempts = {
        "no TLS": login("app", app_password, sslmode="disable"),
        "a wrong password": login("app", "guessed"),
        "the superuser": login(
            "postgres", _secret_bytes(client, ns, f"{name}-superuser", "password").decode()
        ),
        "the replication role": login(
            "replicator", _secret_bytes(client, ns, f"{name}-replication", "password").decode()
        ),
        "PgBouncer's own role": login("stateward_pooler", ""),
    }
    let_in = {who: answer for who, answer in attempts.items() if not answer.startswith("refused")}
    assert not let_in, f"the pooler let in {let_in}"
    return str(ca_file)


def _secret_bytes(client: Client, ns: str, name: str, key: str) -> bytes:
    return base64.b64decode((client.get(Secret, name, namespace=ns).data or {})[key])


def test_a_switchover_on_request_moves_the_primary_without_losing_an_acknowledged_write(
    real_cluster: LocalCluster,
    client: Client,
    ns: str,
    real_operator: OperatorProcess,
    tmp_path: Path,
) -> None:
    create_cluster(client, ns, "sw", replicas=3, pooler={"instances": 2})
    ready(client, ns, "sw")
    ca_file = _pooler_works_and_keeps_out_who_must_not_log_in(client, ns, "sw", tmp_path)
    # Synchronous by default: Patroni names one synchronous standby, and status shows it.
    wait_for(
        lambda: sorted(roles(client, ns, "sw").values()) == ["primary", "replica", "sync_standby"],
        what="one primary, one synchronous standby and one replica in status.instances",
        timeout=90,
    )
    status = status_of(client, ns, "sw")
    old = status["primaryPod"]
    standby = next(n for n, r in roles(client, ns, "sw").items() if r == "sync_standby")
    assert standby in sql(real_cluster, ns, old, "show synchronous_standby_names")
    assert all(i.get("timeline", 0) >= 1 for i in status["instances"])

    pooled = PoolerWriter(client, ns, "sw", ca_file, table="wp")
    with Writer(client, ns, "sw") as writer, pooled:
        started = now_stamp()
        annotate(client, ns, "sw", "any")
        record = switchover_done(client, ns, "sw", started)
        wait_for(lambda: len(writer.acknowledged) >= 20, what="writes after the switchover")
        pooled.wait_acks(20)
    assert record["phase"] == "Succeeded", record
    assert record["fromPod"] == old and record["reason"] == "Requested"
    new = status_of(client, ns, "sw")["primaryPod"]
    assert new == record["target"] == standby  # the synchronous standby, which had every commit
    assert sql(real_cluster, ns, new, "select pg_is_in_recovery()") == "f"
    assert writer.missing_on(real_cluster, ns, new) == set()
    print(f"switchover write downtime: {writer.longest_gap():.2f}s")
    # Through the pooler too: nothing acknowledged is lost, and PgBouncer follows the
    # primary Service to the new primary with no new configuration.
    assert pooled.missing_on(real_cluster, ns, new) == set()
    new_address = client.get(Pod, new, namespace=ns).status.podIP  # type: ignore[union-attr]
    assert pooled.servers()[-1] == new_address, pooled.servers()
    print(
        f"switchover through the pooler: {len(pooled.failed)} writes failed, longest gap"
        f" {pooled.longest_gap():.2f}s"
    )
    # Paused around it, the pooler's clients saw the switchover as a wait, not an error.
    assert pooled.failed == [], f"{len(pooled.failed)} writes through the pooler failed"
    assert "poolerPaused" not in status_of(client, ns, "sw")["switchover"]
    assert {"SwitchoverStarted", "SwitchedOver"} <= set(event_reasons(client, ns))
    port = real_operator.probe_port
    assert metric(port, "stateward_events_total", 'reason="SwitchedOver"') >= 1

    # A request naming no instance is refused in status and an Event, and consumed.
    started = now_stamp()
    annotate(client, ns, "sw", "sw-9")
    refused = switchover_done(client, ns, "sw", started)
    assert refused["phase"] == "Failed" and "sw-9" in refused["message"]
    assert status_of(client, ns, "sw")["primaryPod"] == new

    # A parameter that needs a restart: replicas restart first, then the primary hands over
    # and restarts as a replica. No pod is recreated.
    uids = {p.metadata.name: p.metadata.uid for p in client.list(Pod, namespace=ns)}  # type: ignore[union-attr]
    client.patch(
        PostgresClusterResource,
        "sw",
        {"spec": {"postgresql": {"parameters": {"max_connections": "130"}}}},
        namespace=ns,
        patch_type=PatchType.MERGE,
    )
    for pod in ("sw-0", "sw-1", "sw-2"):
        wait_for(
            lambda pod=pod: sql(real_cluster, ns, pod, "show max_connections") == "130",
            what=f"{pod} to restart with max_connections 130",
            timeout=240,
            interval=2,
        )
    wait_for(
        lambda: "pendingRestart" not in status_of(client, ns, "sw"),
        what="status.pendingRestart to clear",
        timeout=60,
    )
    assert status_of(client, ns, "sw")["primaryPod"] != new  # the primary handed over first
    assert status_of(client, ns, "sw")["switchover"]["reason"] == "Restart"
    after = {p.metadata.name: p.metadata.uid for p in client.list(Pod, namespace=ns)}  # type: ignore[union-attr]
    assert {k: v for k, v in after.items() if k in uids} == uids
    ready(client, ns, "sw", timeout=120)


def test_a_rolling_update_switches_over_before_it_replaces_the_primary(
    real_cluster: LocalCluster, client: Client, ns: str
) -> None:
    create_cluster(client, ns, "roll", replicas=2)
    ready(client, ns, "roll")
    wait_for(
        lambda: sorted(roles(client, ns, "roll").values()) == ["primary", "sync_standby"],
        what="a synchronous standby",
        timeout=90,
    )
    old = status_of(client, ns, "roll")["primaryPod"]
    uids = {p.metadata.name: p.metadata.uid for p in client.list(Pod, namespace=ns)}  # type: ignore[union-attr]
    with Writer(client, ns, "roll") as writer:
        # A pod template change (as a minor version update is): every pod is replaced.
        client.patch(
            PostgresClusterResource,
            "roll",
            {"spec": {"resources": {"requests": {"memory": "64Mi"}}}},
            namespace=ns,
            patch_type=PatchType.MERGE,
        )

        def replaced() -> bool:
            pods = {p.metadata.name: p.metadata.uid for p in client.list(Pod, namespace=ns)}  # type: ignore[union-attr]
            return len(pods) == 2 and all(pods.get(n) not in (None, u) for n, u in uids.items())

        wait_for(replaced, what="both pods to be replaced", timeout=300, interval=1)
        ready(client, ns, "roll", timeout=180)
        done = len(writer.acknowledged)
        wait_for(lambda: len(writer.acknowledged) > done + 5, what="writes after the roll")
    status = status_of(client, ns, "roll")
    assert status["switchover"]["reason"] == "RollingUpdate"
    assert status["switchover"]["fromPod"] == old and status["primaryPod"] != old
    assert writer.missing_on(real_cluster, ns, status["primaryPod"]) == set()
    print(f"rolling update write downtime: {writer.longest_gap():.2f}s")


def test_scaling_3_to_5_to_2_keeps_the_data_and_never_removes_the_primary(
    real_cluster: LocalCluster, client: Client, ns: str
) -> None:
    # Five instances on three nodes: they share nodes only because placement allows it.
    create_cluster(
        client,
        ns,
        "sc",
        replicas=3,
        synchronous={"number": 4},
        placement={"antiAffinity": "Preferred"},
    )
    ready(client, ns, "sc")
    primary = status_of(client, ns, "sc")["primaryPod"]
    assert sql(real_cluster, ns, primary, "create table t (n int)") == "CREATE TABLE"
    assert sql(real_cluster, ns, primary, "insert into t select generate_series(1, 100)") == (
        "INSERT 0 100"
    )

    client.patch(
        PostgresClusterResource, "sc", {"spec": {"replicas": 5}}, namespace=ns,
        patch_type=PatchType.MERGE,
    )  # fmt: skip
    ready(client, ns, "sc", timeout=300)
    for pod in ("sc-3", "sc-4"):
        wait_for(
            lambda pod=pod: sql(real_cluster, ns, pod, "select count(*) from t") == "100",
            what=f"the rows on the new replica {pod}",
        )
    # Put the primary on the highest ordinal (every replica is synchronous: number 4).
    wait_for(
        lambda: roles(client, ns, "sc").get("sc-4") == "sync_standby",
        what="sc-4 to become a synchronous standby",
        timeout=90,
    )
    started = now_stamp()
    annotate(client, ns, "sc", "sc-4")
    assert switchover_done(client, ns, "sc", started)["phase"] == "Succeeded"
    assert status_of(client, ns, "sc")["primaryPod"] == "sc-4"

    # Scaling to 2 removes sc-2..sc-4: the primary moves to a survivor first.
    client.patch(
        PostgresClusterResource, "sc", {"spec": {"replicas": 2}}, namespace=ns,
        patch_type=PatchType.MERGE,
    )  # fmt: skip
    wait_for(
        lambda: (
            (s := status_of(client, ns, "sc")).get("phase") == "Ready"
            and s.get("readyReplicas") == 2
            and len(list(client.list(Pod, namespace=ns, labels={"stateward.io/cluster": "sc"})))
            == 2
        ),
        what="the cluster to be Ready with 2 instances",
        timeout=240,
        interval=1,
    )
    status = status_of(client, ns, "sc")
    assert status["primaryPod"] in ("sc-0", "sc-1")
    assert status["switchover"]["reason"] == "ScaleDown"
    for pod in ("sc-0", "sc-1"):
        assert sql(real_cluster, ns, pod, "select count(*) from t") == "100"
    assert sql(real_cluster, ns, status["primaryPod"], "insert into t values (101)") == (
        "INSERT 0 1"
    )


PROBE_PORTS = """\
import socket, sys, time
def reach(ip, port, seconds):
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection((ip, port), 2).close()
            return "open"
        except OSError as error:
            if time.monotonic() >= deadline:
                return f"closed ({type(error).__name__})"
ip = sys.argv[1]
print("5432:", reach(ip, 5432, float(sys.argv[2])))
print("8008:", reach(ip, 8008, float(sys.argv[3])))
"""
"""Connects to PostgreSQL, retrying for argv[2] seconds (a new pod is admitted by the
enforcer about a second after it has an address), then to Patroni's REST API for argv[3]."""


def guarded(cluster: LocalCluster, pod: Pod) -> bool:
    """Whether the enforcer's table on the pod's node drops what its policy does not admit."""
    node = next(n for n in cluster.real_nodes() if n.name == pod.spec.nodeName)  # type: ignore[union-attr]
    table = host.run(
        ["nsenter", f"--net={node.net_ns}", "nft", "list", "table", "inet", netpol.TABLE],
        check=False,
    )
    return f"ip daddr {pod.status.podIP} drop" in table  # type: ignore[union-attr]


@pytest.mark.timeout(600)
def test_the_network_policy_keeps_other_namespaces_and_non_members_out(
    real_cluster: LocalCluster, client: Client, ns: str
) -> None:
    # The local cluster enforces NetworkPolicies on its real nodes, as a policy-enforcing CNI
    # would (stateward_local.services.netpol, started by local up). The operator's default
    # policy: the namespace may reach PostgreSQL, only the members reach Patroni, other namespaces
    # nothing — and the cluster, its operator on the host and a replica that joins under the
    # policy still work.
    create_cluster(client, ns, "guarded", replicas=2)
    ready(client, ns, "guarded")
    pod = client.get(Pod, "guarded-0", namespace=ns)
    address = str(pod.status.podIP)  # type: ignore[union-attr]
    wait_for(lambda: guarded(real_cluster, pod), what="the enforcer to guard guarded-0", timeout=60)
    image = f"{v1alpha1.DEFAULT_IMAGE_REPOSITORY}:15"
    neighbour = run_in_pod(
        client, ns, "neighbour", image, ["python3", "-c", PROBE_PORTS, address, "60", "6"]
    )
    assert "5432: open" in neighbour, neighbour
    assert "8008: closed" in neighbour, f"a non-member reached Patroni: {neighbour}"
    with fresh_namespace(client) as elsewhere:
        outsider = run_in_pod(
            client, elsewhere, "outsider", image,
            ["python3", "-c", PROBE_PORTS, address, "15", "3"],
        )  # fmt: skip
    assert "5432: closed" in outsider, f"another namespace reached PostgreSQL: {outsider}"
    assert "8008: closed" in outsider, outsider
    # The members and the operator (on the host) are still let through: still Ready, and
    # the replica streams from the primary.
    ready(client, ns, "guarded")
    wait_for(
        lambda: (
            [
                i.get("state")
                for i in get_pgc(client, "guarded", ns)["status"].get("instances") or []
                if i.get("role") != "primary"
            ]
            == ["streaming"]
        ),
        what="the replica to stream under the policy",
        timeout=120,
    )
