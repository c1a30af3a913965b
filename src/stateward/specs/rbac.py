"""The identity of the instance pods: what Patroni's Kubernetes DCS needs, nothing more.

In ConfigMaps mode Patroni reads and writes ConfigMaps (leader lock, dynamic config, sync
and failover keys) and its own Pod (role label, status annotation). It touches Endpoints and
Services only in Endpoints mode, which we do not use, so it gets no rights on them.
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


def service_account(cluster: v1alpha1.PostgresCluster) -> meta.Object:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": meta.object_meta(cluster, cluster.instance_account_name),
    }


def role(cluster: v1alpha1.PostgresCluster) -> meta.Object:
    return {
        "apiVersion": RBAC_API_VERSION,
        "kind": "Role",
        "metadata": meta.object_meta(cluster, cluster.instance_account_name),
        "rules": [{key: list(value) for key, value in rule.items()} for rule in INSTANCE_RULES],
    }


def role_binding(cluster: v1alpha1.PostgresCluster) -> meta.Object:
    return {
        "apiVersion": RBAC_API_VERSION,
        "kind": "RoleBinding",
        "metadata": meta.object_meta(cluster, cluster.instance_account_name),
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": cluster.instance_account_name,
        },
        "subjects": [
            {
                "kind": "ServiceAccount",
                "name": cluster.instance_account_name,
                "namespace": cluster.namespace,
            }
        ],
    }
