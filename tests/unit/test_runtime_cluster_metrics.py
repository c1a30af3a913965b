"""The operator's per-cluster series: read from its store at scrape time."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from stateward.controllers.store import ObjectStore
from stateward.runtime import metrics

pytestmark = pytest.mark.unit


def cluster(name: str, **status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "stateward.io/v1alpha1",
        "kind": "PostgresCluster",
        "metadata": {"name": name, "namespace": "shop", "uid": name, "resourceVersion": "1"},
        "status": status,
    }


def scrape(store: ObjectStore | None) -> dict[tuple[str, str], float]:
    collector = metrics.ClusterCollector()
    collector.source = lambda: store
    registry = CollectorRegistry()
    registry.register(collector)
    return {
        (sample.name, sample.labels["cluster"]): sample.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for sample in family.samples
    }


def test_each_cluster_reports_readiness_instances_and_its_last_backup() -> None:
    store = ObjectStore()
    store.observe(
        cluster("orders", phase="Ready", readyReplicas=3, lastBackupTime="2026-12-04T03:00:00Z")
    )
    store.observe(cluster("fresh", phase="Creating", readyReplicas=1))
    found = scrape(store)
    assert found[("stateward_cluster_ready", "orders")] == 1
    assert found[("stateward_cluster_ready", "fresh")] == 0
    assert found[("stateward_cluster_ready_instances", "orders")] == 3
    assert found[("stateward_cluster_last_backup_timestamp_seconds", "orders")] == 1796353200
    # Never backed up: no series, so no "backup too old" alert for a cluster without backups.
    assert ("stateward_cluster_last_backup_timestamp_seconds", "fresh") not in found


def test_a_replica_that_does_not_lead_reports_no_cluster() -> None:
    assert scrape(None) == {}
    assert scrape(ObjectStore()) == {}
