"""Pod-level pieces shared by the instance and the backup pods."""

from __future__ import annotations

from typing import Final

from stateward.api import v1alpha1
from stateward.specs import meta

INSTANCE_CONTAINER: Final = "postgres"
"""The instance pods' container: Patroni, PostgreSQL, and pgBackRest the backup Jobs exec."""
POSTGRES_UID: Final = 999
"""The postgres user of the Debian-based instance image (as in the official postgres image).
PostgreSQL and Patroni refuse to run as root."""


def pod_security_context() -> meta.Object:
    return {
        "runAsNonRoot": True,
        "runAsUser": POSTGRES_UID,
        "runAsGroup": POSTGRES_UID,
        "fsGroup": POSTGRES_UID,
        # Chown the volume only when its root does not match: a recursive walk over a large
        # data directory at every mount slows starts, and group bits on PGDATA make
        # PostgreSQL refuse to start.
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> meta.Object:
    # Writable paths are emptyDirs or volumes: /tmp, the socket directory, the data volume.
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def field_env(name: str, *, field_path: str) -> meta.Object:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}}


def empty_dir(name: str, *, memory: bool = False) -> meta.Object:
    return {"name": name, "emptyDir": {"medium": "Memory"} if memory else {}}


def volume_claim_spec(cluster: v1alpha1.PostgresCluster) -> meta.Object:
    """A ``storageSize`` ReadWriteOnce claim in the cluster's storage class (or the default):
    the instances' data volumes and the backup repository alike."""
    spec: meta.Object = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": cluster.spec.storage_size}},
    }
    if cluster.spec.storage_class_name is not None:
        spec["storageClassName"] = cluster.spec.storage_class_name
    return spec
