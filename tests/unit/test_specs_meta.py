"""Labels, selector labels, owner references and object metadata."""

from __future__ import annotations

from typing import Any

import pytest

from stateward.api.v1alpha1 import PostgresCluster
from stateward.specs import meta, pods
from tests.support import clusters

pytestmark = pytest.mark.unit


def make_cluster(**metadata: Any) -> PostgresCluster:
    return clusters.make_cluster(metadata=metadata)


def test_label_keys() -> None:
    assert meta.ROLE_LABEL == "stateward.io/role"
    assert meta.CLUSTER_LABEL == "stateward.io/cluster"
    assert (meta.PRIMARY_ROLE, meta.REPLICA_ROLE) == ("primary", "replica")


def test_standard_labels() -> None:
    assert meta.labels(make_cluster()) == {
        "app.kubernetes.io/name": "postgresql",
        "app.kubernetes.io/instance": "demo",
        "app.kubernetes.io/managed-by": "stateward",
        "stateward.io/cluster": "demo",
    }


def test_labels_with_a_component() -> None:
    labels = meta.labels(make_cluster(), component="backup")
    assert labels["app.kubernetes.io/component"] == "backup"
    assert labels.items() >= meta.labels(make_cluster()).items()


def test_selector_labels_pick_the_instances_of_one_cluster() -> None:
    assert meta.selector_labels(make_cluster()) == {
        "app.kubernetes.io/name": "postgresql",
        "stateward.io/cluster": "demo",
        "app.kubernetes.io/component": "instance",
    }
    assert meta.ROLE_LABEL not in meta.selector_labels(make_cluster())


def test_selector_labels_do_not_match_backup_pods() -> None:
    cluster = make_cluster()
    backup_labels = meta.labels(cluster, component=meta.BACKUP_COMPONENT)
    assert not meta.selector_labels(cluster).items() <= backup_labels.items()


def test_instance_labels_contain_the_selector_labels() -> None:
    cluster = make_cluster()
    instance_labels = meta.labels(cluster, component=meta.INSTANCE_COMPONENT)
    assert meta.selector_labels(cluster).items() <= instance_labels.items()


def test_owner_reference() -> None:
    assert meta.owner_reference(make_cluster()) == {
        "apiVersion": "stateward.io/v1alpha1",
        "kind": "PostgresCluster",
        "name": "demo",
        "uid": "uid-1",
        "controller": True,
        "blockOwnerDeletion": True,
    }


def test_owner_reference_refuses_a_cluster_without_uid() -> None:
    cluster = PostgresCluster.model_validate(
        {
            "metadata": {"name": "demo", "namespace": "db"},
            "spec": {"version": "16", "replicas": 1, "storageSize": "1Gi"},
        }
    )
    with pytest.raises(ValueError, match="uid"):
        meta.owner_reference(cluster)


def test_object_meta_of_an_owned_child() -> None:
    cluster = make_cluster()
    assert meta.object_meta(cluster, "demo-x") == {
        "name": "demo-x",
        "namespace": "db",
        "labels": meta.labels(cluster),
        "ownerReferences": [meta.owner_reference(cluster)],
    }


def test_object_meta_with_component_extra_labels_and_no_owner() -> None:
    cluster = make_cluster()
    result = meta.object_meta(
        cluster, "demo-y", component="backup", extra_labels={"k": "v"}, owned=False
    )
    assert result == {
        "name": "demo-y",
        "namespace": "db",
        "labels": {**meta.labels(cluster, component="backup"), "k": "v"},
    }


def test_object_meta_carries_no_annotations() -> None:
    assert "annotations" not in meta.object_meta(make_cluster(), "demo")


def test_pod_security_context_runs_as_postgres() -> None:
    assert pods.pod_security_context() == {
        "runAsNonRoot": True,
        "runAsUser": 999,
        "runAsGroup": 999,
        "fsGroup": 999,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def test_container_security_context_is_locked_down() -> None:
    assert pods.container_security_context() == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def test_security_contexts_are_fresh_copies() -> None:
    first = pods.pod_security_context()
    first["seccompProfile"]["type"] = "Unconfined"
    assert pods.pod_security_context()["seccompProfile"] == {"type": "RuntimeDefault"}
