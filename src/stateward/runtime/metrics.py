"""Prometheus metrics of the operator process."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

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
