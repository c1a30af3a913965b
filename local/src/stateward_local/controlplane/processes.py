"""The control plane's processes: each started in its own session with its log, recorded
with its pid and its kernel start time (so a recycled pid is never mistaken for ours), and
stopped by that record, never by name."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from stateward_local.errors import LocalClusterError


@dataclasses.dataclass(frozen=True)
class ProcessRecord:
    name: str
    pid: int
    start_time: str
    log: str
    argv: tuple[str, ...] = ()

    def alive(self) -> bool:
        return start_time(self.pid) == self.start_time


@dataclasses.dataclass(frozen=True)
class ProcessStatus:
    name: str
    pid: int
    running: bool
    log: str


def start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (field 22 of /proc/PID/stat), or None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):  # a zombie has exited; only its parent has not reaped it
        return None
    return fields[19]


def port_taken(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def ephemeral_ports(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> range:
    """The kernel's range of ports for outgoing connections: any process's client socket may
    take one of these at any moment, so a server port chosen there can be gone before it binds."""
    try:
        low, high = (int(field) for field in path.read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999  # Linux's default
    return range(low, high + 1)


def free_port_base(count: int = 6, start: int = 20000, stop: int = 60000) -> int:
    """A base port whose ``count`` successors are all free now (for tests and parallel runs).

    Free means a server binding with SO_REUSEADDR (as Go's and Python's servers do) gets it;
    a port a closed server left in TIME_WAIT counts as free. Bases stay below the ephemeral
    range when there is room, so an outgoing connection cannot take a port in between."""
    ephemeral = ephemeral_ports()
    if ephemeral.start - start > 500 * 16 + count:
        stop = min(stop, ephemeral.start)
    bases = range(start, stop - count + 1, count + 1)
    # Parallel runs start their search at different bases (by pid) and wrap around.
    first = (os.getpid() % 500) * 16 // (count + 1) % max(len(bases), 1)
    for index in range(len(bases)):
        base: int = bases[(first + index) % len(bases)]
        if not any(port_taken(base + offset) for offset in range(count)):
            return base
    raise LocalClusterError(f"no {count} consecutive free ports between {start} and {stop}")


def start(
    state_dir: Path, name: str, argv: list[str], *, env: dict[str, str] | None = None
) -> ProcessRecord:
    """Start ``argv`` in its own session, its output appended to ``logs/NAME.log``, and record
    it by pid and kernel start time."""
    logs = state_dir / "logs"
    logs.mkdir(exist_ok=True)
    log_path = logs / f"{name}.log"
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=state_dir,
            env=None if env is None else {**os.environ, **env},
        )
    # The start time is read back at once so the record can always tell our process
    # from a later one that reuses the pid.
    for _ in range(100):
        start = start_time(process.pid)
        if start is not None:
            return ProcessRecord(name, process.pid, start, str(log_path), tuple(argv))
        if process.poll() is not None:
            break
        time.sleep(0.01)
    raise LocalClusterError(f"{name} exited at once; see {log_path}")


def stop(records: list[ProcessRecord], timeout: float = 15.0) -> list[str]:
    """Stop the recorded processes newest first: SIGTERM, then SIGKILL after ``timeout``."""
    stopped: list[str] = []
    for record in reversed(records):
        if not record.alive():
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(record.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while record.alive() and time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(record.pid, os.WNOHANG)
            time.sleep(0.05)
        if record.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(record.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(record.pid, 0)
        stopped.append(f"{record.name} (pid {record.pid})")
    return stopped


def wait(
    what: str,
    check: Callable[[], bool],
    records: list[ProcessRecord],
    timeout: float = 120.0,
) -> None:
    """Poll ``check`` until true; fail at once, naming it, when a recorded process dies."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dead = [r for r in records if not r.alive()]
        if dead:
            raise LocalClusterError(
                f"{dead[0].name} exited while waiting for {what}; see {dead[0].log}"
            )
        with contextlib.suppress(httpx.HTTPError, OSError, ssl.SSLError):
            if check():
                return
        time.sleep(0.2)
    raise LocalClusterError(f"timed out after {timeout:.0f}s waiting for {what}")
