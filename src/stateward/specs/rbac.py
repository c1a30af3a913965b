"""The identities of a cluster's pods, each with what it needs and nothing more.

The instance pods (``NAME-instance``): in ConfigMaps mode Patroni reads and writes ConfigMaps
(leader lock, dynamic config, sync and failover keys) and its own Pod (role label, status
annotation). It touches Endpoints and Services only in Endpoints mode, which we do not use,
so it gets no rights on them.

The backup Jobs (``NAME-backup``): they find the primary and run pgBackRest in it (exec).
"""

from __future__ import annotations

from stateward.api import v1alpha1
from stateward.specs import meta

RBAC_API_VERSION = "rbac.authorization.k8s.io/v1"

INSTANCE_RULES: tuple[meta.Object, ...] = (
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
"""The backup Jobs list the cluster's pods to find the primary and exec pgBackRest in it.
(The exec upgrade is a GET on the wire; authorizers check ``create`` or ``get``, by version.)"""


def service_account(cluster: v1alpha1.PostgresCluster, name: str | None = None) -> meta.Object:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": meta.object_meta(cluster, name or cluster.instance_account_name),
    }


def role(
    cluster: v1alpha1.PostgresCluster,
    name: str | None = None,
    rules: tuple[meta.Object, ...] = INSTANCE_RULES,
) -> meta.Object:
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
        role(cluster, name, BACKUP_RULES),
        role_binding(cluster, name),
    ]
