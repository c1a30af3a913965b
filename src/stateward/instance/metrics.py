"""Prometheus metrics of one instance, served by its supervisor on :data:`PORT`.

Each scrape asks PostgreSQL once, over the pod's own socket as the superuser (``local all
all trust``: only the instance container reaches that socket), with one statement that
returns everything as a JSON document (:data:`QUERY`); :func:`families` turns the document
into metric families. That split keeps the mapping pure and tested without a server. A
server that does not answer within :data:`TIMEOUT` seconds scrapes as
``stateward_postgres_up 0`` and nothing else: an instance being fenced, starting or
restarting is down, not missing.

Plain HTTP, like postgres_exporter and CloudNativePG's default: the metrics carry no
credential, and the cluster's NetworkPolicy decides who may scrape
(``spec.networkPolicy.metrics``).
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final

from prometheus_client import start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from stateward.instance import localsql, queries

PORT: Final = 9187
"""postgres_exporter's port, which dashboards and scrape configs expect."""
PORT_NAME: Final = "metrics"
TIMEOUT: Final = 5.0
PREFIX: Final = "stateward_postgres_"

QUERY: Final = """\
select json_build_object(
  'in_recovery', pg_is_in_recovery(),
  'timeline', (select timeline_id from pg_control_checkpoint()),
  'wal', case when pg_is_in_recovery() then null
              else pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0') end,
  'received', pg_wal_lsn_diff(pg_last_wal_receive_lsn(), '0/0'),
  'replayed', pg_wal_lsn_diff(pg_last_wal_replay_lsn(), '0/0'),
  'replayed_at', extract(epoch from pg_last_xact_replay_timestamp()),
  'now', extract(epoch from clock_timestamp()),
  'replicas', (select coalesce(json_agg(json_build_object(
      'name', application_name, 'state', state, 'sync_state', sync_state,
      'replayed', pg_wal_lsn_diff(replay_lsn, '0/0'),
      'replay_lag', extract(epoch from replay_lag))), '[]')
    from pg_stat_replication),
  'archiver', (select json_build_object(
      'archived', archived_count, 'failed', failed_count,
      'last_archived_at', extract(epoch from last_archived_time),
      'last_failed_at', extract(epoch from last_failed_time))
    from pg_stat_archiver),
  'connections', (select coalesce(json_object_agg(state, n), '{}') from (
      select coalesce(state, 'unknown') as state, count(*) as n from pg_stat_activity
      where backend_type = 'client backend' and pid <> pg_backend_pid() group by 1) c),
  'databases', (select coalesce(json_agg(json_build_object(
      'name', datname, 'commits', xact_commit, 'rollbacks', xact_rollback,
      'size', pg_database_size(datname))), '[]')
    from pg_stat_database where datname is not null and datname not like 'template%')
)"""
"""Everything a scrape reports, in one round trip; the same on a primary and a replica."""

CONNECTION_STATES: Final = (
    "active",
    "idle",
    "idle in transaction",
    "idle in transaction (aborted)",
    "fastpath function call",
    "disabled",
)
"""Always reported (0 when none), so a rate or an alert never sees a series vanish."""


def families(document: Mapping[str, Any] | None, volume: tuple[int, int] | None) -> list[Metric]:
    """The metric families of one scrape: ``document`` is :data:`QUERY`'s answer (None when
    PostgreSQL did not answer), ``volume`` the data volume's (used, capacity) in bytes."""
    up = GaugeMetricFamily(PREFIX + "up", "1 when PostgreSQL answered this scrape")
    up.add_metric([], 0 if document is None else 1)
    result: list[Metric] = [up]
    if volume is not None:
        used, capacity = volume
        result.append(_gauge("volume_used_bytes", "Bytes used on the data volume", used))
        result.append(_gauge("volume_capacity_bytes", "Size of the data volume", capacity))
    if document is None:
        return result
    primary = not document["in_recovery"]
    result.append(_gauge("primary", "1 on the primary, 0 on a replica", 1 if primary else 0))
    result.append(_gauge("timeline", "The timeline of the last checkpoint", document["timeline"]))
    result.extend(_replication(document, primary))
    result.extend(_archiver(document))
    connections = GaugeMetricFamily(
        PREFIX + "connections", "Client connections by state", labels=["state"]
    )
    counts = dict(document.get("connections") or {})
    for state in sorted(set(CONNECTION_STATES) | counts.keys()):
        connections.add_metric([state], counts.get(state, 0))
    result.append(connections)
    transactions = CounterMetricFamily(
        PREFIX + "transactions",
        "Transactions ended, by database and outcome",
        labels=["database", "outcome"],
    )
    sizes = GaugeMetricFamily(
        PREFIX + "database_size_bytes", "Size of each database", labels=["database"]
    )
    for database in sorted(document.get("databases") or [], key=lambda d: str(d["name"])):
        transactions.add_metric([database["name"], "commit"], database["commits"])
        transactions.add_metric([database["name"], "rollback"], database["rollbacks"])
        sizes.add_metric([database["name"]], database["size"])
    result.extend([transactions, sizes])
    return result


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, documentation, value=value)


def _replication(document: Mapping[str, Any], primary: bool) -> Iterator[Metric]:
    """On the primary, how far each replica is behind (bytes of WAL not yet replayed there,
    and PostgreSQL's own replay_lag); on a replica, how far its replay is behind what it
    received (bytes, and seconds since the last replayed commit while it is behind)."""
    if primary:
        behind = GaugeMetricFamily(
            PREFIX + "replica_lag_bytes",
            "WAL the primary wrote that each replica has not replayed",
            labels=["replica", "sync_state"],
        )
        seconds = GaugeMetricFamily(
            PREFIX + "replica_lag_seconds",
            "Each replica's replay lag as the primary measures it",
            labels=["replica", "sync_state"],
        )
        for replica in sorted(document.get("replicas") or [], key=lambda r: str(r["name"])):
            labels = [str(replica["name"]), str(replica.get("sync_state") or "unknown")]
            written, replayed = document.get("wal"), replica.get("replayed")
            if written is not None and replayed is not None:
                behind.add_metric(labels, max(0.0, float(written) - float(replayed)))
            seconds.add_metric(labels, float(replica.get("replay_lag") or 0.0))
        yield behind
        yield seconds
        return
    received, replayed = document.get("received"), document.get("replayed")
    gap = max(0.0, float(received) - float(replayed)) if received and replayed else 0.0
    yield _gauge("replay_lag_bytes", "WAL this replica received and has not replayed", gap)
    replayed_at = document.get("replayed_at")
    late = float(document["now"]) - float(replayed_at) if gap and replayed_at else 0.0
    yield _gauge(
        "replay_lag_seconds",
        "Seconds since the last replayed commit while replay is behind (0 when caught up)",
        max(0.0, late),
    )


def _archiver(document: Mapping[str, Any]) -> Iterator[Metric]:
    archiver = document.get("archiver") or {}
    yield CounterMetricFamily(
        PREFIX + "wal_archived",
        "WAL segments archived",
        value=archiver.get("archived") or 0,
    )
    yield CounterMetricFamily(
        PREFIX + "wal_archive_failed",
        "Failed attempts to archive a WAL segment",
        value=archiver.get("failed") or 0,
    )
    last = archiver.get("last_archived_at")
    if last is not None:
        yield _gauge(
            "last_archive_age_seconds",
            "Seconds since the last WAL segment was archived",
            max(0.0, float(document["now"]) - float(last)),
        )


def ask(psql: str, run: Callable[..., Any] = subprocess.run) -> Mapping[str, Any] | None:
    """:data:`QUERY` through ``psql`` on the pod's socket; None if PostgreSQL did not answer."""
    document = localsql.json_answer(
        psql,
        QUERY,
        user="postgres",
        timeout=TIMEOUT,
        statement_timeout_ms=int(TIMEOUT * 1000) - 1000,
        run=run,
    )
    return document if isinstance(document, dict) else None


def usage(path: str) -> tuple[int, int] | None:
    """The (used, capacity) bytes of the file system holding ``path``."""
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    capacity = stat.f_blocks * stat.f_frsize
    return capacity - stat.f_bfree * stat.f_frsize, capacity


class InstanceCollector(Collector):
    """One scrape, one question to PostgreSQL, then the cluster's custom queries, if any
    (:mod:`stateward.instance.queries`); scrapes never overlap (a lock)."""

    def __init__(self, psql: str, data_dir: str, queries_dir: str = queries.DIRECTORY) -> None:
        self.psql, self.data_dir = psql, data_dir
        self.custom = queries.Custom(psql, queries_dir)
        self._lock = threading.Lock()

    def collect(self) -> Sequence[Metric]:
        with self._lock:
            document = ask(self.psql)
            primary = None if document is None else not document.get("in_recovery")
            return [
                *families(document, usage(self.data_dir)),
                *self.custom.collect(primary),
            ]


def serve(psql: str, data_dir: str, port: int = PORT) -> None:
    """Serve ``/metrics`` on ``port`` from a daemon thread."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(InstanceCollector(psql, data_dir))
    start_http_server(port, addr="0.0.0.0", registry=registry)  # noqa: S104 - the pod's port
