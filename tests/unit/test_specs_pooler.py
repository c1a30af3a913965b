"""The PgBouncer pooler's objects (``spec.pooler``): what PgBouncer is told, who reaches it,
what its pods may see, and that nothing exists without it."""

from __future__ import annotations

import configparser
from typing import Any

import pytest

from stateward.api import v1alpha1
from stateward.instance import pooler as pooler_instance
from stateward.specs import postgres as postgres_specs
from stateward.specs import tls
from stateward.specs.postgres import config, pooler
from tests.support import clusters

pytestmark = pytest.mark.unit


def ini(cluster: v1alpha1.PostgresCluster) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(pooler.pgbouncer_ini(cluster))
    return parser


def children(cluster: v1alpha1.PostgresCluster) -> list[dict[str, Any]]:
    return postgres_specs.children(
        cluster, patroni_config=config.patroni_config(cluster), operator_namespace="ops"
    )


def named(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def test_no_pooler_object_exists_without_spec_pooler() -> None:
    cluster = clusters.make_cluster()
    assert pooler.children(cluster) == []
    assert not [o for o in children(cluster) if o["metadata"]["name"] == "demo-pooler"]
    with pytest.raises(ValueError, match=r"no spec\.pooler"):
        pooler.pgbouncer_ini(cluster)


def test_the_defaults_are_two_pods_transaction_pooling_and_the_17_image() -> None:
    cluster = clusters.make_cluster(pooler={})
    objects = children(cluster)
    kinds = [o["kind"] for o in objects if o["metadata"]["name"] == "demo-pooler"]
    assert kinds == ["ConfigMap", "Service", "NetworkPolicy", "Deployment"]
    assert set(kinds) == set(pooler.KINDS)
    deployment = named(objects, "Deployment", "demo-pooler")
    assert deployment["spec"]["replicas"] == 2
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "ghcr.io/stateward/postgres-instance:17"
    assert container["command"] == [
        "stateward-instance", "pooler", "--config", "/etc/stateward/pooler/pgbouncer.ini",
    ]  # fmt: skip
    settings = ini(cluster)["pgbouncer"]
    assert settings["pool_mode"] == "transaction"
    assert settings["default_pool_size"] == "20"
    assert settings["max_client_conn"] == "1000"


def test_settings_and_image_come_from_the_spec() -> None:
    cluster = clusters.make_cluster(
        pooler={
            "instances": 3,
            "poolMode": "session",
            "defaultPoolSize": 7,
            "maxClientConnections": 50,
            "image": "registry.example/pgbouncer:1",
        }
    )
    settings = ini(cluster)["pgbouncer"]
    assert (settings["pool_mode"], settings["default_pool_size"]) == ("session", "7")
    assert settings["max_client_conn"] == "50"
    deployment = pooler.deployment(cluster)
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == (
        "registry.example/pgbouncer:1"
    )


def test_pgbouncer_points_at_the_primary_service_and_verifies_its_name() -> None:
    parser = ini(clusters.make_cluster(pooler={}))
    assert parser["databases"]["*"] == "host=demo-primary.db.svc port=5432"
    settings = parser["pgbouncer"]
    assert settings["server_tls_sslmode"] == "verify-full"
    assert settings["server_tls_ca_file"] == "/etc/stateward/tls/ca.crt"
    # Its own role proves itself with its certificate: the role has no password.
    assert settings["server_tls_cert_file"] == "/etc/stateward/tls/pooler.crt"
    assert settings["server_tls_key_file"] == "/etc/stateward/tls/pooler.key"
    assert settings["server_tls_protocols"] == "tlsv1.3"
    assert int(settings["server_login_retry"]) <= 1, "a failover must not hold logins 15 s"


def test_clients_need_tls_and_scram_checked_against_postgresql() -> None:
    cluster = clusters.make_cluster(pooler={})
    settings = ini(cluster)["pgbouncer"]
    assert settings["client_tls_sslmode"] == "require"
    assert settings["client_tls_protocols"] == "tlsv1.3"
    assert settings["client_tls_cert_file"] == "/etc/stateward/tls/tls.crt"
    # Client certificates (the console's) from the cluster's CA alone, never a user's root.
    assert settings["client_tls_ca_file"] == "/etc/stateward/tls/client-ca.crt"
    assert settings["auth_type"] == "hba"
    assert settings["auth_hba_file"] == "/etc/stateward/pooler/pg_hba.conf"
    assert settings["auth_user"] == "stateward_pooler"
    assert settings["auth_query"] == "SELECT usename, passwd FROM stateward.pooler_lookup($1)"
    assert settings["auth_dbname"] == "postgres"
    assert settings["admin_users"] == "stateward_pooler_admin"
    assert settings["unix_socket_dir"] == ""
    data = pooler.config_map(cluster)["data"]
    hba = data["pg_hba.conf"].splitlines()
    # The console by certificate only; its user opens nothing else; applications by SCRAM.
    assert hba[0] == "hostssl pgbouncer stateward_pooler_admin 0.0.0.0/0 cert"
    assert "hostssl all stateward_pooler_admin 0.0.0.0/0 reject" in hba
    assert "hostssl pgbouncer all 0.0.0.0/0 reject" in hba
    assert hba[-2:] == [
        "hostssl all all 0.0.0.0/0 scram-sha-256",
        "hostssl all all ::/0 scram-sha-256",
    ]
    assert all(line.startswith("hostssl ") for line in hba)
    # The only user listed is the console's, with no password: applications are looked up.
    assert data["userlist.txt"] == '"stateward_pooler_admin" ""\n'


def test_no_secret_is_in_the_configuration() -> None:
    text = pooler.pgbouncer_ini(clusters.make_cluster(pooler={}))
    assert "password" not in text.lower().replace("passwd from", "")


def test_the_pods_see_only_their_own_certificates_never_the_superusers() -> None:
    deployment = pooler.deployment(clusters.make_cluster(pooler={}))
    pod = deployment["spec"]["template"]["spec"]
    [tls_volume] = [v for v in pod["volumes"] if v["name"] == "tls"]
    keys = {item["key"] for item in tls_volume["secret"]["items"]}
    assert keys == {"tls.crt", "tls.key", "ca.crt", "client-ca.crt", "pooler.crt", "pooler.key"}
    assert tls_volume["secret"]["secretName"] == "demo-tls"
    assert tls_volume["secret"]["defaultMode"] == 0o440
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["containers"][0]["name"] == pooler.CONTAINER


def test_the_pods_are_never_taken_for_instances() -> None:
    cluster = clusters.make_cluster(pooler={})
    objects = children(cluster)
    labels = pooler.deployment(cluster)["spec"]["template"]["metadata"]["labels"]
    for kind, name in (
        ("StatefulSet", "demo"),
        ("PodDisruptionBudget", "demo"),
        ("Service", "demo-primary"),
        ("Service", "demo-headless"),
    ):
        body = named(objects, kind, name)
        selector = body["spec"].get("selector") or {}
        selector = selector.get("matchLabels", selector)
        assert not selector.items() <= labels.items(), f"{kind} {name} selects pooler pods"
    service = named(objects, "Service", "demo-pooler")
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"] == [
        {"name": "pgbouncer", "port": 5432, "targetPort": "pgbouncer"}
    ]


def test_a_changed_configuration_rolls_the_pods_a_new_one_ready_first() -> None:
    one = pooler.deployment(clusters.make_cluster(pooler={"defaultPoolSize": 10}))
    two = pooler.deployment(clusters.make_cluster(pooler={"defaultPoolSize": 11}))
    same = pooler.deployment(clusters.make_cluster(pooler={"defaultPoolSize": 10}))

    def digest(d: dict[str, Any]) -> str:
        return str(d["spec"]["template"]["metadata"]["annotations"]["stateward.io/config-hash"])

    assert digest(one) != digest(two) and digest(one) == digest(same)
    assert one["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}


def test_the_pooler_is_open_to_the_clients_and_postgresql_to_the_pooler() -> None:
    cluster = clusters.make_cluster(pooler={})
    objects = children(cluster)
    policy = named(objects, "NetworkPolicy", "demo-pooler")
    operator = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}}}
    assert policy["spec"]["ingress"] == [
        {"from": [{"podSelector": {}}], "ports": [{"protocol": "TCP", "port": 6432}]},
        {"from": [operator], "ports": [{"protocol": "TCP", "port": 6432}]},
    ]
    instances = named(objects, "NetworkPolicy", "demo")
    pooler_rule = {
        "from": [{"podSelector": {"matchLabels": pooler.selector_labels(cluster)}}],
        "ports": [{"protocol": "TCP", "port": 5432}],
    }
    assert pooler_rule in instances["spec"]["ingress"]
    without = named(children(clusters.make_cluster()), "NetworkPolicy", "demo")
    assert pooler_rule not in without["spec"]["ingress"]


def test_clients_restricted_to_nobody_reach_no_pooler_but_the_pooler_reaches_postgresql() -> None:
    cluster = clusters.make_cluster(pooler={}, networkPolicy={"clients": []})
    policy = pooler.network_policy(cluster, "ops")
    # Nobody but the operator's namespace, for the console.
    assert [rule["from"] for rule in policy["spec"]["ingress"]] == [
        [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}}}]
    ]
    instances = named(children(cluster), "NetworkPolicy", "demo")
    assert any(
        rule["from"] == [{"podSelector": {"matchLabels": pooler.selector_labels(cluster)}}]
        for rule in instances["spec"]["ingress"]
    )


def test_no_network_policy_for_the_pooler_when_policies_are_off() -> None:
    cluster = clusters.make_cluster(pooler={}, networkPolicy={"enabled": False})
    assert [o["kind"] for o in pooler.children(cluster)] == ["ConfigMap", "Service", "Deployment"]


def test_the_serving_certificate_covers_the_pooler_service_with_or_without_a_pooler() -> None:
    for cluster in (clusters.make_cluster(), clusters.make_cluster(pooler={})):
        names = tls.server_names(cluster)
        assert {"demo-pooler", "demo-pooler.db.svc", "demo-pooler.db.svc.cluster.local"} <= set(
            names
        )
    # Adding a pooler reissues nothing: the names are the same.
    assert tls.server_names(clusters.make_cluster()) == tls.server_names(
        clusters.make_cluster(pooler={})
    )


def test_a_users_serving_certificate_must_cover_the_pooler_once_there_is_one() -> None:
    assert tls.required_names(clusters.make_cluster()) == ("demo-primary.db.svc",)
    assert tls.required_names(clusters.make_cluster(pooler={})) == (
        "demo-primary.db.svc",
        "demo-pooler.db.svc",
    )


def test_pgbouncers_role_gets_a_client_certificate_of_the_cluster_ca() -> None:
    assert tls.CLIENTS[pooler_instance.CLIENT_STEM] == pooler_instance.ROLE


@pytest.mark.parametrize(
    ("field", "value"),
    [("instances", 0), ("instances", 11), ("defaultPoolSize", 0), ("maxClientConnections", 0),
     ("poolMode", "statement")],
)  # fmt: skip
def test_out_of_range_settings_are_refused_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        clusters.make_cluster(pooler={field: value})
