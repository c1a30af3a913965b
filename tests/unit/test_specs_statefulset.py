"""The StatefulSet of instance pods."""

from __future__ import annotations

from typing import Any

import pytest

from stateward.api.v1alpha1 import PostgresCluster
from stateward.instance import patroni
from stateward.specs import meta
from stateward.specs.postgres import statefulset
from tests.support import clusters

pytestmark = pytest.mark.unit

HASH = "0123456789abcdef"


def make_cluster(**spec: Any) -> PostgresCluster:
    return clusters.make_cluster(**{"storageSize": "10Gi", **spec})


def build(**spec: Any) -> dict[str, Any]:
    return statefulset.statefulset(make_cluster(**spec), config_hash=HASH)


def pod_spec(**spec: Any) -> dict[str, Any]:
    result = build(**spec)["spec"]["template"]["spec"]
    assert isinstance(result, dict)
    return result


def container(**spec: Any) -> dict[str, Any]:
    containers = pod_spec(**spec)["containers"]
    assert len(containers) == 1
    result = containers[0]
    assert isinstance(result, dict)
    return result


def env(**spec: Any) -> dict[str, dict[str, Any]]:
    return {variable["name"]: variable for variable in container(**spec)["env"]}


def test_identity_and_metadata() -> None:
    cluster = make_cluster()
    sts = build()
    assert sts["apiVersion"] == "apps/v1"
    assert sts["kind"] == "StatefulSet"
    assert sts["metadata"] == {
        "name": "demo",
        "namespace": "db",
        "labels": meta.labels(cluster, component="instance"),
        "ownerReferences": [meta.owner_reference(cluster)],
    }


def test_spec_basics() -> None:
    cluster = make_cluster()
    spec = build()["spec"]
    assert spec["replicas"] == 3
    assert spec["serviceName"] == "demo-headless"
    assert spec["podManagementPolicy"] == "Parallel"
    assert spec["updateStrategy"] == {"type": "OnDelete"}
    assert spec["selector"] == {"matchLabels": meta.selector_labels(cluster)}


@pytest.mark.parametrize("replicas", [1, 5, 16])
def test_replicas_follow_the_spec(replicas: int) -> None:
    assert build(replicas=replicas)["spec"]["replicas"] == replicas


def test_pod_template_labels_and_config_hash() -> None:
    cluster = make_cluster()
    template_meta = build()["spec"]["template"]["metadata"]
    labels = template_meta["labels"]
    assert meta.selector_labels(cluster).items() <= labels.items()
    assert meta.labels(cluster).items() <= labels.items()
    assert meta.ROLE_LABEL not in labels
    assert template_meta["annotations"] == {"stateward.io/config-hash": HASH}
    assert "ownerReferences" not in template_meta


def test_config_hash_is_the_only_difference_between_hashes() -> None:
    cluster = make_cluster()
    one = statefulset.statefulset(cluster, config_hash="aaaa")
    two = statefulset.statefulset(cluster, config_hash="bbbb")
    one["spec"]["template"]["metadata"]["annotations"] = {}
    two["spec"]["template"]["metadata"]["annotations"] = {}
    assert one == two


def test_pod_spec_basics() -> None:
    spec = pod_spec()
    assert spec["serviceAccountName"] == "demo-instance"
    assert spec["enableServiceLinks"] is False
    assert 30 < spec["terminationGracePeriodSeconds"] <= 300
    assert spec["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 999,
        "runAsGroup": 999,
        "fsGroup": 999,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert "restartPolicy" not in spec  # Always is the default


def test_instances_require_a_node_each_by_default() -> None:
    cluster = make_cluster()
    affinity = pod_spec()["affinity"]
    assert affinity == {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": meta.selector_labels(cluster)},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }


def test_preferred_placement_lets_instances_share_a_node() -> None:
    placement = {"antiAffinity": "Preferred", "topologyKey": "topology.kubernetes.io/zone"}
    cluster = make_cluster(placement=placement)
    affinity = pod_spec(placement=placement)["affinity"]
    assert affinity == {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "podAffinityTerm": {
                        "labelSelector": {"matchLabels": meta.selector_labels(cluster)},
                        "topologyKey": "topology.kubernetes.io/zone",
                    },
                }
            ]
        }
    }


@pytest.mark.parametrize(
    ("placement", "field"),
    [
        ({"antiAffinity": "Sometimes"}, "antiAffinity"),
        ({"topologyKey": "not a key"}, "topologyKey"),
        ({"topologyKey": "/hostname"}, "topologyKey"),
        ({"nodes": 3}, "nodes"),
    ],
)
def test_a_bad_placement_is_refused_naming_the_field(placement: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        make_cluster(placement=placement)


def test_container_runs_patroni_from_the_cluster_image() -> None:
    result = container()
    assert result["name"] == "postgres"
    assert result["image"] == "ghcr.io/stateward/postgres-instance:16"
    assert result["command"] == [
        "stateward-instance",
        "run",
        "--config",
        "/etc/patroni/patroni.yaml",
    ]
    assert result["ports"] == [
        {"name": "postgresql", "containerPort": 5432},
        {"name": "patroni", "containerPort": 8008},
        {"name": "metrics", "containerPort": 9187},
    ]


def test_image_override() -> None:
    assert container(image="registry.example/pg:custom")["image"] == "registry.example/pg:custom"


def test_container_security_context() -> None:
    assert container()["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def test_env_from_the_downward_api() -> None:
    variables = env()
    assert variables["PATRONI_NAME"] == {
        "name": "PATRONI_NAME",
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
    }
    assert variables["PATRONI_KUBERNETES_NAMESPACE"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.namespace"}
    }
    assert variables["PATRONI_KUBERNETES_POD_IP"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "status.podIP"}
    }


def test_connect_addresses_use_the_pod_ip_defined_before_them() -> None:
    names = [variable["name"] for variable in container()["env"]]
    variables = env()
    assert variables["PATRONI_RESTAPI_CONNECT_ADDRESS"]["value"] == (
        "$(PATRONI_KUBERNETES_POD_IP):8008"
    )
    assert variables["PATRONI_POSTGRESQL_CONNECT_ADDRESS"]["value"] == (
        "$(PATRONI_KUBERNETES_POD_IP):5432"
    )
    pod_ip = names.index("PATRONI_KUBERNETES_POD_IP")
    assert pod_ip < names.index("PATRONI_RESTAPI_CONNECT_ADDRESS")
    assert pod_ip < names.index("PATRONI_POSTGRESQL_CONNECT_ADDRESS")


def test_credentials_are_files_from_the_secrets_never_variables() -> None:
    volume = next(v for v in pod_spec()["volumes"] if v["name"] == "credentials")
    projected = {
        (source["secret"]["name"], item["key"], item["path"])
        for source in volume["projected"]["sources"]
        for item in source["secret"]["items"]
    }
    assert projected == {
        ("demo-superuser", "username", "superuser/username"),
        ("demo-superuser", "password", "superuser/password"),
        ("demo-replication", "username", "replication/username"),
        ("demo-replication", "password", "replication/password"),
        ("demo-patroni-api", "username", "restapi/username"),
        ("demo-patroni-api", "password", "restapi/password"),
        ("demo-app", "password", "app/password"),
    }
    assert volume["projected"]["defaultMode"] == 0o440, "root's, read by the postgres group"
    mount = next(m for m in container()["volumeMounts"] if m["name"] == "credentials")
    assert mount == {"name": "credentials", "mountPath": "/etc/stateward/credentials",
                     "readOnly": True}  # fmt: skip
    # Read by `stateward-instance run` from exactly these paths.
    for role in patroni.CREDENTIALS:
        assert any(path.startswith(f"{role}/") for _, _, path in projected)
    assert patroni.APP_PASSWORD_FILE == "/etc/stateward/credentials/app/password"
    for variable in container()["env"]:
        assert "secretKeyRef" not in variable.get("valueFrom", {}), variable["name"]
        assert "PASSWORD" not in variable["name"] and "USERNAME" not in variable["name"]


def test_tmp_where_patroni_writes_its_credentials_is_memory_backed() -> None:
    tmp = next(v for v in pod_spec()["volumes"] if v["name"] == "tmp")
    assert tmp["emptyDir"] == {"medium": "Memory"}
    assert patroni.RUNTIME_CONFIG_FILE.startswith(patroni.TMP_DIR + "/")


def test_env_names_are_unique_and_static_settings_stay_in_the_file() -> None:
    names = [variable["name"] for variable in container()["env"]]
    assert len(names) == len(set(names))
    # Static settings live in patroni.yaml only, so the two cannot disagree.
    assert "PATRONI_SCOPE" not in names
    assert "PATRONI_KUBERNETES_LABELS" not in names
    assert env()["PATRONICTL_CONFIG_FILE"]["value"] == patroni.RUNTIME_CONFIG_FILE


def test_env_values_are_strings() -> None:
    for variable in container()["env"]:
        assert ("value" in variable) != ("valueFrom" in variable)
        if "value" in variable:
            assert isinstance(variable["value"], str)


def test_no_resources_when_none_are_asked_for() -> None:
    assert "resources" not in container()


def test_resources_only_what_is_set() -> None:
    assert container(resources={"requests": {"cpu": "500m", "memory": "1Gi"}})["resources"] == {
        "requests": {"cpu": "500m", "memory": "1Gi"}
    }
    assert container(resources={"limits": {"memory": "2Gi"}})["resources"] == {
        "limits": {"memory": "2Gi"}
    }
    both = {"requests": {"cpu": "1"}, "limits": {"memory": "2Gi"}}
    assert container(resources=both)["resources"] == both


def test_probes_use_patronis_rest_api() -> None:
    result = container()
    # Patroni serves HTTPS only: a plain-HTTP probe would fail and restart the container.
    https = {"port": 8008, "scheme": "HTTPS"}
    assert result["readinessProbe"]["httpGet"] == {"path": "/readiness", **https}
    assert result["livenessProbe"]["httpGet"] == {"path": "/liveness", **https}
    assert result["startupProbe"]["httpGet"] == {"path": "/liveness", **https}


def test_probe_thresholds() -> None:
    result = container()
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert set(result[probe]) == {
            "httpGet",
            "periodSeconds",
            "timeoutSeconds",
            "failureThreshold",
        }
        assert result[probe]["timeoutSeconds"] < result[probe]["periodSeconds"]
    liveness = result["livenessProbe"]
    # A restart kills PostgreSQL: only after Patroni had time to fail over (ttl 20 s).
    assert liveness["periodSeconds"] * liveness["failureThreshold"] >= 60
    startup = result["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300
    readiness = result["readinessProbe"]
    assert readiness["periodSeconds"] * readiness["failureThreshold"] <= 30


def test_volume_mounts() -> None:
    mounts = {mount["mountPath"]: mount for mount in container()["volumeMounts"]}
    assert mounts == {
        "/var/lib/postgresql/data": {"name": "pgdata", "mountPath": "/var/lib/postgresql/data"},
        "/etc/patroni": {"name": "config", "mountPath": "/etc/patroni", "readOnly": True},
        "/var/run/postgresql": {"name": "run", "mountPath": "/var/run/postgresql"},
        "/tmp": {"name": "tmp", "mountPath": "/tmp"},
        "/dev/shm": {"name": "shm", "mountPath": "/dev/shm"},
        "/etc/stateward/tls": {"name": "tls", "mountPath": "/etc/stateward/tls", "readOnly": True},
        "/etc/stateward/credentials": {
            "name": "credentials",
            "mountPath": "/etc/stateward/credentials",
            "readOnly": True,
        },
    }


def test_volumes() -> None:
    volumes = {volume["name"]: volume for volume in pod_spec()["volumes"]}
    assert volumes == {
        "config": {"name": "config", "configMap": {"name": "demo-patroni"}},
        "run": {"name": "run", "emptyDir": {}},
        "tmp": {"name": "tmp", "emptyDir": {"medium": "Memory"}},
        "credentials": volumes["credentials"],  # test_credentials_are_files_...
        "shm": {"name": "shm", "emptyDir": {"medium": "Memory"}},
        # The serving certificate: readable by root and the pod's fsGroup (postgres) only,
        # which PostgreSQL requires of a key file it does not own.
        "tls": {"name": "tls", "secret": {"secretName": "demo-tls", "defaultMode": 0o440}},
    }


def test_every_mount_has_a_volume_or_claim_template() -> None:
    sts = build()
    names = {volume["name"] for volume in sts["spec"]["template"]["spec"]["volumes"]}
    names |= {claim["metadata"]["name"] for claim in sts["spec"]["volumeClaimTemplates"]}
    mounts = {mount["name"] for mount in container()["volumeMounts"]}
    assert mounts == names


def test_volume_claim_template_without_storage_class() -> None:
    cluster = make_cluster()
    assert build()["spec"]["volumeClaimTemplates"] == [
        {
            "metadata": {"name": "pgdata", "labels": meta.labels(cluster, component="instance")},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "10Gi"}},
            },
        }
    ]


def test_volume_claim_template_with_storage_class() -> None:
    (claim,) = build(storageClassName="fast-ssd", storageSize="50Gi")["spec"][
        "volumeClaimTemplates"
    ]
    assert claim["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "50Gi"}},
        "storageClassName": "fast-ssd",
    }
