"""Properties of every built object: children(), secrets, backups, determinism."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest

from stateward import pki
from stateward.api.v1alpha1 import PostgresCluster
from stateward.specs import meta, tls
from stateward.specs import postgres as postgres_specs
from stateward.specs.postgres import backup, config, secrets
from tests.support import clusters

pytestmark = pytest.mark.unit

SUPERUSER_PASSWORD = "superuser-pa55-Zq9"
REPLICATION_PASSWORD = "replication-pa55-Xk3"


def make_cluster(**spec: Any) -> PostgresCluster:
    return clusters.make_cluster(metadata={"generation": 4}, **spec)


FULL_SPEC: dict[str, Any] = {
    "backupSchedule": "*/30 * * * *",
    "backup": clusters.BACKUP,
    "storageClassName": "standard",
    "image": "registry.example/pg:16.4",
    "resources": {"requests": {"cpu": "250m"}, "limits": {"memory": "1Gi"}},
    "postgresql": {"parameters": {"max_connections": "50"}},
    "deletionPolicy": {"finalBackup": False, "persistentVolumeClaims": "Retain"},
}

HASHED = config.PatroniConfig(text="scope: demo\n", hash="h")

CLUSTERS = {"minimal": make_cluster(), "full": make_cluster(**FULL_SPEC)}


def built(cluster: PostgresCluster) -> list[dict[str, Any]]:
    return [
        *postgres_specs.children(cluster, patroni_config=config.patroni_config(cluster)),
        secrets.superuser_secret(cluster, password=SUPERUSER_PASSWORD),
        secrets.replication_secret(cluster, password=REPLICATION_PASSWORD),
        backup.final_backup_job(cluster),
    ]


def walk(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    yield path, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from walk(value, f"{path}[{index}]")


def kinds_and_names(objects: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(obj["kind"], obj["metadata"]["name"]) for obj in objects]


def test_children_in_apply_order_with_backup_schedule() -> None:
    cluster = make_cluster(backupSchedule="0 3 * * *", backup=clusters.BACKUP)
    assert kinds_and_names(postgres_specs.children(cluster, patroni_config=HASHED)) == [
        ("ServiceAccount", "demo-instance"),
        ("Role", "demo-instance"),
        ("RoleBinding", "demo-instance"),
        ("ConfigMap", "demo-patroni"),
        ("ConfigMap", "demo-fencing"),
        ("Service", "demo-headless"),
        ("Service", "demo-primary"),
        ("Service", "demo-replicas"),
        ("PodDisruptionBudget", "demo"),
        ("NetworkPolicy", "demo"),
        ("StatefulSet", "demo"),
        # The backup Jobs' identity: they exec pgBackRest in the primary.
        ("ServiceAccount", "demo-backup"),
        ("Role", "demo-backup"),
        ("RoleBinding", "demo-backup"),
        ("CronJob", "demo-backup"),
    ]


def test_no_cronjob_without_backup_schedule() -> None:
    kinds = [obj["kind"] for obj in postgres_specs.children(make_cluster(), patroni_config=HASHED)]
    assert "CronJob" not in kinds
    assert len(kinds) == 11


def test_children_exclude_secrets_jobs_and_volumes() -> None:
    kinds = {
        obj["kind"]
        for obj in postgres_specs.children(make_cluster(**FULL_SPEC), patroni_config=HASHED)
    }
    assert not kinds & {"Secret", "Job", "PersistentVolumeClaim"}


def test_children_pass_the_config_text_and_hash_along() -> None:
    rendered = config.PatroniConfig(text="scope: x\n", hash="feedbeef")
    objects = postgres_specs.children(make_cluster(), patroni_config=rendered)
    (sts,) = [obj for obj in objects if obj["kind"] == "StatefulSet"]
    annotations = sts["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {"stateward.io/config-hash": "feedbeef"}
    (config_map,) = [obj for obj in objects if obj["metadata"]["name"].endswith("-patroni")]
    assert config_map["data"] == {"patroni.yaml": "scope: x\n"}


@pytest.mark.parametrize("cluster", CLUSTERS.values(), ids=CLUSTERS.keys())
def test_every_object_is_complete(cluster: PostgresCluster) -> None:
    for obj in built(cluster):
        assert obj["apiVersion"]
        assert obj["kind"]
        assert obj["metadata"]["name"].startswith("demo")
        assert obj["metadata"]["namespace"] == "db"
        assert "status" not in obj


@pytest.mark.parametrize("cluster", CLUSTERS.values(), ids=CLUSTERS.keys())
def test_every_object_has_the_standard_labels(cluster: PostgresCluster) -> None:
    standard = meta.labels(cluster)
    for obj in built(cluster):
        assert standard.items() <= obj["metadata"]["labels"].items(), obj["kind"]


@pytest.mark.parametrize("cluster", CLUSTERS.values(), ids=CLUSTERS.keys())
def test_every_object_but_the_repository_is_owned(cluster: PostgresCluster) -> None:
    for obj in built(cluster):
        if obj["kind"] == "PersistentVolumeClaim":
            assert "ownerReferences" not in obj["metadata"]
        else:
            assert obj["metadata"]["ownerReferences"] == [meta.owner_reference(cluster)]


@pytest.mark.parametrize("cluster", CLUSTERS.values(), ids=CLUSTERS.keys())
def test_no_kopf_or_other_annotations_on_any_object(cluster: PostgresCluster) -> None:
    for obj in built(cluster):
        assert "annotations" not in obj["metadata"], obj["kind"]
        assert "kopf" not in json.dumps(obj)


@pytest.mark.parametrize("cluster", CLUSTERS.values(), ids=CLUSTERS.keys())
def test_no_none_anywhere(cluster: PostgresCluster) -> None:
    for obj in built(cluster):
        for path, value in walk(obj):
            assert value is not None, f"{obj['kind']}{path} is None"


@pytest.mark.parametrize("cluster", CLUSTERS.values(), ids=CLUSTERS.keys())
def test_objects_are_json_ready(cluster: PostgresCluster) -> None:
    for obj in built(cluster):
        assert json.loads(json.dumps(obj)) == obj
        for path, value in walk(obj):
            assert isinstance(value, str | int | bool | dict | list), f"{obj['kind']}{path}"


@pytest.mark.parametrize("cluster", CLUSTERS.values(), ids=CLUSTERS.keys())
def test_no_secret_value_outside_the_secrets_data(cluster: PostgresCluster) -> None:
    forbidden = {
        SUPERUSER_PASSWORD,
        REPLICATION_PASSWORD,
        base64.b64encode(SUPERUSER_PASSWORD.encode()).decode(),
        base64.b64encode(REPLICATION_PASSWORD.encode()).decode(),
    }
    for obj in built(cluster):
        without_data = {
            key: value for key, value in obj.items() if obj["kind"] != "Secret" or key != "data"
        }
        text = json.dumps(without_data)
        assert not any(secret in text for secret in forbidden), obj["kind"]


@pytest.mark.parametrize("cluster", CLUSTERS.values(), ids=CLUSTERS.keys())
def test_credentials_in_env_are_secret_refs(cluster: PostgresCluster) -> None:
    for obj in built(cluster):
        for path, value in walk(obj):
            if path.endswith(".env"):
                for variable in value:
                    credential = ("PASSWORD", "USERNAME", "KEY_SECRET", "S3_KEY")
                    if any(word in variable["name"] for word in credential):
                        assert "value" not in variable, f"{obj['kind']}{path}"
                        assert "secretKeyRef" in variable["valueFrom"]


@pytest.mark.parametrize("cluster", CLUSTERS.values(), ids=CLUSTERS.keys())
def test_building_is_deterministic(cluster: PostgresCluster) -> None:
    assert built(cluster) == built(cluster)
    assert json.dumps(built(cluster)) == json.dumps(built(cluster))
    assert config.config_hash(cluster) == config.config_hash(cluster)


def test_building_does_not_mutate_the_cluster() -> None:
    cluster = make_cluster(**FULL_SPEC)
    before = cluster.model_dump()
    built(cluster)
    assert cluster.model_dump() == before


def test_builders_return_independent_objects() -> None:
    cluster = make_cluster(**FULL_SPEC)
    first = built(cluster)
    for obj in first:
        obj["metadata"]["labels"]["mutated"] = "yes"
        obj["metadata"].get("ownerReferences", [{}])[0]["name"] = "mutated"
    (sts,) = [obj for obj in first if obj["kind"] == "StatefulSet"]
    sts["spec"]["template"]["spec"]["containers"][0]["env"].clear()
    for obj in built(cluster):
        assert "mutated" not in obj["metadata"]["labels"]
        assert "mutated" not in json.dumps(obj)


def test_equal_clusters_in_other_namespaces_differ_only_there() -> None:
    one = make_cluster()
    other = PostgresCluster.model_validate(
        {**one.model_dump(by_alias=True), "metadata": {**one.metadata, "namespace": "other"}}
    )
    assert config.config_hash(one) == config.config_hash(other)
    for a, b in zip(built(one), built(other), strict=True):
        assert a["metadata"]["namespace"] == "db"
        assert b["metadata"]["namespace"] == "other"


def test_the_app_secret_tells_an_application_how_to_connect() -> None:
    cluster = make_cluster(bootstrap={"database": "shop", "owner": "shopper"})
    ca = pki.Authority.new("demo CA").cert_pem
    body = secrets.app_secret(cluster, password="pw_1", ca_cert=ca)
    data = {k: base64.b64decode(v).decode() for k, v in body["data"].items()}
    host = f"{cluster.name}-primary.{cluster.namespace}.svc"
    assert body["metadata"]["name"] == f"{cluster.name}-app"
    assert body["type"] == "kubernetes.io/basic-auth"
    # TLS with the server's name checked against its certificate, by the CA beside it.
    assert data == {
        "username": "shopper",
        "password": "pw_1",
        "host": host,
        "port": "5432",
        "dbname": "shop",
        "user": "shopper",
        "uri": f"postgresql://shopper:pw_1@{host}:5432/shop?sslmode=verify-full",
        "jdbc-uri": (
            f"jdbc:postgresql://{host}:5432/shop?user=shopper&password=pw_1&sslmode=verify-full"
        ),
        "ca.crt": ca.decode(),
    }
    assert host in tls.server_names(cluster)
    assert body["metadata"]["annotations"] == {"stateward.io/ca-fingerprint": pki.fingerprint(ca)}


def test_the_bootstrap_defaults_are_app_and_app() -> None:
    spec = make_cluster().spec.bootstrap
    assert (spec.database, spec.owner) == ("app", "app")


def test_the_fencing_configmap_lists_what_the_annotation_fences() -> None:
    cluster = make_cluster()
    cluster.metadata["annotations"] = {"stateward.io/fenced-instances": '["demo-1", "demo-0"]'}
    (fencing,) = [
        obj
        for obj in postgres_specs.children(cluster, patroni_config=HASHED)
        if obj["metadata"]["name"] == "demo-fencing"
    ]
    assert fencing["data"] == {"instances": '["demo-0", "demo-1"]'}
    # No component label: Patroni lists ConfigMaps by the instance selector.
    assert "app.kubernetes.io/component" not in fencing["metadata"]["labels"]


def test_an_unreadable_fencing_annotation_leaves_the_applied_configmap_alone() -> None:
    cluster = make_cluster()
    cluster.metadata["annotations"] = {"stateward.io/fenced-instances": "demo-1"}
    names = [o["metadata"]["name"] for o in postgres_specs.children(cluster, patroni_config=HASHED)]
    assert "demo-fencing" not in names
