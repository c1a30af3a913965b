"""The identities of a cluster's pods, each with what it needs and nothing more.

The instance pods (``NAME-instance``): in ConfigMaps mode Patroni reads and writes ConfigMaps
(leader lock, dynamic config, sync and failover keys) and its own Pod (role label, status
annotation). It touches Endpoints and Services only in Endpoints mode, which we do not use,
so it gets no rights on them.

The backup Jobs (``NAME-backup``): they find the primary and run pgBackRest in it (exec).

Writes are limited to the cluster's own objects by name (``resourceNames``): Patroni may change
only its cluster's state ConfigMaps and its cluster's pods, and a backup Job may exec only
into its cluster's pods. ``create``, ``list`` and ``watch`` cannot be limited by name in
Kubernetes RBAC, so they stay namespace-wide; they read or add, never change what another
cluster has. A compromised instance can therefore not relabel another cluster's pod (and
take its Service traffic) or rewrite its leader lock, and a backup Job cannot get a shell in
an application's pod.
"""

from __future__ import annotations

from stateward.api import v1alpha1
from stateward.instance import patroni
from stateward.specs import meta

RBAC_API_VERSION = "rbac.authorization.k8s.io/v1"

INSTANCE_RULES: tuple[meta.Object, ...] = (
    # The envelope of :func:`instance_rules` without the names: what the operator must hold
    # itself to grant it (runtime/rbac.py).
    {
        "apiGroups": [""],
        "resources": ["configmaps"],
        "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
    },
    {
        "apiGroups": [""],
        "resources": ["pods"],
        "verbs": ["get", "list", "patch", "update", "watch"],
    },
)


BACKUP_RULES: tuple[meta.Object, ...] = (
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
    {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create", "get"]},
)
"""The envelope of :func:`backup_rules` without the names. The backup Jobs list the cluster's
pods to find the primary and exec pgBackRest in it. (The exec upgrade is a GET on the wire;
authorizers check ``create`` or ``get``, by version.)"""


def pod_names(cluster: v1alpha1.PostgresCluster) -> list[str]:
    """Every name an instance pod of ``cluster`` can have (the StatefulSet's ordinals up to
    the most replicas admission allows), so scaling never changes a Role."""
    return [f"{cluster.name}-{ordinal}" for ordinal in range(v1alpha1.MAX_REPLICAS)]


def instance_rules(cluster: v1alpha1.PostgresCluster) -> tuple[meta.Object, ...]:
    """Patroni's rights in ConfigMaps mode, writes limited to its own cluster's objects."""
    return (
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "verbs": ["create", "get", "list", "watch"],
        },
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": sorted(patroni.state_config_maps(cluster.name)),
            "verbs": ["delete", "patch", "update"],
        },
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        {
            "apiGroups": [""],
            "resources": ["pods"],
            "resourceNames": pod_names(cluster),
            "verbs": ["patch", "update"],
        },
    )


def backup_rules(cluster: v1alpha1.PostgresCluster) -> tuple[meta.Object, ...]:
    """The backup Jobs' rights: read the pods, exec only into this cluster's."""
    return (
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
        {
            "apiGroups": [""],
            "resources": ["pods/exec"],
            "resourceNames": pod_names(cluster),
            "verbs": ["create", "get"],
        },
    )


def service_account(cluster: v1alpha1.PostgresCluster, name: str | None = None) -> meta.Object:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": meta.object_meta(cluster, name or cluster.instance_account_name),
    }


def role(
    cluster: v1alpha1.PostgresCluster,
    name: str | None = None,
    rules: tuple[meta.Object, ...] | None = None,
) -> meta.Object:
    rules = instance_rules(cluster) if rules is None else rules
    return {
        "apiVersion": RBAC_API_VERSION,
        "kind": "Role",
        "metadata": meta.object_meta(cluster, name or cluster.instance_account_name),
        "rules": [{key: list(value) for key, value in rule.items()} for rule in rules],
    }


def role_binding(cluster: v1alpha1.PostgresCluster, name: str | None = None) -> meta.Object:
    name = name or cluster.instance_account_name
    return {
        "apiVersion": RBAC_API_VERSION,
        "kind": "RoleBinding",
        "metadata": meta.object_meta(cluster, name),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": cluster.namespace}],
    }


def backup_identity(cluster: v1alpha1.PostgresCluster) -> list[meta.Object]:
    """``NAME-backup``: ServiceAccount, Role, RoleBinding of the backup Jobs."""
    name = cluster.backup_account_name
    return [
        service_account(cluster, name),
        role(cluster, name, backup_rules(cluster)),
        role_binding(cluster, name),
    ]
