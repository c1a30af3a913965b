"""Prometheus metrics of the operator process."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from stateward import rfc3339
from stateward.api.v1alpha1 import KIND
from stateward.controllers.store import ObjectStore

REGISTRY = CollectorRegistry(auto_describe=True)

RECONCILES = Counter(
    "stateward_reconcile_total",
    "Reconciles run, by resource kind and result",
    ["kind", "result"],
    registry=REGISTRY,
)
RECONCILE_ERRORS = Counter(
    "stateward_reconcile_errors_total",
    "Reconciles that raised and were requeued with backoff",
    ["kind"],
    registry=REGISTRY,
)
RECONCILE_SECONDS = Histogram(
    "stateward_reconcile_duration_seconds",
    "Time spent in one reconcile",
    ["kind"],
    registry=REGISTRY,
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
API_WRITES = Counter(
    "stateward_api_writes_total",
    "Write requests sent to the API server, by verb and kind",
    ["verb", "kind"],
    registry=REGISTRY,
)
EVENTS_FILTERED = Counter(
    "stateward_watch_events_filtered_total",
    "Child watch events that caused no reconcile: only WAL positions or the leader lock's"
    " renewal moved",
    registry=REGISTRY,
)
EVENTS = Counter(
    "stateward_events_total",
    "Events recorded on PostgresClusters, by reason (Failover, SwitchedOver,"
    " SwitchoverFailed, InstanceRestarted, ...) and type",
    ["reason", "type"],
    registry=REGISTRY,
)
LEADER = Gauge(
    "stateward_leader",
    "1 while this process holds the leader Lease",
    registry=REGISTRY,
)
QUEUE_DEPTH = Gauge(
    "stateward_workqueue_depth",
    "Keys waiting in the reconcile queue",
    registry=REGISTRY,
)
WATCHED_OBJECTS = Gauge(
    "stateward_watched_objects",
    "Objects held in the operator's observation store",
    registry=REGISTRY,
)
WEBHOOK_CERT_MISMATCH = Gauge(
    "stateward_webhook_certificate_mismatch",
    "1 while the certificate this replica's webhook port serves (read back by a TLS handshake)"
    " differs from the one in the Secret stateward-webhook-cert",
    registry=REGISTRY,
)
WEBHOOK_CERT_EXPIRY = Gauge(
    "stateward_webhook_certificate_expiry_timestamp_seconds",
    "When the certificate this replica's webhook serves expires (Unix time)",
    registry=REGISTRY,
)
WEBHOOK_CERT_RELOADS = Counter(
    "stateward_webhook_certificate_reloads_total",
    "Times a changed certificate from the Secret was loaded into the running webhook",
    registry=REGISTRY,
)


class ClusterCollector(Collector):
    """Per-cluster series from the PostgresClusters in the operator's store, read at scrape
    time: whether each is Ready, its ready instances, and when its last backup finished
    (the alert on a backup too old reads it: the age lives in the repository, which only
    the operator follows). Empty while this replica does not lead (its store is empty)."""

    def __init__(self) -> None:
        self.source: Callable[[], ObjectStore | None] = lambda: None

    def describe(self) -> Iterable[Metric]:
        return cluster_families([])

    def collect(self) -> Iterable[Metric]:
        store = self.source()
        if store is None:
            return cluster_families([])
        bodies = (store.get(KIND, ns, name) for ns, name in store.names(KIND))
        return cluster_families([b for b in bodies if b is not None])


def cluster_families(clusters: Iterable[Mapping[str, Any]]) -> list[Metric]:
    """The per-cluster families of :class:`ClusterCollector` (pure)."""
    labels = ["namespace", "cluster"]
    ready = GaugeMetricFamily(
        "stateward_cluster_ready", "1 while the PostgresCluster is Ready", labels=labels
    )
    instances = GaugeMetricFamily(
        "stateward_cluster_ready_instances", "Ready instances of the PostgresCluster", labels=labels
    )
    backup = GaugeMetricFamily(
        "stateward_cluster_last_backup_timestamp_seconds",
        "When the PostgresCluster's last successful backup finished (Unix time)",
        labels=labels,
    )
    for body in sorted(
        clusters, key=lambda b: (b["metadata"].get("namespace", ""), b["metadata"]["name"])
    ):
        key = [str(body["metadata"].get("namespace", "")), str(body["metadata"]["name"])]
        status = body.get("status") or {}
        ready.add_metric(key, 1 if status.get("phase") == "Ready" else 0)
        instances.add_metric(key, int(status.get("readyReplicas") or 0))
        finished = rfc3339.parse(status.get("lastBackupTime"))
        if finished is not None:
            backup.add_metric(key, finished.timestamp())
    return [ready, instances, backup]


CLUSTERS = ClusterCollector()
REGISTRY.register(CLUSTERS)
