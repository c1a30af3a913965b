"""ServiceAccount, Role and RoleBinding of the instance pods."""

from __future__ import annotations

import pytest

from stateward.api.v1alpha1 import PostgresCluster
from stateward.specs import meta, rbac
from tests.support.clusters import make_cluster

pytestmark = pytest.mark.unit


def expected_meta(cluster: PostgresCluster) -> dict[str, object]:
    return {
        "name": "demo-instance",
        "namespace": "db",
        "labels": meta.labels(cluster),
        "ownerReferences": [meta.owner_reference(cluster)],
    }


def test_service_account() -> None:
    cluster = make_cluster()
    assert rbac.service_account(cluster) == {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": expected_meta(cluster),
    }


def test_role_grants_what_patronis_configmaps_dcs_needs() -> None:
    cluster = make_cluster()
    role = rbac.role(cluster)
    assert role["apiVersion"] == "rbac.authorization.k8s.io/v1"
    assert role["kind"] == "Role"
    assert role["metadata"] == expected_meta(cluster)
    rules = {resource: rule for rule in role["rules"] for resource in rule["resources"]}
    assert set(rules) == {"configmaps", "pods"}
    assert all(rule["apiGroups"] == [""] for rule in role["rules"])
    assert set(rules["configmaps"]["verbs"]) == {
        "create",
        "delete",
        "get",
        "list",
        "patch",
        "update",
        "watch",
    }
    assert set(rules["pods"]["verbs"]) == {"get", "list", "patch", "update", "watch"}


def test_role_grants_nothing_beyond_its_namespace_or_wildcards() -> None:
    role = rbac.role(make_cluster())
    for rule in role["rules"]:
        assert "*" not in rule["verbs"]
        assert "*" not in rule["resources"]
        assert "secrets" not in rule["resources"]


def test_role_rules_are_fresh_copies() -> None:
    rbac.role(make_cluster())["rules"][0]["verbs"].append("escalate")
    assert "escalate" not in rbac.role(make_cluster())["rules"][0]["verbs"]


def test_role_binding() -> None:
    cluster = make_cluster()
    assert rbac.role_binding(cluster) == {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": expected_meta(cluster),
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": "demo-instance",
        },
        "subjects": [{"kind": "ServiceAccount", "name": "demo-instance", "namespace": "db"}],
    }
