"""The operator's RBAC covers every call the code makes, and config/ matches the code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from stateward.api import manifests
from stateward.api.v1alpha1 import PostgresCluster
from stateward.cli.main import build_parser
from stateward.cli.main import main as cli
from stateward.runtime import operator, rbac, webhook
from stateward.specs import postgres as postgres_specs
from stateward.specs.postgres import backup, config, secrets
from stateward.specs.postgres import rbac as instance_rbac

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]

CLUSTER = PostgresCluster.model_validate(
    {
        "metadata": {"name": "demo", "namespace": "db", "uid": "uid-1", "generation": 1},
        "spec": {
            "version": "16",
            "replicas": 3,
            "storageSize": "1Gi",
            "backupSchedule": "0 3 * * *",
            "backup": {
                "repository": {
                    "s3": {"endpoint": "s3.example.com", "bucket": "bkp", "credentialsSecret": "s"}
                }
            },
        },
    }
)
RESOURCE_OF_KIND = {kind: (group, plural) for group, _v, plural, kind in operator.CHILD_RESOURCES}


def allows(
    role: dict[str, Any], group: str, resource: str, verb: str, name: str | None = None
) -> bool:
    return any(
        group in rule["apiGroups"]
        and resource in rule["resources"]
        and verb in rule["verbs"]
        and ("resourceNames" not in rule or (name is not None and name in rule["resourceNames"]))
        for rule in role["rules"]
    )


def reconciler_writes() -> dict[str, set[str]]:
    """Kind -> the write verbs the reconciler sends for it (controllers/postgres/: reconcile.py,
    backup_phases.py, deletion.py)."""
    writes: dict[str, set[str]] = {}
    # apply_children: server-side apply, which is a patch that creates when absent.
    for child in postgres_specs.children(CLUSTER, patroni_config=config.patroni_config(CLUSTER)):
        writes.setdefault(child["kind"], set()).update({"create", "patch"})
    # Created once: the Secrets, the final backup Job.
    for made in (
        secrets.superuser_secret(CLUSTER, password="p"),
        secrets.replication_secret(CLUSTER, password="p"),
        backup.final_backup_job(CLUSTER),
    ):
        writes.setdefault(made["kind"], set()).add("create")
    # Deletions: orphan-recreate, schedule removal, rolling update, volumes, failed Jobs,
    # Patroni's ConfigMaps on finalization.
    # The backup identity when spec.backup is removed.
    for kind in (
        "StatefulSet",
        "CronJob",
        "Pod",
        "PersistentVolumeClaim",
        "Job",
        "ConfigMap",
        "ServiceAccount",
        "Role",
        "RoleBinding",
    ):
        writes.setdefault(kind, set()).add("delete")
    writes["PersistentVolumeClaim"].add("patch")  # expand_volumes
    return writes


# --- coverage ----------------------------------------------------------------------------


@pytest.mark.parametrize(("group", "plural"), [(g, p) for g, _v, p, _k in operator.CHILD_RESOURCES])
@pytest.mark.parametrize("verb", ["get", "list", "watch"])
def test_every_watched_child_kind_can_be_read_cluster_wide(
    group: str, plural: str, verb: str
) -> None:
    assert allows(rbac.cluster_role(), group, plural, verb)


def test_every_kind_the_reconciler_writes_is_a_watched_child() -> None:
    assert set(reconciler_writes()) <= set(RESOURCE_OF_KIND)


@pytest.mark.parametrize(
    ("kind", "verb"),
    sorted((kind, verb) for kind, verbs in reconciler_writes().items() for verb in verbs),
)
def test_every_write_of_the_reconciler_is_allowed(kind: str, verb: str) -> None:
    group, plural = RESOURCE_OF_KIND[kind]
    assert allows(rbac.cluster_role(), group, plural, verb)


def test_the_operator_holds_every_right_it_grants_the_instance_pods_and_backup_jobs() -> None:
    # Without `escalate`, the API server refuses a Role that grants more than its creator has.
    role = rbac.cluster_role()
    for rule in (*instance_rbac.INSTANCE_RULES, *instance_rbac.BACKUP_RULES):
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert allows(role, group, resource, verb), (group, resource, verb)


@pytest.mark.parametrize(
    ("group", "resource", "verb"),
    [
        ("stateward.io", "postgresclusters", "watch"),
        ("stateward.io", "postgresclusters", "patch"),  # finalizer
        ("stateward.io", "postgresclusters/status", "patch"),
        ("stateward.io", "postgresclusters/finalizers", "update"),
        ("", "events", "create"),
        ("storage.k8s.io", "storageclasses", "get"),
        ("", "secrets", "create"),  # the shared webhook certificate
        ("admissionregistration.k8s.io", "validatingwebhookconfigurations", "create"),
    ],
)
def test_the_runtime_calls_are_allowed(group: str, resource: str, verb: str) -> None:
    assert allows(rbac.cluster_role(), group, resource, verb)


def test_only_our_own_webhook_configuration_may_be_read_or_changed() -> None:
    role = rbac.cluster_role()
    group = "admissionregistration.k8s.io"
    kind = "validatingwebhookconfigurations"
    assert not any("mutatingwebhookconfigurations" in r["resources"] for r in role["rules"])
    for verb in ("get", "patch", "update"):
        assert allows(role, group, kind, verb, name=rbac.WEBHOOK_CONFIGURATION)
        assert not allows(role, group, kind, verb, name="someone-elses")


def test_leases_are_granted_only_in_the_operator_namespace() -> None:
    assert not any("leases" in rule["resources"] for rule in rbac.cluster_role()["rules"])
    role = rbac.leader_election_role()
    assert role["kind"] == "Role"
    assert role["metadata"]["namespace"] == rbac.NAMESPACE
    for verb in ("get", "create", "update"):  # runtime/leader.py: get, create, replace
        assert allows(role, "coordination.k8s.io", "leases", verb)


def test_rights_the_code_does_not_use_are_not_granted() -> None:
    role = rbac.cluster_role()
    assert not allows(role, "", "pods", "create")
    assert not allows(role, "", "persistentvolumeclaims", "update")
    assert not allows(role, "", "secrets", "deletecollection")
    assert not any("*" in rule["verbs"] or "*" in rule["resources"] for rule in role["rules"])
    assert not any(
        verb in ("escalate", "bind", "impersonate") for r in role["rules"] for verb in r["verbs"]
    )


def test_rules_are_sorted_merged_and_stable() -> None:
    role = rbac.cluster_role()
    assert role == rbac.cluster_role()
    seen: set[tuple[str, str, tuple[str, ...]]] = set()
    for rule in role["rules"]:
        assert rule["verbs"] == sorted(set(rule["verbs"]))
        assert rule["resources"] == sorted(rule["resources"])
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                key = (group, resource, tuple(rule.get("resourceNames", ())))
                assert key not in seen, key
                seen.add(key)
    keys = [(r["apiGroups"], r["resources"], r.get("resourceNames", [])) for r in role["rules"]]
    assert keys == sorted(keys)


# --- generated files ---------------------------------------------------------------------


def test_committed_rbac_files_are_what_the_code_generates() -> None:
    for relative, text in rbac.rendered().items():
        assert (REPO / relative).read_text(encoding="utf-8") == text, relative
        assert yaml.safe_load(text) in (rbac.cluster_role(), rbac.leader_election_role())


def test_manifests_check_passes_on_the_committed_tree() -> None:
    assert cli(["manifests", "--check", "--root", str(REPO)]) == 0


def test_manifests_check_names_each_stale_file_then_manifests_writes_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    crd = manifests.crd_path(manifests.CRDS[0]())
    (tmp_path / crd).parent.mkdir(parents=True)
    (tmp_path / crd).write_text("stale\n")

    assert cli(["manifests", "--check", "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    for relative in (crd, rbac.CLUSTER_ROLE_PATH, rbac.LEADER_ELECTION_ROLE_PATH):
        assert f"stale: {relative}" in err
    assert not (tmp_path / rbac.CLUSTER_ROLE_PATH).exists()

    assert cli(["manifests", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"wrote {rbac.CLUSTER_ROLE_PATH}" in out
    assert (tmp_path / manifests.SAMPLE_PATH).is_file()
    assert cli(["manifests", "--check", "--root", str(tmp_path)]) == 0


# --- the kustomize tree ------------------------------------------------------------------


def documents(*relative: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for path in relative:
        found.extend(d for d in yaml.safe_load_all((REPO / path).read_text()) if d)
    return found


def one(kind: str, name: str) -> dict[str, Any]:
    paths = [str(p.relative_to(REPO)) for p in sorted((REPO / "config").rglob("*.yaml"))]
    matches = [d for d in documents(*paths) if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, (kind, name, len(matches))
    return matches[0]


def test_kustomizations_list_every_generated_file() -> None:
    crd_resources = documents("config/crd/kustomization.yaml")[0]["resources"]
    assert crd_resources == [
        str(manifests.crd_path(build()).relative_to("config/crd")) for build in manifests.CRDS
    ]
    rbac_resources = documents("config/rbac/kustomization.yaml")[0]["resources"]
    for relative in rbac.rendered():
        assert str(relative.relative_to("config/rbac")) in rbac_resources
    default = documents("config/default/kustomization.yaml")[0]
    assert default["namespace"] == rbac.NAMESPACE
    assert default["resources"] == ["../crd", "../rbac", "../manager", "../webhook"]


def test_bindings_give_the_roles_to_the_deployments_service_account() -> None:
    subject = {"kind": "ServiceAccount", "name": rbac.SERVICE_ACCOUNT, "namespace": rbac.NAMESPACE}
    binding = one("ClusterRoleBinding", rbac.CLUSTER_ROLE)
    assert binding["roleRef"]["kind"] == "ClusterRole"
    assert binding["roleRef"]["name"] == rbac.CLUSTER_ROLE
    assert binding["subjects"] == [subject]
    election = one("RoleBinding", rbac.LEADER_ELECTION_ROLE)
    assert election["roleRef"]["name"] == rbac.LEADER_ELECTION_ROLE
    assert election["subjects"] == [subject]
    one("ServiceAccount", rbac.SERVICE_ACCOUNT)
    pod = one("Deployment", "stateward-operator")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == rbac.SERVICE_ACCOUNT


def test_deployment_args_are_what_stateward_operator_parses() -> None:
    deployment = one("Deployment", "stateward-operator")
    assert deployment["spec"]["replicas"] == 2
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "ghcr.io/stateward/stateward:0.1.0"
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    # The kubelet expands $(POD_NAMESPACE) in args from the container's env.
    argv = [arg.replace("$(POD_NAMESPACE)", rbac.NAMESPACE) for arg in container["args"]]
    args = build_parser().parse_args(argv)
    assert args.handler.__name__ == "_operator"
    assert args.namespace == rbac.NAMESPACE
    assert args.webhook_service == "stateward-webhook"
    assert args.webhook_host is None
    assert not args.no_webhooks
    # Backup Jobs run the operator's own image: its pod's (POD_NAME), else this one.
    assert args.operator_image == container["image"]
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"probes": args.probe_port, "webhook": args.webhook_port}
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert container[probe]["httpGet"] == {"path": path, "port": "probes"}


def test_webhook_service_is_where_the_webhook_configuration_points() -> None:
    # The leader registers a service reference to --webhook-service on port 443.
    container = one("Deployment", "stateward-operator")["spec"]["template"]["spec"]["containers"][0]
    args = build_parser().parse_args(container["args"])
    service = one("Service", "stateward-webhook")
    assert args.webhook_service == service["metadata"]["name"]
    endpoint = webhook.Endpoint(
        namespace=rbac.NAMESPACE, port=args.webhook_port, service=args.webhook_service
    )
    assert service["spec"]["ports"] == [
        {
            "name": "webhook",
            "port": endpoint.client_config(b"")["service"]["port"],
            "targetPort": "webhook",
            "protocol": "TCP",
        }
    ]
    labels = one("Deployment", "stateward-operator")["spec"]["template"]["metadata"]["labels"]
    for name in ("stateward-webhook", "stateward-metrics"):
        assert one("Service", name)["spec"]["selector"].items() <= labels.items()
    assert one("Service", "stateward-metrics")["spec"]["ports"][0]["port"] == args.probe_port


def test_operator_pods_run_restricted() -> None:
    pod = one("Deployment", "stateward-operator")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    container = pod["containers"][0]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert "emptyDir" in next(v for v in pod["volumes"] if v["name"] == "tmp")
    assert {"requests", "limits"} <= set(container["resources"])


def test_bindings_give_a_subject_exactly_the_generated_roles() -> None:
    user = {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "someone"}
    cluster_binding, lease_binding = rbac.bindings(user, name="local", namespace="ops")
    assert cluster_binding["kind"] == "ClusterRoleBinding"
    assert cluster_binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": rbac.cluster_role()["metadata"]["name"],
    }
    assert lease_binding["kind"] == "RoleBinding"
    assert lease_binding["metadata"]["namespace"] == "ops"
    assert lease_binding["roleRef"]["name"] == rbac.leader_election_role("ops")["metadata"]["name"]
    assert cluster_binding["subjects"] == lease_binding["subjects"] == [user]
    # The Role for another namespace differs from config/'s only in its namespace.
    elsewhere = rbac.leader_election_role("ops")
    assert elsewhere["metadata"]["namespace"] == "ops"
    assert elsewhere["rules"] == rbac.leader_election_role()["rules"]
