"""What the benchmarks share (bench.common): the nearest-rank percentile, the marker-delimited
blocks of docs/benchmarks.md, and the /proc readers, on this very process."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from bench import common

pytestmark = pytest.mark.unit

BEGIN, END = "<!-- x:begin -->", "<!-- x:end -->"


def _gone() -> int:
    """A pid no process can have (above the kernel's pid_max)."""
    return int(Path("/proc/sys/kernel/pid_max").read_text()) + 1


def test_percentile_is_the_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert common.percentile(values, 99) == 99.0
    assert common.percentile(values, 95) == 95.0
    assert common.percentile(values, 50) == 50.0
    assert common.percentile([7.0], 99) == 7.0
    assert common.percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert math.isnan(common.percentile([], 99))


def test_the_block_replaces_its_markers() -> None:
    doc = f"# Benchmarks\n\nintro\n\n## Bare\n\nmethod\n\n{BEGIN}\nold\n{END}\n\n## Next\n"
    assert common.replace_block(doc, "new\n", "unused", begin=BEGIN, end=END) == (
        f"# Benchmarks\n\nintro\n\n## Bare\n\nmethod\n\n{BEGIN}\nnew\n{END}\n\n## Next\n"
    )


def test_without_markers_the_block_is_appended_after_the_method_if_any() -> None:
    current = "# Benchmarks\n\nintro\n\n"
    assert common.replace_block(current, "new\n", "## Bare\n\nhow\n", begin=BEGIN, end=END) == (
        f"# Benchmarks\n\nintro\n\n## Bare\n\nhow\n\n{BEGIN}\nnew\n{END}\n"
    )
    assert common.replace_block(current, "new\n", "", begin=BEGIN, end=END) == (
        f"# Benchmarks\n\nintro\n\n{BEGIN}\nnew\n{END}\n"
    )


def test_a_block_written_to_a_new_file_starts_it(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    common.write_block(doc, "one\n", "## X\n", begin=BEGIN, end=END)
    assert doc.read_text() == f"# Benchmarks\n\n## X\n\n{BEGIN}\none\n{END}\n"
    common.write_block(doc, "two\n", "## X\n", begin=BEGIN, end=END)
    assert doc.read_text() == f"# Benchmarks\n\n## X\n\n{BEGIN}\ntwo\n{END}\n"


def test_the_proc_readers_of_a_live_process() -> None:
    me = os.getpid()
    seconds = common.cpu_seconds(me)
    assert seconds is not None
    assert seconds > 0
    assert common.cpu_seconds_or_zero(me) >= seconds
    rss = common.status_kib(me, "VmRSS")
    assert rss is not None
    assert rss > 0
    assert common.live_status_kib(me, "VmRSS") > 0
    assert common.status_kib(me, "NoSuchField") == 0
    assert common.live_status_kib(me, "NoSuchField") == 0
    assert common.alive(me)
    assert common.machine_busy_seconds() > 0
    assert common.memory_gib() > 0
    assert common.cpu_model()


def test_the_proc_readers_of_a_process_that_is_gone() -> None:
    gone = _gone()
    assert common.cpu_seconds(gone) is None
    assert common.cpu_seconds_or_zero(gone) == 0.0
    assert common.status_kib(gone, "VmRSS") is None
    assert common.pss_kib(gone) is None
    assert common.children(gone) == []
    assert not common.alive(gone)
    with pytest.raises(FileNotFoundError):
        common.live_status_kib(gone, "VmRSS")


def test_children_are_the_processes_started_below() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in common.children(os.getpid())
    finally:
        child.kill()
        child.wait()


def test_the_environment_names_the_machine() -> None:
    env = common.environment()
    assert env["date"].endswith(" UTC")
    assert env["machine"].startswith(f"{os.cpu_count()} CPUs (")
    assert " GiB RAM, Linux " in env["machine"]
    assert env["machine"].endswith((", cgroup v1", ", cgroup v2"))
