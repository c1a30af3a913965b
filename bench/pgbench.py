"""pgbench through the pooler across switchovers: what an application on persistent
connections sees when the primary moves under PgBouncer (``make bench-dataplane``).

``pgbench`` (the host's, TPC-B-like script, ``--protocol=simple``: transaction pooling) runs
``CLIENTS`` persistent connections to the pooler's Service for a fixed time while the bench
asks for ``SWITCHOVERS`` switchovers one after another (``stateward.io/switchover: any``,
each waited for until ``Succeeded``, then the cluster until it is settled again). pgbench
logs every transaction (``--log``: completion time and latency); from those and its summary
this reports the transactions that failed (pgbench's own count plus the clients it aborted
on an error: a connection the pooler dropped would abort one), the latency percentiles away
from the switchovers, and the worst latency and longest stall in each switchover's window
(from the request until ``WINDOW_TAIL`` s after it finished).
"""

from __future__ import annotations

import itertools
import math
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from bench.common import percentile

CLIENTS = 4
THREADS = 2
SWITCHOVERS = 5
WINDOW_TAIL = 5.0
"""Seconds after a switchover finished that still count as its window (the pooler resumes
and the clients' queued transactions drain)."""
SCALE = 1
"""pgbench's scale: 100,000 accounts."""


# --- pure: what pgbench wrote -----------------------------------------------------------------


def parse_log(lines: Iterable[str]) -> tuple[list[tuple[float, float]], int]:
    """Transactions of a pgbench ``--log`` (``client_id transaction_no time script_no
    time_epoch time_us ...``): (completion time as Unix seconds, latency in ms) of each that
    succeeded, and how many the log records as failed (``time`` not a number)."""
    done: list[tuple[float, float]] = []
    failed = 0
    for line in lines:
        fields = line.split()
        if len(fields) < 6:
            continue
        latency, epoch, micros = fields[2], fields[4], fields[5]
        if not latency.isdigit():
            failed += 1
            continue
        done.append((int(epoch) + int(micros) / 1e6, int(latency) / 1000.0))
    done.sort()
    return done, failed


_FAILED = re.compile(r"number of failed transactions: (\d+)")
_PROCESSED = re.compile(r"number of transactions actually processed: (\d+)")
_TPS = re.compile(r"tps = ([0-9.]+)")
_ABORTED = re.compile(r"client (\d+) aborted")
_LATENCY = re.compile(r"latency average = ([0-9.]+) ms")


def parse_summary(stdout: str, stderr: str) -> dict[str, Any]:
    """pgbench's summary: transactions processed, failed (pgbench's count), tps, the average
    latency (NaN if not printed), and the clients it aborted (each on an error it does not
    retry, such as a lost connection)."""
    failed = _FAILED.search(stdout)
    processed = _PROCESSED.search(stdout)
    tps = _TPS.search(stdout)
    latency = _LATENCY.search(stdout)
    return {
        "processed": int(processed.group(1)) if processed else 0,
        "failed": int(failed.group(1)) if failed else 0,
        "tps": float(tps.group(1)) if tps else 0.0,
        "latency_ms": float(latency.group(1)) if latency else math.nan,
        "aborted_clients": sorted({int(c) for c in _ABORTED.findall(stderr + stdout)}),
    }


def longest_stall(stamps: Sequence[float], start: float, end: float) -> float:
    """The longest time in [start, end] in which no transaction completed (any client)."""
    inside = [start, *(t for t in stamps if start < t < end), end]
    return max(b - a for a, b in itertools.pairwise(inside))


def summarize(
    done: Sequence[tuple[float, float]], windows: Sequence[tuple[float, float]]
) -> dict[str, Any]:
    """Latencies away from the switchovers and in each window (Unix seconds)."""

    def inside(t: float) -> bool:
        return any(a <= t <= b for a, b in windows)

    steady = [ms for t, ms in done if not inside(t)]
    stamps = [t for t, _ in done]
    per_window = []
    for start, end in windows:
        latencies = [ms for t, ms in done if start <= t <= end]
        per_window.append(
            {
                "transactions": len(latencies),
                "p99_ms": percentile(latencies, 99),
                "max_ms": max(latencies, default=math.nan),
                "stall_s": round(longest_stall(stamps, start, end), 3),
            }
        )
    return {
        "steady_p50_ms": percentile(steady, 50),
        "steady_p99_ms": percentile(steady, 99),
        "overall_p99_ms": percentile([ms for _, ms in done], 99),
        "windows": per_window,
    }


# --- running it -------------------------------------------------------------------------------


def initialize(connection: str, password: str, timeout: float = 300) -> None:
    """pgbench's tables (``-i``), straight to the primary (VACUUM does not go through a
    transaction pooler)."""
    subprocess.run(
        ["pgbench", "-i", "-q", "-s", str(SCALE), connection],
        env={**os.environ, "PGPASSWORD": password},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )


def steady(
    connection: str, password: str, seconds: int, *, connect: bool = False
) -> dict[str, Any]:
    """pgbench's TPC-B-like script on ``connection`` for ``seconds`` with nothing else going
    on; with ``connect``, a new connection for every transaction (``--connect``: what a
    connection's setup, a TLS handshake among it, costs)."""
    command = [
        "pgbench", "--no-vacuum", f"--client={CLIENTS}", f"--jobs={THREADS}",
        f"--time={seconds}", *(["--connect"] if connect else []), connection,
    ]  # fmt: skip
    result = subprocess.run(
        command,
        env={**os.environ, "PGPASSWORD": password},
        capture_output=True,
        text=True,
        timeout=seconds + 120,
        check=False,
    )
    summary = parse_summary(result.stdout, result.stderr)
    if result.returncode != 0 or not summary["processed"]:
        detail = (result.stderr or result.stdout).strip().splitlines()[-1:]
        raise RuntimeError(f"pgbench failed ({result.returncode}): {detail}")
    return {"seconds": seconds, "connect": connect, **summary}


def across_switchovers(
    connection: str,
    password: str,
    switch: Callable[[int], tuple[float, float]],
    *,
    switchovers: int = SWITCHOVERS,
    seconds: int = 240,
    warm_up: float = 15.0,
) -> dict[str, Any]:
    """pgbench on ``connection`` for ``seconds`` while ``switch(n)`` does switchover ``n``
    (returning when it was requested and finished, Unix seconds) after ``warm_up`` s."""
    with tempfile.TemporaryDirectory(prefix="stateward-pgbench-") as directory:
        prefix = str(Path(directory) / "tx")
        command = [
            "pgbench", "--no-vacuum", "--protocol=simple",
            f"--client={CLIENTS}", f"--jobs={THREADS}", f"--time={seconds}",
            "--log", f"--log-prefix={prefix}", connection,
        ]  # fmt: skip
        started = time.time()
        process = subprocess.Popen(
            command,
            env={**os.environ, "PGPASSWORD": password},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        windows: list[tuple[float, float]] = []
        try:
            while time.time() - started < warm_up and process.poll() is None:
                time.sleep(0.5)
            for n in range(1, switchovers + 1):
                if process.poll() is not None:
                    break
                requested, finished = switch(n)
                windows.append((requested, finished + WINDOW_TAIL))
            stdout, stderr = process.communicate(timeout=seconds + 120)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        lines: list[str] = []
        for log in sorted(Path(directory).glob("tx*")):
            lines += log.read_text().splitlines()
    done, logged_failed = parse_log(lines)
    summary = parse_summary(stdout, stderr)
    return {
        "clients": CLIENTS,
        "seconds": seconds,
        "switchovers": len(windows),
        "returncode": process.returncode,
        **summary,
        "logged_failed": logged_failed,
        "errors": [line for line in stderr.splitlines() if "error" in line.lower()][:5],
        **summarize(done, windows),
    }
