"""What the pooler benchmark reads from pgbench: its per-transaction log, its summary, and
the percentiles and stalls it derives per switchover window (the run itself needs real nodes
and minutes: ``make bench-dataplane``)."""

from __future__ import annotations

import math
import shutil
import subprocess

import pytest
from bench import pgbench
from bench.dataplane import pgbench_rows

pytestmark = pytest.mark.unit


def test_the_log_gives_completion_time_and_latency_and_counts_failures() -> None:
    lines = [
        "0 1 2500 0 1700000000 250000",  # 2.5 ms, done at .25 s
        "1 1 1200 0 1700000000 100000",
        "0 2 failed 0 1700000001 0",
        "1 2 serialization 0 1700000001 500",
        "garbage",
        "",
    ]
    done, failed = pgbench.parse_log(lines)
    assert done == [(1700000000.1, 1.2), (1700000000.25, 2.5)]  # sorted by completion
    assert failed == 2


def test_the_summary_gives_processed_failed_tps_and_aborted_clients() -> None:
    stdout = (
        "transaction type: <builtin: TPC-B (sort of)>\n"
        "number of transactions actually processed: 12345\n"
        "number of failed transactions: 3 (0.024%)\n"
        "latency average = 19.442 ms\n"
        "tps = 205.75 (without initial connection time)\n"
    )
    stderr = (
        "pgbench: error: client 2 aborted in command 5 (SQL) of script 0; ...\n"
        "pgbench: error: client 2 aborted in command 5 (SQL) of script 0; again\n"
        "pgbench: error: client 0 aborted while establishing connection\n"
    )
    assert pgbench.parse_summary(stdout, stderr) == {
        "processed": 12345,
        "failed": 3,
        "tps": 205.75,
        "latency_ms": 19.442,
        "aborted_clients": [0, 2],
    }
    assert pgbench.parse_summary("", "")["aborted_clients"] == []
    assert math.isnan(pgbench.parse_summary("", "")["latency_ms"])


def test_the_longest_stall_includes_the_window_edges() -> None:
    assert pgbench.longest_stall([1.0, 1.5, 4.0], 0.0, 5.0) == 2.5
    assert pgbench.longest_stall([], 10.0, 12.0) == 2.0  # nothing completed at all
    assert pgbench.longest_stall([0.5, 9.0], 1.0, 3.0) == 2.0  # outside stamps ignored


def test_latencies_are_split_between_steady_state_and_each_window() -> None:
    steady = [(float(t), 2.0) for t in range(100)]
    spike = [(200.0, 2.0), (203.0, 3000.0), (203.1, 2900.0), (204.0, 2.0)]
    summary = pgbench.summarize(steady + spike, [(200.0, 205.0)])
    assert summary["steady_p99_ms"] == 2.0  # the spike does not count as steady state
    assert summary["windows"] == [
        {"transactions": 4, "p99_ms": 3000.0, "max_ms": 3000.0, "stall_s": 3.0}
    ]


def test_the_report_names_failures_aborts_and_the_worst_switchover() -> None:
    result = {
        "clients": 4, "seconds": 240, "switchovers": 5, "tps": 180.4, "processed": 43000,
        "failed": 0, "logged_failed": 0, "aborted_clients": [],
        "steady_p50_ms": 12.3, "steady_p99_ms": 41.0, "overall_p99_ms": 60.0,
        "windows": [{"max_ms": 2100.0, "stall_s": 1.9}, {"max_ms": 3400.0, "stall_s": 3.1}],
    }  # fmt: skip
    text = "\n".join(pgbench_rows(result))
    assert "across 5 switchovers** (4 clients" in text
    assert "| **failed transactions** | **0** | | | 0 |" in text
    assert "| **clients aborted by an error** | **0** | | | 0 |" in text
    assert "| latency p50 / p99 away from the switchovers | 12.3 ms / 41.0 ms |" in text
    assert "| worst latency in a switchover's window | 2.75 s | 3.40 s | 2.10, 3.40 |" in text
    result |= {"logged_failed": 2, "aborted_clients": [1]}
    text = "\n".join(pgbench_rows(result))
    assert "| **failed transactions** | **2** |" in text
    assert "| **clients aborted by an error** | **1** |" in text


def test_the_host_pgbench_takes_every_flag_the_benchmark_gives() -> None:
    """The flags exist in the host's pgbench (a renamed one would fail only in the bench)."""
    binary = shutil.which("pgbench")
    assert binary is not None, "pgbench comes with the host's PostgreSQL client"
    usage = subprocess.run([binary, "--help"], capture_output=True, text=True, check=True).stdout
    for flag in ("--no-vacuum", "--protocol=", "--client=", "--jobs=", "--time=", "--log",
                 "--log-prefix=", "--initialize", "--quiet", "--scale="):  # fmt: skip
        assert flag in usage, flag
