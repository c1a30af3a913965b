"""The MariaDB fault benchmark stays runnable without running it (it needs root, real nodes
and most of an hour): its flags parse, it runs every fault of the MariaDB matrix alike, its
table puts PostgreSQL's number for the same fault beside ours, and a violation fails it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from bench import chaos, mariadb
from lab.database_faults import FAULTS, POSTGRES_TWIN, Outcome

pytestmark = pytest.mark.unit

POSTGRES_DOC = """# Benchmarks

## Failures

`make bench-faults` (2026-11-30, 5 runs of each fault, one 3-instance cluster).

| fault | runs | write downtime s, median / worst | new primary after s, median / worst | lost | two | vs |
| --- | ---: | --- | --- | ---: | ---: | --- |
| node-freeze | 5 | 23.0 / 23.3 | 22.2 / 23.3 | 0 | 0 | - |
| pod-delete | 5 | 2.2 / 2.4 | 2.3 / 2.5 | 0 | 0 | - |
| postgres-kill | 5 | 4.7 / 5.1 | - | 0 | 0 | - |

## Bare Patroni reference

| node-freeze | 5 | 99.0 / 99.0 | - | 0 | 0 | - |
"""  # noqa: E501


def tallies() -> dict[str, chaos.Tally]:
    found: dict[str, chaos.Tally] = {}
    found["pod-delete"] = chaos.Tally()
    chaos.record(found, Outcome("pod-delete", "mf-0", "mf-1", 2.5, ["a", "b"], 2.0))
    chaos.record(found, Outcome("pod-delete", "mf-1", "mf-2", 6.0, ["b", "c"], 4.8))
    found["mariadbd-kill"] = chaos.Tally(
        runs=1, violations=["mf: writes acknowledged by [a, b, a]"]
    )
    return found


def test_defaults_run_every_fault_five_times() -> None:
    assert mariadb.parse([]).runs == 5 and not mariadb.parse([]).no_doc
    assert mariadb.parse(["--runs", "2", "--only", "pod-delete"]).only == ["pod-delete"]
    assert set(POSTGRES_TWIN) <= set(FAULTS), "every twin names a MariaDB fault"


def test_postgres_medians_come_from_the_failures_table_only() -> None:
    medians, measured = mariadb.postgres_medians(POSTGRES_DOC)
    assert medians == {"node-freeze": 23.0, "pod-delete": 2.2, "postgres-kill": 4.7}
    assert measured == "2026-11-30"
    assert mariadb.postgres_medians("# Benchmarks\n") == ({}, "")


def test_the_table_has_a_row_per_fault_beside_postgres_for_the_same_fault() -> None:
    from bench import faults as bench_faults

    result = bench_faults.summarize(tallies())
    postgres, _ = mariadb.postgres_medians(POSTGRES_DOC)
    lines = mariadb.rows(result, postgres)
    assert lines[2] == "| mariadbd-kill | 1 | - | - | 0 | 1 | 4.7 s (postgres-kill) |"
    assert lines[3] == "| pod-delete | 2 | 4.2 / 6.0 | 3.4 / 4.8 | 0 | 0 | 2.2 s (pod-delete) |"
    result["faults"]["replica-node-freeze"] = dict(result["faults"]["pod-delete"])
    assert mariadb.rows(result, postgres)[-1].endswith("| - |"), "no PostgreSQL twin"


def test_the_doc_section_is_replaced_between_its_markers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench import faults as bench_faults

    doc = tmp_path / "benchmarks.md"
    doc.write_text(POSTGRES_DOC)
    monkeypatch.setattr(mariadb, "DOC", doc)
    result = {**bench_faults.summarize(tallies()), "runs": 5, "when": "2026-12-03"}
    mariadb.write_doc(result, {}, "2026-11-30")
    first = doc.read_text()
    assert mariadb.SECTION in first and "Measured 2026-12-03, 5 runs" in first
    assert "PostgreSQL measured 2026-11-30" in first
    mariadb.write_doc({**result, "when": "2026-12-04"}, {}, "")
    second = doc.read_text()
    assert second.count(mariadb.SECTION) == 1 and "2026-12-03" not in second
    assert "| pod-delete | 2 |" in second and "## Failures" in second


def test_a_violation_fails_the_benchmark_and_the_schedule_is_round_robin(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(mariadb, "RESULTS", tmp_path / "mariadb.json")
    seen: list[Any] = []

    def run(schedule: list[str], *, keep: bool, engine: str) -> tuple[Any, int]:
        seen.append((schedule, engine))
        found = tallies()
        return found, 1 if any(t.violations for t in found.values()) else 0

    monkeypatch.setattr(chaos, "run", run)
    assert mariadb.main(["--no-doc", "--runs", "2"]) == 1
    schedule, engine = seen[0]
    assert engine == "mariadb"
    assert schedule == sorted(FAULTS) * 2
