"""Labels, owner references and object metadata shared by every child of a PostgresCluster
or a Database."""

from __future__ import annotations

from typing import Any, Final, Protocol

from stateward.api import v1alpha1
from stateward.instance import patroni

Object = dict[str, Any]
"""A Kubernetes object (or part of one) as a JSON-ready dict, for server-side apply."""

NAME_LABEL: Final = "app.kubernetes.io/name"
INSTANCE_LABEL: Final = "app.kubernetes.io/instance"
MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
COMPONENT_LABEL: Final = "app.kubernetes.io/component"
CLUSTER_LABEL: Final = patroni.SCOPE_LABEL
ROLE_LABEL: Final = patroni.ROLE_LABEL
PRIMARY_ROLE: Final = patroni.PRIMARY_ROLE
REPLICA_ROLE: Final = patroni.REPLICA_ROLE
BACKUP_LABEL: Final = "stateward.io/backup"
"""Which backup a Job runs: ``scheduled`` or ``final``."""
BACKUP_REPOSITORY_LABEL: Final = "stateward.io/backup-repository"
CLUSTER_UID_LABEL: Final = "stateward.io/cluster-uid"
"""On the backup repository, which outlives its cluster: the UID of the cluster that created
it, so a later cluster of the same name does not silently write into an older lineage."""

TLS_LABEL: Final = "stateward.io/tls"
"""On the instance pods: the TLS generation they run (``TLS_GENERATION``). A pod without it
was made before TLS, and cannot work together with one that has it."""
TLS_GENERATION: Final = "1"

CONFIG_HASH_ANNOTATION: Final = "stateward.io/config-hash"
APPLIED_HASH_ANNOTATION: Final = "stateward.io/applied-hash"
"""On every applied child: the hash of the object we last applied, so a field we stopped
setting is noticed (containment alone cannot see a removal) and server-side apply prunes it."""

APP_NAME: Final = "postgresql"
OPERATOR_NAMESPACE: Final = "stateward-system"
"""Where the operator runs unless told otherwise (``stateward operator --namespace``)."""
MANAGER: Final = "stateward"
INSTANCE_COMPONENT: Final = "instance"
"""Database pods and what exists only for them (StatefulSet, volumes, PDB)."""
BACKUP_COMPONENT: Final = "backup"
"""Backup pods, their Job and CronJob, and the backup repository."""


class Owner(Protocol):
    """What children need of the object that owns them (a PostgresCluster or a Database)."""

    api_version: str
    kind: str

    @property
    def name(self) -> str: ...

    @property
    def namespace(self) -> str: ...

    @property
    def uid(self) -> str: ...


def labels(cluster: Owner, *, component: str | None = None, app: str = APP_NAME) -> dict[str, str]:
    """The standard labels every child carries, plus the component where one applies."""
    result = {
        NAME_LABEL: app,
        INSTANCE_LABEL: cluster.name,
        MANAGED_BY_LABEL: MANAGER,
        CLUSTER_LABEL: cluster.name,
    }
    if component is not None:
        result[COMPONENT_LABEL] = component
    return result


def selector_labels(cluster: v1alpha1.PostgresCluster) -> dict[str, str]:
    """Labels that select the instance pods of ``cluster`` and nothing else.

    Immutable once a StatefulSet exists; Patroni lists its members with the same labels.
    The component keeps backup pods out of the headless Service and the PDB.
    """
    return {
        NAME_LABEL: APP_NAME,
        CLUSTER_LABEL: cluster.name,
        COMPONENT_LABEL: INSTANCE_COMPONENT,
    }


def owner_reference(cluster: Owner) -> Object:
    """A controller reference to ``cluster``: its children go when it goes."""
    if not cluster.uid:
        raise ValueError(f"{cluster.kind} {cluster.name!r} has no metadata.uid")
    return {
        "apiVersion": cluster.api_version,
        "kind": cluster.kind,
        "name": cluster.name,
        "uid": cluster.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def object_meta(
    cluster: Owner,
    name: str,
    *,
    component: str | None = None,
    extra_labels: dict[str, str] | None = None,
    owned: bool = True,
    app: str = APP_NAME,
) -> Object:
    """``metadata`` of a child named ``name`` in the cluster's namespace."""
    meta: Object = {
        "name": name,
        "namespace": cluster.namespace,
        "labels": {**labels(cluster, component=component, app=app), **(extra_labels or {})},
    }
    if owned:
        meta["ownerReferences"] = [owner_reference(cluster)]
    return meta


def pod_ordinal(name: str) -> int:
    """A StatefulSet pod's ordinal, from its name (``NAME-3`` -> 3)."""
    return int(name.rsplit("-", 1)[1])


def pod_ready(pod: Object) -> bool:
    """Whether the pod's Ready condition is True (as the kubelet last reported it)."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
