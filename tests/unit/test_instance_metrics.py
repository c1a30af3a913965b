"""An instance's metrics: PostgreSQL's answer to the one scrape query, as Prometheus reads it."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from stateward.instance import metrics

pytestmark = pytest.mark.unit

PRIMARY: dict[str, Any] = {
    "in_recovery": False,
    "timeline": 3,
    "wal": 5000.0,
    "received": None,
    "replayed": None,
    "replayed_at": None,
    "now": 1000.0,
    "replicas": [
        {"name": "pg-2", "state": "streaming", "sync_state": "async", "replayed": 1000.0,
         "replay_lag": 2.5},
        {"name": "pg-1", "state": "streaming", "sync_state": "sync", "replayed": 5000.0,
         "replay_lag": None},
    ],
    "archiver": {"archived": 12, "failed": 1, "last_archived_at": 940.0, "last_failed_at": 900.0},
    "connections": {"active": 2, "idle": 5},
    "databases": [
        {"name": "postgres", "commits": 10, "rollbacks": 0, "size": 7000000},
        {"name": "app", "commits": 42, "rollbacks": 3, "size": 9000000},
    ],
}  # fmt: skip

REPLICA: dict[str, Any] = {
    **PRIMARY,
    "in_recovery": True,
    "wal": None,
    "received": 8000.0,
    "replayed": 6000.0,
    "replayed_at": 990.0,
    "replicas": [],
    "archiver": {"archived": 0, "failed": 0, "last_archived_at": None, "last_failed_at": None},
}


def scrape(document: dict[str, Any] | None, volume: tuple[int, int] | None = None) -> str:
    """What Prometheus receives for one scrape."""

    class Fixed:
        def collect(self) -> Any:
            return metrics.families(document, volume)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Fixed())  # type: ignore[arg-type]
    return generate_latest(registry).decode()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(found: dict[Any, float], name: str, **labels: str) -> float:
    return found[(name, tuple(sorted(labels.items())))]


def test_the_primary_reports_its_role_timeline_and_each_replicas_lag() -> None:
    found = samples(scrape(PRIMARY))
    assert value(found, "stateward_postgres_up") == 1
    assert value(found, "stateward_postgres_primary") == 1
    assert value(found, "stateward_postgres_timeline") == 3
    lag = "stateward_postgres_replica_lag_bytes"
    assert value(found, lag, replica="pg-2", sync_state="async") == 4000
    assert value(found, lag, replica="pg-1", sync_state="sync") == 0
    seconds = "stateward_postgres_replica_lag_seconds"
    assert value(found, seconds, replica="pg-2", sync_state="async") == 2.5
    assert value(found, seconds, replica="pg-1", sync_state="sync") == 0
    assert not [key for key in found if key[0].startswith("stateward_postgres_replay_lag")]


def test_a_replica_reports_how_far_its_replay_is_behind_what_it_received() -> None:
    found = samples(scrape(REPLICA))
    assert value(found, "stateward_postgres_primary") == 0
    assert value(found, "stateward_postgres_replay_lag_bytes") == 2000
    assert value(found, "stateward_postgres_replay_lag_seconds") == 10
    caught_up = samples(scrape({**REPLICA, "replayed": 8000.0}))
    assert value(caught_up, "stateward_postgres_replay_lag_bytes") == 0
    # No commit for an hour is not lag when everything received is replayed.
    assert value(caught_up, "stateward_postgres_replay_lag_seconds") == 0
    assert not [key for key in found if key[0].startswith("stateward_postgres_replica_lag")]


def test_archiving_connections_transactions_and_sizes() -> None:
    found = samples(scrape(PRIMARY))
    assert value(found, "stateward_postgres_wal_archived_total") == 12
    assert value(found, "stateward_postgres_wal_archive_failed_total") == 1
    assert value(found, "stateward_postgres_last_archive_age_seconds") == 60
    assert value(found, "stateward_postgres_connections", state="active") == 2
    assert value(found, "stateward_postgres_connections", state="idle") == 5
    # States with no connection are 0, not missing: a rate over them never breaks.
    assert value(found, "stateward_postgres_connections", state="idle in transaction") == 0
    transactions = "stateward_postgres_transactions_total"
    assert value(found, transactions, database="app", outcome="commit") == 42
    assert value(found, transactions, database="app", outcome="rollback") == 3
    assert value(found, "stateward_postgres_database_size_bytes", database="postgres") == 7e6
    never = samples(scrape(REPLICA))
    assert not [key for key in never if key[0] == "stateward_postgres_last_archive_age_seconds"]


def test_a_server_that_does_not_answer_is_down_and_its_volume_still_reported() -> None:
    found = samples(scrape(None, volume=(250, 1000)))
    assert value(found, "stateward_postgres_up") == 0
    assert value(found, "stateward_postgres_volume_used_bytes") == 250
    assert value(found, "stateward_postgres_volume_capacity_bytes") == 1000
    assert {key[0] for key in found} == {
        "stateward_postgres_up",
        "stateward_postgres_volume_used_bytes",
        "stateward_postgres_volume_capacity_bytes",
    }


class Run:
    def __init__(self, *, stdout: str = "", code: int = 0, raises: Exception | None = None):
        self.stdout, self.code, self.raises = stdout, code, raises
        self.argv: list[str] = []
        self.kwargs: dict[str, Any] = {}

    def __call__(self, argv: list[str], **kwargs: Any) -> Any:
        self.argv, self.kwargs = argv, kwargs
        if self.raises is not None:
            raise self.raises
        return subprocess.CompletedProcess(argv, self.code, self.stdout, "")


def test_the_question_goes_over_the_socket_with_deadlines() -> None:
    run = Run(stdout=json.dumps(PRIMARY) + "\n")
    assert metrics.ask("/usr/lib/postgresql/15/bin/psql", run=run) == PRIMARY
    assert run.argv[:3] == ["/usr/lib/postgresql/15/bin/psql", "-h", "/var/run/postgresql"]
    assert run.argv[-1] == metrics.QUERY
    assert run.kwargs["timeout"] == metrics.TIMEOUT
    env = run.kwargs["env"]
    assert env["PGCONNECT_TIMEOUT"] == "3" and "statement_timeout" in env["PGOPTIONS"]


@pytest.mark.parametrize(
    "run",
    [
        Run(code=2),
        Run(stdout="not json"),
        Run(stdout="[1]"),
        Run(raises=subprocess.TimeoutExpired("psql", 5)),
        Run(raises=FileNotFoundError("psql")),
    ],
)
def test_no_answer_of_any_kind_is_none(run: Run) -> None:
    assert metrics.ask("psql", run=run) is None


def test_usage_is_the_file_systems_used_and_total_bytes(tmp_path: Any) -> None:
    used, capacity = metrics.usage(str(tmp_path)) or (0, 0)
    assert 0 < used <= capacity
    assert metrics.usage(str(tmp_path / "missing")) is None
