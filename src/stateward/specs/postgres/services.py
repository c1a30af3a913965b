"""The three Services: peers (headless), read-write (primary), read-only (replicas).

The primary and replicas Services select on the role label that Patroni keeps current on
each pod; a pod Patroni has not labelled yet is in neither.
"""

from __future__ import annotations

from stateward.api import v1alpha1
from stateward.instance import patroni
from stateward.specs import meta

POSTGRES_PORT_NAME = "postgresql"
PATRONI_PORT_NAME = "patroni"


def headless_service(cluster: v1alpha1.PostgresCluster) -> meta.Object:
    """Stable DNS names for the instance pods (the StatefulSet's ``serviceName``)."""
    return _service(
        cluster,
        cluster.headless_service_name,
        selector=meta.selector_labels(cluster),
        ports=[_postgres_port(), _patroni_port()],
        # Peers must resolve each other before they are ready (bootstrap, replication).
        extra_spec={"clusterIP": "None", "publishNotReadyAddresses": True},
    )


def primary_service(cluster: v1alpha1.PostgresCluster) -> meta.Object:
    return _service(
        cluster,
        cluster.primary_service_name,
        selector={**meta.selector_labels(cluster), meta.ROLE_LABEL: meta.PRIMARY_ROLE},
        ports=[_postgres_port()],
    )


def replicas_service(cluster: v1alpha1.PostgresCluster) -> meta.Object:
    return _service(
        cluster,
        cluster.replicas_service_name,
        selector={**meta.selector_labels(cluster), meta.ROLE_LABEL: meta.REPLICA_ROLE},
        ports=[_postgres_port()],
    )


def _service(
    cluster: v1alpha1.PostgresCluster,
    name: str,
    *,
    selector: dict[str, str],
    ports: list[meta.Object],
    extra_spec: meta.Object | None = None,
) -> meta.Object:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta.object_meta(cluster, name),
        "spec": {**(extra_spec or {}), "selector": selector, "ports": ports},
    }


def _postgres_port() -> meta.Object:
    return {"name": POSTGRES_PORT_NAME, "port": patroni.POSTGRES_PORT}


def _patroni_port() -> meta.Object:
    return {"name": PATRONI_PORT_NAME, "port": patroni.RESTAPI_PORT}
