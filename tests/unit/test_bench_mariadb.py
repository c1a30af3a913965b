"""The MariaDB failover benchmark stays runnable without running it (it needs root, real
nodes and minutes): its flags parse, its table says what each run measured, and lost writes
make it fail."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from bench import mariadb

pytestmark = pytest.mark.unit

RUNS: list[dict[str, Any]] = [
    {"old": "ha-0", "new": "ha-1", "acknowledged": 300, "lost": 0, "downtime_s": 2.9,
     "reported_s": 1.4},
    {"old": "ha-1", "new": "ha-2", "acknowledged": 280, "lost": 0, "downtime_s": 4.1,
     "reported_s": 2.0},
    {"old": "ha-2", "new": "ha-0", "acknowledged": 310, "lost": 0, "downtime_s": 3.3,
     "reported_s": 1.1},
]  # fmt: skip


def test_defaults_lose_the_primary_five_times() -> None:
    assert mariadb.parse([]).runs == 5 and not mariadb.parse([]).no_doc
    assert mariadb.parse(["--runs", "2", "--no-doc"]).runs == 2


def test_the_table_has_a_row_per_run_then_median_and_worst() -> None:
    lines = mariadb.summary(RUNS)
    assert lines[2] == "| 1 | ha-0 → ha-1 | 300 | 0 | 2.9 | 1.4 |"
    assert lines[-1] == "| median / worst | | | 0 in total | 3.3 / 4.1 | 1.4 / 2.0 |"
    assert len(lines) == 2 + len(RUNS) + 1
    assert mariadb.summary([]) == lines[:2], "no runs: the header only"


def test_the_doc_section_is_replaced_between_its_markers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n")
    monkeypatch.setattr(mariadb, "DOC", doc)
    mariadb.write_doc({"date": "2026-12-03", "runs": RUNS[:1]})
    first = doc.read_text()
    assert mariadb.SECTION in first and "Measured 2026-12-03." in first
    mariadb.write_doc({"date": "2026-12-04", "runs": RUNS})
    second = doc.read_text()
    assert second.count(mariadb.SECTION) == 1 and "2026-12-03" not in second
    assert "| 3 | ha-2 → ha-0 |" in second


def test_a_lost_write_fails_the_benchmark(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(mariadb, "RESULTS", tmp_path / "mariadb.json")
    lossy = [dict(RUNS[0], lost=2)]
    monkeypatch.setattr(mariadb, "run", lambda runs, keep: {"date": "d", "runs": lossy,
                                                          "up_failures": []})  # fmt: skip
    assert mariadb.main(["--no-doc"]) == 1
    monkeypatch.setattr(mariadb, "run", lambda runs, keep: {"date": "d", "runs": RUNS,
                                                          "up_failures": []})  # fmt: skip
    assert mariadb.main(["--no-doc"]) == 0
