"""The headless, primary and replicas Services."""

from __future__ import annotations

import pytest

from stateward.specs import meta
from stateward.specs.postgres import services
from tests.support.clusters import make_cluster

pytestmark = pytest.mark.unit


INSTANCE_SELECTOR = {
    "app.kubernetes.io/name": "postgresql",
    "stateward.io/cluster": "demo",
    "app.kubernetes.io/component": "instance",
}


def test_headless_service() -> None:
    cluster = make_cluster()
    assert services.headless_service(cluster) == {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "demo-headless",
            "namespace": "db",
            "labels": meta.labels(cluster),
            "ownerReferences": [meta.owner_reference(cluster)],
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": INSTANCE_SELECTOR,
            "ports": [
                {"name": "postgresql", "port": 5432},
                {"name": "patroni", "port": 8008},
            ],
        },
    }


def test_primary_service_selects_the_primary_role() -> None:
    cluster = make_cluster()
    service = services.primary_service(cluster)
    assert service["metadata"]["name"] == cluster.primary_service_name == "demo-primary"
    assert service["spec"] == {
        "selector": {**INSTANCE_SELECTOR, "stateward.io/role": "primary"},
        "ports": [{"name": "postgresql", "port": 5432}],
    }


def test_replicas_service_selects_the_replica_role() -> None:
    cluster = make_cluster()
    service = services.replicas_service(cluster)
    assert service["metadata"]["name"] == cluster.replicas_service_name == "demo-replicas"
    assert service["spec"] == {
        "selector": {**INSTANCE_SELECTOR, "stateward.io/role": "replica"},
        "ports": [{"name": "postgresql", "port": 5432}],
    }


@pytest.mark.parametrize(
    "build", [services.headless_service, services.primary_service, services.replicas_service]
)
def test_every_service_is_owned_and_labelled(build: object) -> None:
    cluster = make_cluster()
    assert callable(build)
    service = build(cluster)
    assert service["metadata"]["namespace"] == "db"
    assert service["metadata"]["labels"] == meta.labels(cluster)
    assert service["metadata"]["ownerReferences"] == [meta.owner_reference(cluster)]
    # ClusterIP is the API server's default type: not ours to set.
    assert "type" not in service["spec"]


def test_primary_and_replicas_services_are_not_headless() -> None:
    cluster = make_cluster()
    for service in (services.primary_service(cluster), services.replicas_service(cluster)):
        assert "clusterIP" not in service["spec"]
        assert "publishNotReadyAddresses" not in service["spec"]
