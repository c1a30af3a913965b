"""The operator's per-cluster series: read from its store at scrape time."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from stateward.controllers.store import ObjectStore
from stateward.runtime import metrics
from tests.support.stores import CountingStore

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


def test_a_scrape_decodes_only_the_clusters_that_changed_since_the_last() -> None:
    store = CountingStore()
    store.observe(cluster("orders", phase="Creating"))
    store.observe(cluster("fresh", phase="Creating"))
    collector = metrics.ClusterCollector()
    collector.source = lambda: store
    registry = CollectorRegistry()
    registry.register(collector)
    generate_latest(registry)
    assert store.decoded == 2
    generate_latest(registry)
    assert store.decoded == 2, "nothing changed: nothing decoded"
    changed = cluster("orders", phase="Ready", readyReplicas=2)
    changed["metadata"]["resourceVersion"] = "2"
    store.observe(changed)
    text = generate_latest(registry).decode()
    assert store.decoded == 3
    assert 'stateward_cluster_ready{cluster="orders",namespace="shop"} 1.0' in text
    # A deleted cluster's series go with it.
    store.forget("PostgresCluster", "shop", "fresh")
    assert 'cluster="fresh"' not in generate_latest(registry).decode()
