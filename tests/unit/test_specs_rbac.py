"""ServiceAccount, Role and RoleBinding of the instance pods."""

from __future__ import annotations

import pytest

from stateward.api.v1alpha1 import PostgresCluster
from stateward.specs import meta
from stateward.specs.postgres import rbac
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
    assert all(rule["apiGroups"] == [""] for rule in role["rules"])
    anywhere = {
        (resource, verb)
        for rule in role["rules"]
        if "resourceNames" not in rule
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert anywhere == {("configmaps", verb) for verb in ("create", "get", "list", "watch")} | {
        ("pods", verb) for verb in ("get", "list", "watch")
    }
    named = {
        (resource, verb): rule["resourceNames"]
        for rule in role["rules"]
        if "resourceNames" in rule
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    state = ["demo-config", "demo-failover", "demo-leader", "demo-sync"]
    pods = [f"demo-{ordinal}" for ordinal in range(16)]
    assert named == {
        ("configmaps", "delete"): state,
        ("configmaps", "patch"): state,
        ("configmaps", "update"): state,
        ("pods", "patch"): pods,
        ("pods", "update"): pods,
    }


def test_backup_jobs_exec_only_into_their_clusters_pods() -> None:
    cluster = make_cluster()
    _account, role, _binding = rbac.backup_identity(cluster)
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
        {
            "apiGroups": [""],
            "resources": ["pods/exec"],
            "resourceNames": [f"demo-{ordinal}" for ordinal in range(16)],
            "verbs": ["create", "get"],
        },
    ]


def test_named_rules_stay_within_what_the_operator_holds() -> None:
    # The operator's ClusterRole is built from the envelopes; each named rule must fit one.
    cluster = make_cluster()
    for rules, envelope in (
        (rbac.instance_rules(cluster), rbac.INSTANCE_RULES),
        (rbac.backup_rules(cluster), rbac.BACKUP_RULES),
    ):
        for rule in rules:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert any(
                        resource in e["resources"] and verb in e["verbs"] for e in envelope
                    ), (resource, verb)


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
