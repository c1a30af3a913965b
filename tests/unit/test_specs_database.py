"""A Database's children, for each engine: names, owner references, labels, and the
settings that matter (pure builders)."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path
from typing import Any

import pytest

from stateward.api.v1alpha1 import Database, DatabasePhase, Engine
from stateward.specs import database as database_spec
from stateward.specs import meta
from stateward.specs.mariadb import servers as mysql_spec

pytestmark = pytest.mark.unit


def make_database(engine: str = "mariadb", **spec: Any) -> Database:
    versions = {"postgres": "17", "mysql": "8.4", "mariadb": "10.11"}
    return Database.model_validate(
        {
            "metadata": {"name": "shop", "namespace": "apps", "uid": "uid-9", "generation": 2},
            "spec": {
                "engine": engine,
                "version": versions[engine],
                "replicas": 3,
                "storage": {"size": "2Gi"},
                **spec,
            },
        }
    )


def owner_of(body: dict[str, Any]) -> dict[str, Any]:
    (owner,) = body["metadata"]["ownerReferences"]
    return owner


def test_a_postgres_database_is_a_postgrescluster_with_defaults_for_the_rest() -> None:
    child = database_spec.postgres_cluster(
        make_database("postgres", storage={"size": "5Gi", "storageClassName": "fast"})
    )
    assert child["kind"] == "PostgresCluster" and child["metadata"]["name"] == "shop"
    assert child["spec"] == {
        "version": "17",
        "replicas": 3,
        "storageSize": "5Gi",
        "storageClassName": "fast",
    }
    assert owner_of(child) == {
        "apiVersion": "stateward.io/v1alpha1",
        "kind": "Database",
        "name": "shop",
        "uid": "uid-9",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    assert child["metadata"]["labels"][meta.CLUSTER_LABEL] == "shop"


def test_only_postgres_databases_have_a_postgrescluster() -> None:
    with pytest.raises(ValueError, match="mariadb, not postgres"):
        database_spec.postgres_cluster(make_database("mariadb"))


@pytest.mark.parametrize(
    ("phase", "expected"),
    [
        ("Creating", DatabasePhase.PENDING),
        ("Ready", DatabasePhase.RUNNING),
        ("Updating", DatabasePhase.UPDATING),
        ("Failing", DatabasePhase.FAILED),
        ("Deleting", DatabasePhase.DELETING),
        (None, DatabasePhase.PENDING),
    ],
)
def test_a_postgresclusters_phase_as_the_database_reports_it(
    phase: str | None, expected: DatabasePhase
) -> None:
    assert database_spec.phase_of(phase) is expected


@pytest.mark.parametrize("engine", ["mysql", "mariadb"])
def test_servers_children_are_owned_labelled_and_named(engine: str) -> None:
    database = make_database(engine)
    children = mysql_spec.children(database)
    assert [(c["kind"], c["metadata"]["name"]) for c in children] == [
        ("ConfigMap", "shop-config"),
        ("Service", "shop-headless"),
        ("Service", "shop-primary"),
        ("Service", "shop-replicas"),
        ("PodDisruptionBudget", "shop"),
        ("NetworkPolicy", "shop"),
        ("StatefulSet", "shop"),
    ]
    for child in children:
        assert owner_of(child)["kind"] == "Database"
        labels = child["metadata"]["labels"]
        assert labels[meta.NAME_LABEL] == engine
        assert labels[meta.MANAGED_BY_LABEL] == "stateward"
        assert labels[meta.CLUSTER_LABEL] == "shop"


def test_services_route_by_the_role_the_operator_labels() -> None:
    headless, primary, replicas = mysql_spec.services(make_database())
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    assert primary["spec"]["selector"][meta.ROLE_LABEL] == meta.PRIMARY_ROLE
    assert replicas["spec"]["selector"][meta.ROLE_LABEL] == meta.REPLICA_ROLE
    # No Service carries MariaDB's clone port: new servers ask their peers directly.
    for service in (headless, primary, replicas):
        assert service["spec"]["ports"] == [{"name": "mysql", "port": 3306}]
    mysql_primary = mysql_spec.services(make_database("mysql"))[1]
    assert mysql_primary["spec"]["ports"] == [{"name": "mysql", "port": 3306}]


def test_the_statefulset_runs_the_engines_image_with_credentials_as_files_from_secrets() -> None:
    database = make_database("mariadb", storage={"size": "3Gi", "storageClassName": "local"})
    files = mysql_spec.config_files(database)
    sts = mysql_spec.statefulset(database, config_hash=mysql_spec.config_hash(files))
    spec = sts["spec"]
    assert spec["replicas"] == 3 and spec["updateStrategy"] == {"type": "OnDelete"}
    assert spec["selector"]["matchLabels"] == mysql_spec.selector_labels(database)
    (claim,) = spec["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "3Gi"
    assert claim["spec"]["storageClassName"] == "local"
    (container,) = spec["template"]["spec"]["containers"]
    assert container["image"] == "ghcr.io/stateward/mariadb-instance:10.11"
    # Passwords are files from the Secrets, never variables (which mariadbd and every child
    # would inherit) nor values in the pod spec.
    for variable in container["env"]:
        assert "PASSWORD" not in variable["name"] and "valueFrom" not in variable, variable
    volumes = {v["name"]: v for v in spec["template"]["spec"]["volumes"]}
    projected = {
        (source["secret"]["name"], item["key"], item["path"])
        for source in volumes["credentials"]["projected"]["sources"]
        for item in source["secret"]["items"]
    }
    assert projected == {
        ("shop-credentials", "root-password", "root-password"),
        ("shop-credentials", "replication-password", "replication-password"),
        ("shop-app", "password", "app-password"),
    }
    assert volumes["credentials"]["projected"]["defaultMode"] == 0o440
    assert {"name": "credentials", "mountPath": mysql_spec.CREDENTIALS_DIR,
            "readOnly": True} in container["volumeMounts"]  # fmt: skip
    scripts = "".join(files.values())
    for path in projected:
        assert f"{mysql_spec.CREDENTIALS_DIR}/{path[2]}" in scripts, f"{path[2]} is never read"
    mysql = mysql_spec.statefulset(make_database("mysql"), config_hash="x")
    (official,) = mysql["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in official["env"]}
    assert env["MYSQL_ROOT_PASSWORD_FILE"] == f"{mysql_spec.CREDENTIALS_DIR}/root-password"
    assert env["MYSQL_PASSWORD_FILE"] == f"{mysql_spec.CREDENTIALS_DIR}/app-password"
    assert "MYSQL_ROOT_PASSWORD" not in env and "MYSQL_PASSWORD" not in env
    annotations = spec["template"]["metadata"]["annotations"]
    assert annotations[meta.CONFIG_HASH_ANNOTATION] == mysql_spec.config_hash(files)
    assert spec["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def test_every_server_starts_read_only_with_gtids_and_binary_logs() -> None:
    mariadb = mysql_spec.config_files(make_database("mariadb"))["my.cnf"]
    mysql = mysql_spec.config_files(make_database("mysql"))["my.cnf"]
    for text in (mariadb, mysql):
        assert "read-only = ON" in text and "log-bin" in text and "binlog-format = ROW" in text
    assert "gtid-strict-mode = ON" in mariadb and "rpl-semi-sync-slave-enabled = ON" in mariadb
    # Only the primary waits for acknowledgements; the operator turns that on there.
    assert "rpl-semi-sync-master-enabled = OFF" in mariadb
    assert "gtid-mode = ON" in mysql and "super-read-only = ON" in mysql


def test_a_configuration_change_changes_the_hash() -> None:
    files = mysql_spec.config_files(make_database())
    changed = {**files, "my.cnf": files["my.cnf"] + "max-connections = 300\n"}
    assert mysql_spec.config_hash(files) != mysql_spec.config_hash(changed)


def decoded(secret: dict[str, Any]) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}


def test_credentials_and_the_application_secret() -> None:
    database = make_database("mariadb")
    credentials = decoded(
        mysql_spec.credentials_secret(database, root_password="r00t", replication_password="rep")
    )
    assert credentials["root-password"] == "r00t"
    assert credentials["replication-password"] == "rep"
    app = decoded(mysql_spec.app_secret(database, password="pw"))
    assert app["host"] == "shop-primary.apps.svc" and app["port"] == "3306"
    assert app["uri"] == "mariadb://app:pw@shop-primary.apps.svc:3306/app"
    assert decoded(mysql_spec.app_secret(make_database("mysql"), password="pw"))["uri"].startswith(
        "mysql://"
    )
    with pytest.raises(ValueError, match="empty password"):
        mysql_spec.app_secret(database, password="")


def test_default_images_per_engine() -> None:
    assert make_database("postgres").image == "ghcr.io/stateward/postgres-instance:17"
    assert make_database("mysql").image == "docker.io/library/mysql:8.4"
    assert make_database("mariadb").image == "ghcr.io/stateward/mariadb-instance:10.11"
    assert make_database("mariadb").spec.engine is Engine.MARIADB


def _mariadb_pod(database: Database) -> dict[str, Any]:
    statefulset = mysql_spec.statefulset(database, config_hash="h")
    return statefulset["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def test_a_mariadb_server_takes_tcp_connections_over_tls_13_only() -> None:
    config = mysql_spec.config_files(make_database())["my.cnf"]
    for line in (
        "ssl-ca = /etc/stateward/tls/client-ca.crt",
        "ssl-cert = /etc/stateward/tls/tls.crt",
        "ssl-key = /etc/stateward/tls/tls.key",
        "tls-version = TLSv1.3",
        "require-secure-transport = ON",
    ):
        assert line in config.splitlines()


def test_mariadb_servers_mount_their_certificates_but_not_the_operators_key() -> None:
    pod = _mariadb_pod(make_database())
    (volume,) = [v for v in pod["volumes"] if v["name"] == "tls"]
    assert volume["secret"]["secretName"] == "shop-tls"
    assert volume["secret"]["defaultMode"] == 0o440  # the mysql group (fsGroup) reads them
    paths = {item["path"] for item in volume["secret"]["items"]}
    assert paths == {
        "tls.crt", "tls.key", "ca.crt", "client-ca.crt", "replication.crt", "replication.key"
    }  # fmt: skip
    mounts = pod["containers"][0]["volumeMounts"]
    assert {"name": "tls", "mountPath": "/etc/stateward/tls", "readOnly": True} in mounts


def test_a_mysql_database_mounts_no_certificates_yet() -> None:
    pod = _mariadb_pod(make_database("mysql", version="8.4"))
    assert not [v for v in pod["volumes"] if v["name"] == "tls"]


def test_mariadb_root_logs_in_on_the_socket_only_and_the_network_roles_need_certificates() -> None:
    files = mysql_spec.config_files(make_database())
    users = files["users.sql"].splitlines()
    assert users[0] == "SET sql_log_bin = 0;"
    assert "DROP USER IF EXISTS 'root'@'%';" in users
    assert "CREATE USER IF NOT EXISTS 'stateward'@'%' REQUIRE SUBJECT '/CN=stateward';" in users
    assert "ALTER USER 'replicator'@'%' REQUIRE SUBJECT '/CN=replicator';" in users
    entrypoint = files["entrypoint.sh"]
    assert "'root'@'%'" not in entrypoint
    assert "--init-file=/etc/stateward/users.sql" in entrypoint


def test_the_mariadb_clone_stream_is_mutual_tls_and_served_by_the_primary_only() -> None:
    files = mysql_spec.config_files(make_database())
    entrypoint, serve = files["entrypoint.sh"], files["serve-clone.sh"]
    assert 'socat -t 60 "OPENSSL-LISTEN:${CLONE_PORT},reuseaddr,fork,${server_tls}"' in entrypoint
    assert "cafile=$tls/ca.crt,verify=1" in entrypoint
    assert "commonname=${PRIMARY_NAME}" in entrypoint
    assert "TCP-LISTEN" not in entrypoint and "/dev/tcp" not in entrypoint
    assert "SELECT @@read_only" in serve
    assert '[ "$request" = copy ] && [ "$read_only" = 0 ] || exit 1' in serve
    # Only "no primary answers" initializes; a primary whose copy fails is retried.
    assert '[ -n "$found" ] || return 1' in entrypoint
    assert 'fail "no copy came from ${found}"' in entrypoint
    env = {e["name"]: e.get("value") for e in _mariadb_pod(make_database())["containers"][0]["env"]}
    assert env["PEERS_HOST"] == "shop-headless.apps.svc.cluster.local"
    assert env["PRIMARY_NAME"] == "shop-primary.apps.svc"


def test_every_server_needs_a_node_of_its_own() -> None:
    # Required, not preferred: a server re-made while its node is away (a frozen or cut-off
    # node) waits for it instead of joining another server's node, where one node fault
    # would later take two servers — the primary and a replica holding its acknowledged
    # commits.
    for engine in ("mariadb", "mysql"):
        database = make_database(engine)
        sts = mysql_spec.statefulset(database, config_hash="x")
        affinity = sts["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
        assert "preferredDuringSchedulingIgnoredDuringExecution" not in affinity
        assert affinity["requiredDuringSchedulingIgnoredDuringExecution"] == [
            {
                "labelSelector": {"matchLabels": mysql_spec.selector_labels(database)},
                "topologyKey": "kubernetes.io/hostname",
            }
        ]


def test_each_mariadb_server_serves_metrics_as_a_monitoring_account_of_its_own() -> None:
    database = make_database()
    container = _mariadb_pod(database)["containers"][0]
    assert {"name": "metrics", "containerPort": 9104} in container["ports"]
    assert {"name": "METRICS_PORT", "value": "9104"} in container["env"]
    entrypoint = mysql_spec.config_files(database)["entrypoint.sh"]
    assert "serve_metrics &" in entrypoint
    # The exporter's account: this server's own (out of the binary log, so a replica's is
    # never overwritten by the primary's), monitoring privileges only, a new random password
    # at every start in a file only the container's user reads; never root.
    account = "'stateward_exporter'@'localhost'"
    assert f"GRANT PROCESS, REPLICATION CLIENT, SLAVE MONITOR ON *.* TO {account};" in entrypoint
    block = entrypoint[entrypoint.index("serve_metrics() {") : entrypoint.index("start_local() {")]
    assert "SET sql_log_bin = 0;" in block and "/dev/urandom" in block and "umask 077" in block
    assert "user=stateward_exporter" in block and "user=root" not in block.split("SQL\n")[-1]
    assert "GRANT ALL" not in block and "SUPER" not in block
    assert 'prometheus-mysqld-exporter --config.my-cnf="$cnf"' in block
    assert '--web.listen-address=":${METRICS_PORT}"' in block


def test_the_metrics_port_is_open_to_the_scrapers_the_policy_names() -> None:
    (policy,) = mysql_spec.network_policy(make_database(), "stateward-system")
    rules = policy["spec"]["ingress"]
    scraped = [r for r in rules if {"protocol": "TCP", "port": 9104} in r.get("ports", [])]
    assert scraped == [{"from": [{"namespaceSelector": {}}],
                        "ports": [{"protocol": "TCP", "port": 9104}]}]  # fmt: skip
    nobody = make_database(networkPolicy={"metrics": []})
    (closed,) = mysql_spec.network_policy(nobody, "stateward-system")
    assert not [r for r in closed["spec"]["ingress"] if
                {"protocol": "TCP", "port": 9104} in r.get("ports", [])]  # fmt: skip
    # MySQL servers serve no metrics yet: no port opened for them.
    (mysql,) = mysql_spec.network_policy(make_database("mysql", version="8.4"), "x")
    assert "9104" not in str(mysql)


# --- a Database that has data never gets an empty server beside it -------------------------------


def test_the_has_data_mark_is_set_once_there_was_a_primary_and_rolls_no_server() -> None:
    database = make_database()
    files = mysql_spec.config_files(database)
    fresh = mysql_spec.config_map(database, files)
    marked = mysql_spec.config_map(database, files, has_data=True)
    assert mysql_spec.HAS_DATA_KEY not in fresh["data"]
    assert marked["data"][mysql_spec.HAS_DATA_KEY] == "true"
    assert not mysql_spec.has_data_marked(fresh) and mysql_spec.has_data_marked(marked)
    assert not mysql_spec.has_data_marked(None)
    # The mark is not configuration: the servers' template (and its hash) stays the same.
    before = mysql_spec.children(database)[-1]
    after = mysql_spec.children(database, has_data=True)[-1]
    assert before["kind"] == "StatefulSet" and before == after
    assert mysql_spec.children(database, has_data=True)[0] == marked
    # MySQL servers never clone (the official image initializes): no mark for them.
    mysql = make_database("mysql")
    plain = mysql_spec.config_map(mysql, mysql_spec.config_files(mysql), has_data=True)
    assert mysql_spec.HAS_DATA_KEY not in plain["data"]


def _fill(tmp_path: Path, *, marked: bool, primary_after: int | None) -> tuple[str, str]:
    """Run the entrypoint's ``fill`` with stand-ins for what it calls: ``clone`` finds a
    primary at its ``primary_after``-th call (never, when None), ``initialize`` and ``sleep``
    only say they ran. Returns what ran, and what was logged."""
    entrypoint = mysql_spec.config_files(make_database())["entrypoint.sh"]
    start = entrypoint.index("fill() {")
    function = entrypoint[start : entrypoint.index("\n}\n", start) + 3]
    mark = tmp_path / "has-data"
    if marked:
        mark.write_text("true")
    calls = tmp_path / "calls"
    stubs = f"""
set -euo pipefail
has_data_mark={mark}
CLONE_PORT=3307
tries=0
clone() {{
  tries=$((tries + 1))
  if [ "{primary_after or 0}" != 0 ] && [ "$tries" -ge "{primary_after or 0}" ]; then
    echo cloned >> {calls}; return 0
  fi
  echo no-primary >> {calls}; return 1
}}
initialize() {{ echo initialized >> {calls}; }}
sleep() {{
  echo slept >> {calls}
  [ "$(wc -l < {calls})" -lt 60 ] || exit 3  # a server that would wait forever
}}
"""
    result = subprocess.run(
        ["bash", "-c", stubs + function + "fill\n"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    ran = calls.read_text().split() if calls.exists() else []
    return f"{result.returncode}:{','.join(ran)}", result.stderr


def test_a_new_database_with_no_primary_yet_initializes_its_first_servers(tmp_path: Path) -> None:
    ran, logged = _fill(tmp_path, marked=False, primary_after=None)
    assert ran == "0:no-primary,initialized"
    assert logged == ""


def test_a_new_server_of_a_database_with_a_primary_copies_its_data(tmp_path: Path) -> None:
    assert _fill(tmp_path, marked=True, primary_after=1)[0] == "0:cloned"


def test_a_server_of_a_database_with_data_waits_for_its_primary_and_never_starts_empty(
    tmp_path: Path,
) -> None:
    # The primary unreachable for a while (a partition, a policy not yet admitting the new
    # pod, a failover in progress): asked again until it answers, then copied.
    ran, logged = _fill(tmp_path, marked=True, primary_after=4)
    assert ran == "0:no-primary,slept,no-primary,slept,no-primary,slept,cloned"
    assert "initialized" not in ran
    assert "the Database has data and no primary answered on port 3307 after 0 s" in logged
    # Never answering: it keeps waiting (the stand-in for sleep ends the run) and never
    # initializes.
    never = tmp_path / "never"
    never.mkdir()
    ran, logged = _fill(never, marked=True, primary_after=None)
    assert ran.startswith("3:no-primary,slept") and "initialized" not in ran
    # Said once a minute, not at every try.
    assert logged.count("no primary answered") == 3  # after 0, 60 and 120 s
