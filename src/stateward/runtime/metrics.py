"""Prometheus metrics of the operator process."""

from __future__ import annotations

import dataclasses
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
WATCH_EVENTS = Counter(
    "stateward_watch_events_total",
    "Watch events received, by kind of object and whether they enqueued a reconcile"
    " (outcome reconcile, filtered: nothing that matters moved, or none: no owner known)",
    ["kind", "outcome"],
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
        self._seen: dict[tuple[str, str], tuple[str | None, ClusterSeries]] = {}
        """Per cluster: the resourceVersion its series were derived from, and them. A
        scrape decodes only the clusters that changed since the last (at a thousand
        clusters, decoding every body at every scrape cost a fifth of the operator's reads)."""

    def describe(self) -> Iterable[Metric]:
        return cluster_families([])

    def collect(self) -> Iterable[Metric]:
        store = self.source()
        if store is None:
            self._seen.clear()
            return cluster_families([])
        seen: dict[tuple[str, str], tuple[str | None, ClusterSeries]] = {}
        for ns, name in store.names(KIND):
            version = store.version(KIND, ns, name)
            known = self._seen.get((ns, name))
            if known is not None and version is not None and known[0] == version:
                seen[(ns, name)] = known
                continue
            body = store.get(KIND, ns, name)
            if body is not None:
                seen[(ns, name)] = (version, series(body))
        self._seen = seen
        return families([s for _, s in seen.values()])


@dataclasses.dataclass(frozen=True)
class ClusterSeries:
    """What one PostgresCluster contributes to the per-cluster families."""

    namespace: str
    name: str
    ready: bool
    ready_instances: int
    last_backup: float | None


def series(body: Mapping[str, Any]) -> ClusterSeries:
    """A PostgresCluster's values for :func:`families` (pure)."""
    status = body.get("status") or {}
    finished = rfc3339.parse(status.get("lastBackupTime"))
    return ClusterSeries(
        namespace=str(body["metadata"].get("namespace", "")),
        name=str(body["metadata"]["name"]),
        ready=status.get("phase") == "Ready",
        ready_instances=int(status.get("readyReplicas") or 0),
        last_backup=None if finished is None else finished.timestamp(),
    )


def cluster_families(clusters: Iterable[Mapping[str, Any]]) -> list[Metric]:
    """The per-cluster families of :class:`ClusterCollector` from cluster bodies (pure)."""
    return families([series(body) for body in clusters])


def families(clusters: Iterable[ClusterSeries]) -> list[Metric]:
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
    for cluster in sorted(clusters, key=lambda c: (c.namespace, c.name)):
        key = [cluster.namespace, cluster.name]
        ready.add_metric(key, 1 if cluster.ready else 0)
        instances.add_metric(key, cluster.ready_instances)
        if cluster.last_backup is not None:
            backup.add_metric(key, cluster.last_backup)
    return [ready, instances, backup]


CLUSTERS = ClusterCollector()
REGISTRY.register(CLUSTERS)
