"""The data-plane benchmark stays runnable without running it (it needs root, real nodes and
minutes): it imports, parses its flags, keeps its functions small, and its arithmetic on what
the writer saw (downtime, lost rows) and on memory.stat is right."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest

from tests.unit.test_bench import _statements

pytestmark = pytest.mark.unit

MODULE = Path(__file__).resolve().parents[2] / "bench" / "dataplane.py"
MAX_STATEMENTS = 40


def test_no_function_is_a_wall_of_statements() -> None:
    tree = ast.parse(MODULE.read_text())
    sizes = {
        node.name: _statements(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    assert {name: n for name, n in sizes.items() if n > MAX_STATEMENTS} == {}


def test_it_imports_and_parses_its_flags() -> None:
    from bench import dataplane

    args = dataplane.parse(["--runs", "1", "--settle", "5", "--no-doc", "--keep"])
    assert (args.runs, args.settle, args.no_doc, args.keep) == (1, 5, True, True)
    assert dataplane.parse([]).runs == 3
    with pytest.raises(SystemExit) as exit_info:
        dataplane.parse(["--help"])
    assert exit_info.value.code == 0
    with pytest.raises(SystemExit):
        dataplane.parse(["--runs", "0"])


def test_the_downtime_is_the_longest_gap_that_overlaps_the_event() -> None:
    from bench.dataplane import longest_gap

    stamps = [0.0, 0.1, 0.2, 5.0, 5.1, 5.2, 9.0, 9.1]
    assert longest_gap(stamps) == pytest.approx(4.8)
    # The event from 1.0 to 6.0: the 0.2 → 5.0 gap spans it; 5.2 → 9.0 starts after it.
    assert longest_gap(stamps, 1.0, 6.0) == pytest.approx(4.8)
    assert longest_gap(stamps, 6.0, 7.0) == pytest.approx(3.8)
    # A gap that begins before the event and ends inside it counts too.
    assert longest_gap(stamps, 3.0, 3.5) == pytest.approx(4.8)
    assert longest_gap([1.0]) == 0.0
    assert longest_gap([]) == 0.0


def test_lost_rows_are_acknowledged_numbers_missing_from_the_table() -> None:
    from bench.dataplane import lost_rows, parse_rows

    assert parse_rows("1,2,3,5\n") == {1, 2, 3, 5}
    assert parse_rows("") == set()
    assert lost_rows([1, 2, 3, 4, 5], parse_rows("1,2,3,5")) == [4]
    # Rows present but never acknowledged (the reply was lost) are not losses.
    assert lost_rows([1, 2], {1, 2, 3}) == []


def test_median_and_max() -> None:
    from bench.dataplane import median_max

    assert median_max([3.0, 1.0, 2.0]) == (2.0, 3.0)
    assert all(math.isnan(v) for v in median_max([]))


def test_memory_stat_reads_cgroup_v1_totals_and_v2_fields() -> None:
    from bench.dataplane import memory_stat

    mib = 2**20
    v1 = f"cache {mib}\nrss {mib}\nshmem 0\ntotal_cache {8 * mib}\ntotal_rss {20 * mib}\n"
    v1 += f"total_shmem {6 * mib}\ntotal_inactive_file {mib}\n"
    assert memory_stat(v1) == {"anon": 20.0, "shmem": 6.0, "file": 8.0, "inactive_file": 1.0}
    v2 = f"anon {3 * mib}\nfile {2 * mib}\nshmem {mib}\ninactive_file 0\n"
    assert memory_stat(v2) == {"anon": 3.0, "shmem": 1.0, "file": 2.0, "inactive_file": 0.0}


def test_the_pooler_rows_sum_what_the_second_writer_saw_over_every_run() -> None:
    from bench.dataplane import pooler_rows

    def entry(downtime: float, failed: int, lost: int) -> dict[str, object]:
        return {"pooler": {"downtime_s": downtime, "failed_attempts": failed, "lost": lost,
                           "acknowledged": 100}}  # fmt: skip

    rows = pooler_rows([entry(1.5, 2, 0), entry(2.5, 4, 0)], [entry(6.0, 9, 1)])
    text = "\n".join(rows)
    assert "| **switchover, through the pooler: write downtime** | 2.00 s | 2.50 s |" in text
    assert "| switchover, through the pooler: inserts that failed | 3 | 4 | 2, 4 | 0 |" in text
    assert "switchover, through the pooler: acknowledged rows lost, all runs | **0** of 200" in text
    assert (
        "primary pod deleted, through the pooler: acknowledged rows lost, all runs | **1** of 100"
        in text
    )
    assert pooler_rows([{"downtime_s": 1.0}], []) == []  # a run without a pooler: no rows
