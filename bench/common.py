"""What every benchmark shares: printing progress (:func:`say`), SIGTERM turned into
:class:`Interrupted` so that teardown runs, the root check of the real-node benchmarks, their
common output flags, the machine they ran on (CPU model, memory, :func:`environment`), the
``/proc`` readers they measure processes with (CPU time, ``/proc/PID/status`` fields, PSS,
children, the machine's busy time), nearest-rank percentiles, and the marker-delimited blocks
they write into docs/benchmarks.md (:func:`replace_block`, :func:`write_block`)."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import math
import os
import platform
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "benchmarks.md"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def say(message: str) -> None:
    print(message, flush=True)


class Interrupted(Exception):
    """SIGTERM, turned into an exception so that teardown runs."""


def raise_on_sigterm() -> None:
    """From now on SIGTERM raises :class:`Interrupted` (in the main thread)."""

    def interrupted(signum: int, _frame: Any) -> None:
        raise Interrupted(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupted)


def ready_for_real_nodes() -> bool:
    """As root (real nodes need it), with SIGTERM raising :class:`Interrupted` so that the
    cluster is torn down; False (and why, said) when not root."""
    if os.geteuid() != 0:
        say("real nodes need root: run this as root")
        return False
    raise_on_sigterm()
    return True


def output_flags(parser: argparse.ArgumentParser) -> None:
    """``--keep``, ``--no-doc`` and ``--json``: what every benchmark keeps and writes."""
    parser.add_argument("--keep", action="store_true", help="keep the state and logs")
    parser.add_argument("--no-doc", action="store_true", help="do not write docs/benchmarks.md")
    parser.add_argument("--json", type=Path, help="also write the raw results here")


# --- the machine ------------------------------------------------------------------------------


def cpu_model() -> str:
    """The first ``model name`` of /proc/cpuinfo, or '?'."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "?"


def memory_gib() -> float:
    """``MemTotal`` of /proc/meminfo in GiB (NaN without it)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) / 2**20
    return math.nan


def utc_minute() -> str:
    """Now, as the results are dated: ``YYYY-MM-DD HH:MM UTC``."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


def environment() -> dict[str, str]:
    """When and on what a benchmark ran: the date, and CPUs, memory, kernel and cgroup version."""
    unified = Path("/sys/fs/cgroup/cgroup.controllers").exists()
    return {
        "date": utc_minute(),
        "machine": f"{os.cpu_count()} CPUs ({cpu_model()}), {memory_gib():.1f} GiB RAM, Linux"
        f" {platform.release()}, cgroup {'v2' if unified else 'v1'}",
    }


# --- /proc ------------------------------------------------------------------------------------


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), or None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of ``pid`` (the process alone, not its reaped children); None if gone."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def cpu_seconds_or_zero(pid: int) -> float:
    """:func:`cpu_seconds`, 0.0 once the process is gone (for sums of CPU time)."""
    seconds = cpu_seconds(pid)
    return 0.0 if seconds is None else seconds


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def _status_field_kib(text: str, field: str) -> int:
    for line in text.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0  # a kernel thread has no VmRSS


def status_kib(pid: int, field: str) -> int | None:
    """A field of /proc/PID/status in KiB (``VmRSS``, ``VmHWM``): 0 when the process has no
    such field, None when the process is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    return _status_field_kib(text, field)


def live_status_kib(pid: int, field: str) -> int:
    """:func:`status_kib` of a process that must be there: the OSError of reading /proc
    when it is gone."""
    return _status_field_kib(Path(f"/proc/{pid}/status").read_text(), field)


def pss_kib(pid: int) -> int | None:
    """``Pss`` of /proc/PID/smaps_rollup in KiB, or None."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return None


def children(pid: int) -> list[int]:
    """The child processes of ``pid`` (of all its threads); none once it is gone."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                found.extend(int(c) for c in (task / "children").read_text().split())
    return found


def machine_busy_seconds() -> float:
    """CPU time spent by everything on this machine (all CPUs, idle and iowait excluded)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / CLOCK_TICKS


# --- figures ----------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by the nearest rank; NaN of nothing."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


# --- docs/benchmarks.md -----------------------------------------------------------------------


def replace_block(current: str, block: str, method: str, *, begin: str, end: str) -> str:
    """``current`` with the text between ``begin`` and ``end`` replaced by ``block``; without
    the markers, the method (when there is one) and the block appended."""
    marked = f"{begin}\n{block}{end}\n"
    if begin in current and end in current:
        head, _, rest = current.partition(begin)
        _, _, tail = rest.partition(end)
        return head + marked + tail.removeprefix("\n")
    return current.rstrip() + "\n\n" + (method + "\n" if method else "") + marked


def write_block(doc: Path, block: str, method: str, *, begin: str, end: str) -> None:
    """:func:`replace_block` in the file ``doc`` (a new one starts with ``# Benchmarks``)."""
    current = doc.read_text() if doc.exists() else "# Benchmarks\n"
    doc.write_text(replace_block(current, block, method, begin=begin, end=end))
