"""The Helm chart (charts/stateward) with the real ``helm`` binary: it lints, renders exactly
what ``make deploy`` applies, refuses bad values naming the key, and installs, upgrades and
uninstalls the operator on the real nodes."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from lab.dataplane import create_cluster, fresh_namespace, ready
from lab.waiting import wait_for
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import Pod
from lightkube.resources.rbac_authorization_v1 import ClusterRole

from stateward.api import v1alpha1
from stateward.runtime import metrics, rbac
from stateward.specs.mariadb import servers as mysql_spec
from stateward.specs.postgres import statefulset
from stateward_local import binaries
from stateward_local.cluster import LocalCluster
from stateward_local.images import catalog
from stateward_local.run import PostgresClusterResource
from tests.conftest import client_for
from tests.integration.test_deploy import CRD_NAME, absent
from tests.support import clusters, incluster
from tests.unit import test_instance_metrics as instance_metrics
from tests.unit.test_specs_database import make_database

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "stateward"
RELEASE = "stateward"
DIGEST = "sha256:" + "0123456789abcdef" * 4
PINNED = f"ghcr.io/stateward/postgres-instance:17@{DIGEST}"
HELM_ONLY_LABELS = (
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
)


@pytest.fixture(scope="module")
def helm_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Helm's own configuration, cache and data in a temporary home: never the user's."""
    home = tmp_path_factory.mktemp("helm")
    return {
        **os.environ,
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_DATA_HOME": str(home / "data"),
    }


def helm(
    env: dict[str, str], *args: str, cluster: LocalCluster | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    if cluster is not None:
        env = {**env, "KUBECONFIG": str(cluster.kubeconfig)}
    result = subprocess.run(
        [str(binaries.locate().helm), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if check:
        assert result.returncode == 0, f"helm {' '.join(args)}:\n{result.stdout}{result.stderr}"
    return result


def render(env: dict[str, str], *values: str) -> list[dict[str, Any]]:
    """``helm template`` of the chart in stateward-system with ``--set`` VALUES."""
    sets = [arg for value in values for arg in ("--set", value)]
    out = helm(env, "template", RELEASE, str(CHART), "--namespace", rbac.NAMESPACE, *sets).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def one(documents: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [d for d in documents if d["kind"] == kind]
    return found


def operator_args(documents: list[dict[str, Any]]) -> list[str]:
    (container,) = one(documents, "Deployment")["spec"]["template"]["spec"]["containers"]
    return list(container["args"])


def without_helm_bookkeeping(document: dict[str, Any]) -> dict[str, Any]:
    """The object as kustomize would make it: no release labels, no keep annotation."""
    document = copy.deepcopy(document)
    metas = [document["metadata"]]
    if document["kind"] == "Deployment":
        metas.append(document["spec"]["template"]["metadata"])
    for meta in metas:
        for label in HELM_ONLY_LABELS:
            meta.get("labels", {}).pop(label, None)
        meta.get("annotations", {}).pop("helm.sh/resource-policy", None)
        for key in ("labels", "annotations"):
            if key in meta and not meta[key]:
                del meta[key]
    return document


def by_identity(documents: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in documents}


def test_the_chart_lints_and_follows_the_package_version(helm_env: dict[str, str]) -> None:
    result = helm(helm_env, "lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in result.stdout, result.stdout
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == catalog.stateward_version()
    deployment = one(render(helm_env), "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == catalog.OPERATOR_REF


def test_the_default_rendering_is_what_make_deploy_applies(helm_env: dict[str, str]) -> None:
    kustomized = subprocess.run(
        [str(binaries.locate().kubectl), "kustomize", "config/default"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    # The chart leaves the namespace to `helm install --create-namespace` (or to the user).
    expected = by_identity(
        [d for d in yaml.safe_load_all(kustomized) if d and d["kind"] != "Namespace"]
    )
    rendered = by_identity([without_helm_bookkeeping(d) for d in render(helm_env)])

    assert sorted(rendered) == sorted(expected)
    for identity, document in expected.items():
        assert rendered[identity] == document, f"{identity} differs between the chart and config/"


def test_values_change_what_they_say(helm_env: dict[str, str]) -> None:
    assert operator_args(render(helm_env))[-1] == "--log-level=INFO"
    tuned = render(
        helm_env,
        "logLevel=DEBUG",
        "watchNamespaces={team-a,team-b}",
        "replicaCount=3",
        "image.repository=registry.example/stateward",
        "image.tag=0.1.0-rc1",
        "crds.create=false",
        "allowForeignRepositoryPaths=true",
        f"image.digest={DIGEST}",
        f"pinnedImages={{{PINNED}}}",
    )
    args = operator_args(tuned)
    # Pinned by digest: the operator itself, and what it starts.
    assert f"--pin-image={PINNED}" in args
    assert not [a for a in operator_args(render(helm_env)) if a.startswith("--pin-image")]
    assert "--log-level=DEBUG" in args
    # Off by default: no cluster may name another namespace's backups.
    assert "--allow-foreign-repository-paths" in args
    assert "--allow-foreign-repository-paths" not in operator_args(render(helm_env))
    assert [a for a in args if a.startswith("--watch-namespace=")] == [
        "--watch-namespace=team-a",
        "--watch-namespace=team-b",
    ]
    deployment = one(tuned, "Deployment")
    assert deployment["spec"]["replicas"] == 3
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"registry.example/stateward:0.1.0-rc1@{DIGEST}"
    # Backup Jobs run the operator's own image (when it cannot read its pod, this one).
    assert f"--operator-image={container['image']}" in args
    assert not [d for d in tuned if d["kind"] == "CustomResourceDefinition"]
    crds = [d for d in render(helm_env) if d["kind"] == "CustomResourceDefinition"]
    assert sorted(c["metadata"]["name"] for c in crds) == [
        "databases.stateward.io",
        "postgresclusters.stateward.io",
    ]
    assert all(c["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep" for c in crds)


def test_a_service_monitor_needs_its_kind_and_then_scrapes_the_metrics_port(
    helm_env: dict[str, str],
) -> None:
    refused = helm(
        helm_env, "template", RELEASE, str(CHART), "--set", "metrics.serviceMonitor.enabled=true",
        check=False,
    )  # fmt: skip
    assert refused.returncode != 0
    assert "metrics.serviceMonitor.enabled" in refused.stderr, refused.stderr
    assert "prometheus-operator" in refused.stderr, refused.stderr

    out = helm(
        helm_env, "template", RELEASE, str(CHART), "--namespace", rbac.NAMESPACE,
        "--api-versions", "monitoring.coreos.com/v1/ServiceMonitor",
        "--set", "metrics.serviceMonitor.enabled=true",
        "--set", "metrics.serviceMonitor.labels.release=prometheus",
    ).stdout  # fmt: skip
    monitor = one([d for d in yaml.safe_load_all(out) if d], "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics",
                                             "interval": "30s"}]  # fmt: skip


def test_the_database_metrics_get_a_pod_monitor_and_alerts_when_asked(
    helm_env: dict[str, str],
) -> None:
    refused = helm(
        helm_env, "template", RELEASE, str(CHART), "--set", "metrics.prometheusRule.enabled=true",
        "--api-versions", "monitoring.coreos.com/v1/PodMonitor", check=False,
    )  # fmt: skip
    assert refused.returncode != 0 and "metrics.prometheusRule.enabled" in refused.stderr
    out = helm(
        helm_env, "template", RELEASE, str(CHART), "--namespace", rbac.NAMESPACE,
        "--api-versions", "monitoring.coreos.com/v1/PodMonitor",
        "--api-versions", "monitoring.coreos.com/v1/PrometheusRule",
        "--set", "metrics.podMonitor.enabled=true",
        "--set", "metrics.prometheusRule.enabled=true",
        "--set", "metrics.prometheusRule.replicaLagSeconds=30",
    ).stdout  # fmt: skip
    documents = [d for d in yaml.safe_load_all(out) if d]
    monitors = {d["metadata"]["name"]: d for d in documents if d["kind"] == "PodMonitor"}
    assert set(monitors) == {"stateward-postgres", "stateward-mariadb"}
    monitor = monitors["stateward-postgres"]
    # Every instance pod, in every namespace, selected as the operator labels them.
    cluster = clusters.make_cluster()
    pod_labels = statefulset.statefulset(cluster, config_hash="x")["spec"]["template"]["metadata"][
        "labels"
    ]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("metrics", "/metrics")
    ports = statefulset.statefulset(cluster, config_hash="x")["spec"]["template"]["spec"][
        "containers"
    ][0]["ports"]
    assert {"name": "metrics", "containerPort": 9187} in ports
    # And every MariaDB server, on its exporter's port of the same name.
    database = mysql_spec.statefulset(make_database(), config_hash="x")["spec"]["template"]
    mariadb = monitors["stateward-mariadb"]
    selected = mariadb["spec"]["selector"]["matchLabels"]
    assert selected.items() <= database["metadata"]["labels"].items()
    assert {"name": "metrics", "containerPort": 9104} in database["spec"]["containers"][0]["ports"]
    assert [e["port"] for e in mariadb["spec"]["podMetricsEndpoints"]] == ["metrics"]
    rules = one(documents, "PrometheusRule")["spec"]["groups"][0]["rules"]
    alerts = {rule["alert"]: rule for rule in rules}
    assert set(alerts) == {
        "StatewardPostgresDown",
        "StatewardPrimaryMissing",
        "StatewardReplicaLagging",
        "StatewardWALArchiveFailing",
        "StatewardWALArchiveStale",
        "StatewardVolumeAlmostFull",
        "StatewardFailoverHappened",
        "StatewardBackupTooOld",
    }
    assert alerts["StatewardReplicaLagging"]["expr"].endswith("> 30")
    # Every series an alert reads is one the instances or the operator serve.
    served = served_series()
    for rule in rules:
        used = set(re.findall(r"stateward_[a-z_]+", rule["expr"]))
        assert used and used <= served, (rule["alert"], used - served)
        assert "{{ $labels." in rule["annotations"]["summary"], "Prometheus templates survive Helm"


def test_the_dashboard_ships_for_grafanas_sidecar_and_reads_only_served_series(
    helm_env: dict[str, str],
) -> None:
    out = helm(
        helm_env, "template", RELEASE, str(CHART), "--set", "metrics.grafanaDashboard.enabled=true",
    ).stdout  # fmt: skip
    config_map = one([d for d in yaml.safe_load_all(out) if d], "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(config_map["data"]["stateward-postgres.json"])
    assert dashboard["uid"] == "stateward-postgres"
    expressions = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    served = served_series()
    for expr in expressions:
        used = set(re.findall(r"stateward_[a-z_]+", expr))
        assert used and used <= served, (expr, used - served)
        assert 'cluster="$cluster"' in expr, expr
    off = helm(helm_env, "template", RELEASE, str(CHART)).stdout
    assert "stateward-postgres-dashboard" not in off


def served_series() -> set[str]:
    """Every series the instances (on a primary or a replica) and the operator serve."""
    return {
        name
        for document in (instance_metrics.PRIMARY, instance_metrics.REPLICA)
        for name, _ in instance_metrics.samples(instance_metrics.scrape(document, (1, 2)))
    } | {family.name for family in metrics.cluster_families([])}


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("logLevel=LOUD", "logLevel"),
        ("replicaCount=0", "replicaCount"),
        ("watchNamespaces={Team_A}", "watchNamespaces"),
        ("image.pullPolicy=Sometimes", "pullPolicy"),
        ("image.digest=sha256:abc", "digest"),
        ("pinnedImages={ghcr.io/stateward/postgres-instance:17}", "pinnedImages"),
        ("replicas=3", "replicas"),  # not a key of this chart: replicaCount is
    ],
)
def test_bad_values_are_refused_naming_the_key(
    helm_env: dict[str, str], value: str, named: str
) -> None:
    result = helm(helm_env, "template", RELEASE, str(CHART), "--set", value, check=False)
    assert result.returncode != 0, result.stdout[:500]
    assert named in result.stderr, result.stderr


def test_helm_installs_upgrades_and_uninstalls_the_operator_on_the_real_nodes(
    real_cluster: LocalCluster, helm_env: dict[str, str]
) -> None:
    kube = client_for(real_cluster)
    # Installed as a release should be: the operator and the instances it starts by digest
    # (the local cluster names its images by digest, as a registry pull would).
    pins = real_cluster.image_pins()
    operator_image = f"{catalog.OPERATOR_REPOSITORY}/stateward:{catalog.stateward_version()}"
    instance_image = f"{v1alpha1.DEFAULT_IMAGE_REPOSITORY}:15"
    install = (
        "upgrade", "--install", RELEASE, str(CHART), "--namespace", rbac.NAMESPACE,
        "--create-namespace",
        # Earlier tests installed the CRD and the ClusterRole without Helm: adopt them, as a
        # user moving from `make deploy` or `kubectl apply` to the chart would.
        "--take-ownership",
        "--set", f"image.digest={pins[operator_image]}",
        "--set", f"pinnedImages={{{instance_image}@{pins[instance_image]}}}",
    )  # fmt: skip
    helm(helm_env, *install, cluster=real_cluster)
    try:
        incluster.wait_running(kube, rbac.NAMESPACE, replicas=2)
        wait_for(
            lambda: incluster.webhook_points_at_the_service(kube, rbac.NAMESPACE),
            what="the leader to point the webhook configuration at its Service",
        )
        with fresh_namespace(kube) as watched, fresh_namespace(kube) as elsewhere:
            # The upgrade narrows the operator to one namespace and raises its log level.
            helm(
                helm_env, *install, "--set", f"watchNamespaces={{{watched}}}",
                "--set", "logLevel=DEBUG", cluster=real_cluster,
            )  # fmt: skip
            incluster.wait_running(kube, rbac.NAMESPACE, replicas=2)
            for pod in incluster.pods(kube, rbac.NAMESPACE):
                (container,) = pod.spec.containers  # type: ignore[union-attr]
                assert f"--watch-namespace={watched}" in (container.args or [])
                assert "--log-level=DEBUG" in (container.args or [])
                assert container.image == f"{operator_image}@{pins[operator_image]}"

            create_cluster(kube, elsewhere, "ignored", replicas=1)
            create_cluster(kube, watched, "served", replicas=1)
            ready(kube, watched, "served")
            served = kube.get(Pod, "served-0", namespace=watched)
            assert {c.image for c in served.spec.containers} == {  # type: ignore[union-attr]
                f"{instance_image}@{pins[instance_image]}"
            }
            ignored = kube.get(PostgresClusterResource, "ignored", namespace=elsewhere)
            assert not ignored.get("status") and not ignored["metadata"].get("finalizers"), (
                "a PostgresCluster outside watchNamespaces was reconciled"
            )
            kube.delete(PostgresClusterResource, "served", namespace=watched)
            kube.delete(PostgresClusterResource, "ignored", namespace=elsewhere)
            wait_for(
                lambda: absent(kube, PostgresClusterResource, "served", watched),
                what="the watched cluster deleted by the operator",
                timeout=120,
            )
        revisions = helm(helm_env, "history", RELEASE, "-n", rbac.NAMESPACE, cluster=real_cluster)
        assert len(revisions.stdout.strip().splitlines()) == 3, revisions.stdout  # header + 2
    finally:
        helm(helm_env, "uninstall", RELEASE, "-n", rbac.NAMESPACE, "--wait",
             cluster=real_cluster)  # fmt: skip

    assert absent(kube, Deployment, incluster.DEPLOYMENT, rbac.NAMESPACE)
    assert absent(kube, ClusterRole, rbac.CLUSTER_ROLE)
    # The webhook configuration went with the ClusterRole that owns it.
    wait_for(
        lambda: absent(kube, incluster.ValidatingWebhookConfiguration, "stateward.io"),
        what="the webhook configuration removed with the operator's ClusterRole",
    )
    # The CRDs stay: removing them would delete every PostgresCluster and its data.
    assert kube.get(CustomResourceDefinition, CRD_NAME).metadata is not None
