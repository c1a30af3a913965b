"""The Patroni configuration: timing, parameters, DCS settings, and no secret in the file."""

from __future__ import annotations

import os
from typing import Any

import pytest
import yaml

from stateward.api.v1alpha1 import PostgresCluster
from stateward.instance import patroni
from stateward.specs.postgres import config
from tests.support import clusters
from tests.support.clusters import make_cluster

pytestmark = pytest.mark.unit

LABELS = {"app.kubernetes.io/name": "postgresql", "stateward.io/cluster": "demo"}


def rendered(cluster: PostgresCluster) -> dict[str, Any]:
    document = yaml.safe_load(config.render(cluster, labels=LABELS))
    assert isinstance(document, dict)
    return document


def test_timing_respects_patroni_rules() -> None:
    dcs = rendered(make_cluster())["bootstrap"]["dcs"]
    assert dcs["ttl"] >= 20
    assert dcs["loop_wait"] + 2 * dcs["retry_timeout"] <= dcs["ttl"]
    assert dcs["loop_wait"] >= 1
    assert (dcs["ttl"], dcs["loop_wait"], dcs["retry_timeout"]) == (
        patroni.TTL,
        patroni.LOOP_WAIT,
        patroni.RETRY_TIMEOUT,
    )
    assert dcs["primary_start_timeout"] == patroni.PRIMARY_START_TIMEOUT
    assert dcs["primary_start_timeout"] < 300


def test_scope_is_the_cluster_name() -> None:
    assert rendered(make_cluster())["scope"] == "demo"


def test_kubernetes_dcs_uses_configmaps_and_our_labels() -> None:
    kubernetes = rendered(make_cluster())["kubernetes"]
    assert kubernetes == {
        "use_endpoints": False,
        "scope_label": "stateward.io/cluster",
        "labels": LABELS,
        "role_label": "stateward.io/role",
        "leader_label_value": "primary",
        "follower_label_value": "replica",
        "standby_leader_label_value": "primary",
    }


def test_scope_label_value_matches_the_labels() -> None:
    # Patroni adds {scope_label: scope} to its selector: it must agree with the pod labels.
    document = rendered(make_cluster())
    assert (
        document["kubernetes"]["labels"][document["kubernetes"]["scope_label"]]
        == (document["scope"])
    )


def test_restapi_and_postgresql_listen_on_all_addresses() -> None:
    document = rendered(make_cluster())
    assert document["restapi"]["listen"] == "0.0.0.0:8008"
    postgresql = document["postgresql"]
    assert postgresql["listen"] == "0.0.0.0:5432"
    assert postgresql["data_dir"] == "/var/lib/postgresql/data/pgdata"
    assert postgresql["pgpass"].startswith("/tmp/")
    assert postgresql["use_unix_socket"] is True


@pytest.mark.parametrize("version", ["13", "15.4", "16", "18"])
def test_bin_dir_follows_the_major_version(version: str) -> None:
    major = version.split(".")[0]
    postgresql = rendered(make_cluster(version=version))["postgresql"]
    assert postgresql["bin_dir"] == f"/usr/lib/postgresql/{major}/bin"


def test_no_credentials_in_the_file() -> None:
    document = rendered(make_cluster())
    # Only how to connect: usernames and passwords come from the environment.
    tls = "/etc/stateward/tls"
    assert document["postgresql"]["authentication"] == {
        user: {
            "sslmode": "verify-ca",
            "sslrootcert": f"{tls}/ca.crt",
            "sslcert": f"{tls}/{user}.crt",
            "sslkey": f"{tls}/{user}.key",
        }
        for user in ("superuser", "replication")
    }
    assert "connect_address" not in document["postgresql"]
    assert "connect_address" not in document["restapi"]
    assert not any(key in {"password", "username"} for key in keys(document))


def keys(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [*node, *(key for value in node.values() for key in keys(value))]
    if isinstance(node, list):
        return [key for value in node for key in keys(value)]
    return []


def test_pg_hba_requires_tls_and_scram_over_the_network() -> None:
    pg_hba = rendered(make_cluster())["postgresql"]["pg_hba"]
    assert pg_hba == [
        "local all all trust",
        "hostnossl all all all reject",
        "hostssl all postgres all cert",
        "hostssl replication replicator all cert",
        "hostssl all replicator all cert",
        "hostssl all stateward_pooler all cert",
        "hostssl replication all all reject",
        "hostssl all all all scram-sha-256",
    ]
    # The first rule that matches decides: a connection without TLS meets the reject first.
    network = [rule for rule in pg_hba if not rule.startswith("local")]
    assert network[0].startswith("hostnossl") and network[0].endswith("reject")
    assert all(rule.startswith("hostssl") for rule in network[1:])
    # The superuser, the replication role and PgBouncer's own role (which has none) never
    # get to use a password over the network.
    password_rule = network.index("hostssl all all all scram-sha-256")
    for user in ("postgres", "replicator", "stateward_pooler"):
        assert any(
            f" {user} " in rule and rule.endswith(" cert") for rule in network[:password_rule]
        )


def first_match(pg_hba: list[str], *, tls: bool, database: str, user: str) -> str:
    """The method of the first rule a network connection meets, as PostgreSQL picks it."""
    for rule in pg_hba:
        kind, rule_database, rule_user, *_, method = rule.split()
        if kind == "local" or kind == ("hostnossl" if tls else "hostssl"):
            continue
        if rule_database not in ("all", database) or rule_user not in ("all", user):
            continue
        return method
    return "reject (no rule)"


ROLES = ("postgres", "replicator", "stateward_pooler", "app")


def test_plaintext_clients_are_the_applications_alone_and_only_when_allowed() -> None:
    default = rendered(make_cluster())["postgresql"]["pg_hba"]
    allowed = rendered(make_cluster(tls={"allowPlaintextClients": True}))["postgresql"]["pg_hba"]
    for user in ROLES:
        for database in ("app", "replication"):
            # Over TLS nothing changes.
            assert first_match(allowed, tls=True, database=database, user=user) == first_match(
                default, tls=True, database=database, user=user
            )
            # Without TLS, by default nobody.
            assert first_match(default, tls=False, database=database, user=user) == "reject"
    # Allowed: the application by password; never a role that logs in by certificate, and
    # nobody streams WAL without TLS.
    assert first_match(allowed, tls=False, database="app", user="app") == "scram-sha-256"
    for user in ("postgres", "replicator", "stateward_pooler"):
        assert first_match(allowed, tls=False, database="app", user=user) == "reject"
    for user in ROLES:
        assert first_match(allowed, tls=False, database="replication", user=user) == "reject"
    # The instances roll to the new rules (pg_hba is local configuration).
    assert config.config_hash(make_cluster()) != config.config_hash(
        make_cluster(tls={"allowPlaintextClients": True})
    )


def test_postgresql_and_the_rest_api_serve_the_clusters_certificate() -> None:
    document = rendered(make_cluster())
    parameters = document["bootstrap"]["dcs"]["postgresql"]["parameters"]
    assert parameters["ssl"] == "on"
    assert parameters["ssl_min_protocol_version"] == "TLSv1.3"
    mounted = {"/etc/stateward/tls/tls.crt", "/etc/stateward/tls/tls.key"}
    assert {parameters["ssl_cert_file"], parameters["ssl_key_file"]} == mounted
    assert {document["restapi"]["certfile"], document["restapi"]["keyfile"]} == mounted
    # Members call each other by IP: the chain is verified against the CA (a client
    # certificate plus insecure turns off only Patroni's hostname check), never skipped.
    assert document["ctl"] == {
        "insecure": True,
        "certfile": "/etc/stateward/tls/tls.crt",
        "keyfile": "/etc/stateward/tls/tls.key",
        "cacert": "/etc/stateward/tls/ca.crt",
    }


def test_a_user_cannot_turn_tls_off() -> None:
    cluster = make_cluster(
        postgresql={"parameters": {"work_mem": "8MB"}},
    )
    cluster.spec.postgresql.parameters["SSL"] = "off"  # past admission: an old object
    parameters = rendered(cluster)["bootstrap"]["dcs"]["postgresql"]["parameters"]
    assert parameters["ssl"] == "on" and "SSL" not in parameters


def test_rewind_and_slots() -> None:
    postgresql = rendered(make_cluster())["bootstrap"]["dcs"]["postgresql"]
    assert postgresql["use_pg_rewind"] is True
    assert postgresql["use_slots"] is True


def test_managed_parameters_without_user_parameters() -> None:
    parameters = rendered(make_cluster())["bootstrap"]["dcs"]["postgresql"]["parameters"]
    assert parameters == {
        # On in every cluster (no restart when backups are configured later); without a
        # repository WAL is discarded as it would be without archiving.
        "archive_command": "/bin/true",
        "archive_mode": "on",
        "hot_standby": "on",
        "max_replication_slots": "20",
        "max_wal_senders": "20",
        "password_encryption": "scram-sha-256",
        "ssl": "on",
        "ssl_ca_file": "/etc/stateward/tls/client-ca.crt",
        "ssl_cert_file": "/etc/stateward/tls/tls.crt",
        "ssl_key_file": "/etc/stateward/tls/tls.key",
        "ssl_min_protocol_version": "TLSv1.3",
        "unix_socket_directories": "/var/run/postgresql",
        "wal_keep_size": "128MB",
        "wal_level": "replica",
        "wal_log_hints": "on",
        "wal_receiver_status_interval": "1s",
        "wal_receiver_timeout": "5s",
        "wal_sender_timeout": "5s",
    }


def test_wal_is_archived_with_pgbackrest_when_there_is_a_repository() -> None:
    cluster = make_cluster(backup=clusters.BACKUP)
    parameters = rendered(cluster)["bootstrap"]["dcs"]["postgresql"]["parameters"]
    assert parameters["archive_mode"] == "on"
    assert parameters["archive_command"] == "pgbackrest --stanza=demo archive-push %p"


def test_the_operators_defaults_yield_to_the_users_parameters() -> None:
    cluster = make_cluster(postgresql={"parameters": {"WAL_SENDER_TIMEOUT": "30s"}})
    parameters = rendered(cluster)["bootstrap"]["dcs"]["postgresql"]["parameters"]
    assert parameters["WAL_SENDER_TIMEOUT"] == "30s"
    assert "wal_sender_timeout" not in parameters
    assert parameters["wal_receiver_timeout"] == "5s"
    assert all(isinstance(value, str) for value in parameters.values())


def test_user_parameters_are_merged_and_managed_ones_win() -> None:
    cluster = make_cluster(
        postgresql={
            "parameters": {
                "max_connections": "200",
                "work_mem": "16MB",
                "wal_level": "minimal",
                "hot_standby": "off",
                "password_encryption": "md5",
            }
        }
    )
    parameters = rendered(cluster)["bootstrap"]["dcs"]["postgresql"]["parameters"]
    assert parameters["max_connections"] == "200"
    assert parameters["work_mem"] == "16MB"
    for name, value in config.OPERATOR_PARAMETERS.items():
        assert parameters[name] == value
    assert list(parameters) == sorted(parameters)


@pytest.mark.parametrize("name", sorted(config.PATRONI_OWNED_PARAMETERS))
def test_parameters_patroni_owns_are_dropped(name: str) -> None:
    cluster = make_cluster(postgresql={"parameters": {name: "x", name.upper(): "y"}})
    merged = config.parameters(cluster)
    assert name not in merged
    assert name.upper() not in merged


def test_managed_parameters_win_whatever_the_case() -> None:
    cluster = make_cluster(
        postgresql={"parameters": {"WAL_LEVEL": "minimal", "Hot_Standby": "off"}}
    )
    merged = config.parameters(cluster)
    assert merged["wal_level"] == "replica"
    assert merged["hot_standby"] == "on"
    assert {name.lower() for name in merged} == set(merged)


def test_max_wal_senders_covers_every_possible_replica() -> None:
    assert int(config.OPERATOR_PARAMETERS["max_wal_senders"]) > 16
    assert (
        config.OPERATOR_PARAMETERS["max_wal_senders"]
        == (config.OPERATOR_PARAMETERS["max_replication_slots"])
    )
    one = config.parameters(make_cluster(replicas=1))
    many = config.parameters(make_cluster(replicas=16))
    assert one == many


def test_dynamic_configuration_is_the_bootstrap_dcs() -> None:
    cluster = make_cluster(postgresql={"parameters": {"work_mem": "8MB"}})
    assert rendered(cluster)["bootstrap"]["dcs"] == config.dynamic_configuration(cluster)


def test_initdb_enables_checksums() -> None:
    assert rendered(make_cluster())["bootstrap"]["initdb"] == [
        {"encoding": "UTF8"},
        "data-checksums",
    ]


def test_watchdog_is_off_as_a_string() -> None:
    # Unquoted, YAML would read "off" as a boolean.
    assert rendered(make_cluster())["watchdog"] == {"mode": "off"}


def test_render_is_deterministic() -> None:
    first = config.render(make_cluster(), labels=LABELS)
    second = config.render(make_cluster(), labels=dict(LABELS))
    assert first == second


def test_parameter_order_does_not_change_the_rendering() -> None:
    one = make_cluster(postgresql={"parameters": {"a_param": "1", "b_param": "2"}})
    other = make_cluster(postgresql={"parameters": {"b_param": "2", "a_param": "1"}})
    assert config.render(one, labels=LABELS) == config.render(other, labels=LABELS)


def test_rendering_is_the_same_with_or_without_libyaml() -> None:
    # The config hash rolls pods when it changes: it must not depend on whether this
    # machine's PyYAML has the C emitter.
    cluster = make_cluster()
    labels = {"stateward.io/cluster": cluster.name}
    fast = config.render(cluster, labels=labels)
    plain = yaml.safe_dump(
        config.configuration(cluster, labels=labels),
        sort_keys=False,
        default_flow_style=False,
    )
    assert fast == plain


def test_state_config_maps_are_the_ones_patroni_creates_in_config_map_mode() -> None:
    assert patroni.state_config_maps("orders") == {
        "orders-leader",
        "orders-config",
        "orders-failover",
        "orders-sync",
    }


def test_new_replicas_copy_the_primary_with_a_fast_checkpoint() -> None:
    # pg_basebackup's default spread checkpoint held a new replica back 95 s on an empty
    # database.
    document = config.configuration(make_cluster(), labels={})
    assert document["postgresql"]["basebackup"] == [{"checkpoint": "fast"}]


def test_a_restore_bootstraps_with_pgbackrest_and_keeps_its_recovery_settings() -> None:
    cluster = make_cluster(backup=clusters.BACKUP, bootstrap={"restore": {"cluster": "orders"}})
    bootstrap = rendered(cluster)["bootstrap"]
    assert bootstrap["method"] == "pgbackrest"
    assert bootstrap["pgbackrest"] == {
        "command": "stateward-instance restore --stanza orders --path /db/orders",
        "no_params": True,
        "keep_existing_recovery_conf": True,
    }
    # The hook still runs: the restored role gets this cluster's password.
    assert bootstrap["post_bootstrap"] == "stateward-instance post-bootstrap"
    assert "method" not in rendered(make_cluster())["bootstrap"]


def test_the_postgres_wrapper_execs_postgres_with_the_ack_timeout_first() -> None:
    script = patroni.postgres_wrapper("/usr/lib/postgresql/17/bin/postgres", ack_timeout_ms=750)
    assert script.startswith("#!/bin/sh\n")
    assert 'PGOPTIONS="-c tcp_user_timeout=750${PGOPTIONS:+ $PGOPTIONS}"' in script
    assert script.endswith('exec /usr/lib/postgresql/17/bin/postgres "$@"\n')
    assert "'/odd dir/postgres'" in patroni.postgres_wrapper("/odd dir/postgres"), "quoted"


def test_the_wrapper_replaces_only_postgres_among_patronis_binaries() -> None:
    document = {"postgresql": {"bin_dir": "/b", "bin_name": {"pg_ctl": "pg_ctl15"}}}
    wrapped = patroni.with_postgres_wrapper(document, "/tmp/w")
    assert wrapped["postgresql"] == {
        "bin_dir": "/b",
        "bin_name": {"pg_ctl": "pg_ctl15", "postgres": "/tmp/w"},
    }
    assert document["postgresql"]["bin_name"] == {"pg_ctl": "pg_ctl15"}, "a copy"
    # Patroni joins bin_dir and bin_name: an absolute name stands alone.
    assert os.path.join("/b", "/tmp/w") == "/tmp/w"
