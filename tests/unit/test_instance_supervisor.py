"""The instance container's PID 1: Patroni as its child, stopped while fenced (supervisor)."""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from stateward import pki
from stateward.instance import supervisor

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("data", "pod", "fenced"),
    [
        ({"instances": '["pg-1"]'}, "pg-1", True),
        ({"instances": '["pg-1"]'}, "pg-0", False),
        ({"instances": '["*"]'}, "pg-0", True),
        ({"instances": "[]"}, "pg-0", False),
        ({}, "pg-0", False),
        (None, "pg-0", False),
        ({"instances": "not json"}, "pg-0", False),
        ({"instances": '{"pg-0": true}'}, "pg-0", False),
    ],
)
def test_which_pods_a_fencing_configmap_fences(
    data: dict[str, str] | None, pod: str, fenced: bool
) -> None:
    assert supervisor.fenced_in(data, pod) is fenced


def test_a_watch_stream_is_read_one_event_per_line() -> None:
    lines = [b'{"type": "ADDED", "object": {"data": {}}}\n', b"\n", b'{"type": "DELETED"}\n']
    assert [e["type"] for e in supervisor.watch_events(iter(lines))] == ["ADDED", "DELETED"]


def test_the_last_state_seen_survives_a_restart_of_the_container(tmp_path: Path) -> None:
    state = tmp_path / supervisor.STATE_FILE_NAME
    source = supervisor.FencingSource("ns", "pg", "pg-0", state)
    assert not source.fenced and not source.known.is_set()
    source._set(True)
    assert state.exists() and source.changed.is_set()
    again = supervisor.FencingSource("ns", "pg", "pg-0", state)
    assert again.fenced and again.known.is_set()  # no wait for the API server
    again._set(False)
    assert not state.exists()


class Source:
    """A FencingSource driven by the test."""

    def __init__(self, fenced: bool) -> None:
        self.fenced = fenced
        self.changed = supervisor.Waker()
        self.known = threading.Event()
        self.known.set()

    def set(self, fenced: bool) -> None:
        self.fenced = fenced
        self.changed.set()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def probe(port: int, path: str) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=1) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return None


def eventually(check: Callable[[], bool], what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class Children:
    """Spawns real processes standing in for Patroni and keeps them for the test."""

    def __init__(self, argv: Sequence[str] = ("sleep", "60")) -> None:
        self.argv = list(argv)
        self.spawned: list[subprocess.Popen[bytes]] = []

    def __call__(self, _argv: Sequence[str]) -> subprocess.Popen[bytes]:
        child = subprocess.Popen(self.argv)
        self.spawned.append(child)
        return child

    def running(self) -> list[subprocess.Popen[bytes]]:
        """Children alive, seen from /proc without reaping them: a poll() from this thread
        raced the supervisor's reaper, and a child it had reaped then read as exit code 0."""
        return [c for c in self.spawned if c.returncode is None and _alive(c.pid)]


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        # Reaped between the open and the read: /proc answers ESRCH then, not ENOENT.
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def supervise(source: Source, children: Children, drive: Callable[[], None], **options: Any) -> int:
    """Run the supervisor in this (the main) thread, as PID 1 runs it; ``drive`` acts from
    another thread. Every child is killed afterwards, whatever happened."""
    port = free_port()
    runner = supervisor.Supervisor(
        ["patroni"],
        source,  # type: ignore[arg-type]
        port=port,
        spawn=children,
        **options,
    )
    failures: list[BaseException] = []

    def driver() -> None:
        try:
            drive()
        except BaseException as error:
            failures.append(error)
            runner.stopping = True
            source.changed.set()

    runner.port = port
    thread = threading.Thread(target=driver, daemon=True)
    supervise.port = port  # type: ignore[attr-defined]
    thread.start()
    try:
        code = runner.run()
    finally:
        for child in children.spawned:
            if child.poll() is None:
                child.kill()
                child.wait()
        for signum in (
            signal.SIGTERM,
            signal.SIGINT,
            signal.SIGHUP,
            signal.SIGUSR1,
            signal.SIGCHLD,
        ):
            signal.signal(signum, signal.SIG_DFL)
    thread.join(timeout=10)
    if failures:
        raise failures[0]
    return code


def test_patroni_runs_unfenced_and_its_exit_status_is_the_containers() -> None:
    children = Children(["sh", "-c", "exit 3"])
    assert supervise(Source(False), children, lambda: None) == 3
    assert len(children.spawned) == 1


def test_a_patroni_killed_by_a_signal_ends_the_container_as_the_shell_reports_it() -> None:
    children = Children()

    def drive() -> None:
        eventually(lambda: bool(children.running()), "Patroni to start")
        children.spawned[0].send_signal(signal.SIGKILL)

    assert supervise(Source(False), children, drive) == 128 + signal.SIGKILL


def test_the_runtimes_sigterm_goes_to_patroni_and_ends_the_container() -> None:
    children = Children()

    def drive() -> None:
        eventually(lambda: bool(children.running()), "Patroni to start")
        signal.raise_signal(signal.SIGTERM)

    # sleep dies of the forwarded SIGTERM: 128 + 15, as a shell would report it.
    assert supervise(Source(False), children, drive) == 128 + signal.SIGTERM
    assert len(children.spawned) == 1


def test_fencing_stops_patroni_keeps_the_container_and_unfencing_starts_it_again() -> None:
    children = Children()
    source = Source(False)

    def drive() -> None:
        port = supervise.port  # type: ignore[attr-defined]
        eventually(lambda: bool(children.running()), "Patroni to start")
        source.set(True)
        eventually(lambda: not children.running(), "Patroni to stop when fenced")
        # Alive for the kubelet, never ready for the Services.
        eventually(lambda: probe(port, "/liveness") == 200, "the fenced liveness answer")
        assert probe(port, "/readiness") == 503
        source.set(False)
        eventually(lambda: len(children.running()) == 1, "Patroni to start when unfenced")
        eventually(lambda: probe(port, "/liveness") is None, "the probes left to Patroni")
        signal.raise_signal(signal.SIGTERM)

    supervise(source, children, drive)
    assert len(children.spawned) == 2
    assert children.spawned[0].returncode == -signal.SIGTERM  # stopped cleanly, by SIGTERM


def test_a_pod_fenced_from_the_start_never_starts_patroni_and_stops_on_sigterm() -> None:
    children = Children()

    def drive() -> None:
        port = supervise.port  # type: ignore[attr-defined]
        eventually(lambda: probe(port, "/readiness") == 503, "the fenced readiness answer")
        signal.raise_signal(signal.SIGTERM)

    assert supervise(Source(True), children, drive) == 0
    assert children.spawned == []


def test_the_fencing_state_is_read_from_the_api_servers_list_then_watch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = supervisor.FencingSource("ns", "pg", "pg-1", tmp_path / "state")
    stop = threading.Event()
    listed = {"metadata": {"resourceVersion": "7"}, "items": [{"data": {"instances": "[]"}}]}
    events = [
        {"type": "MODIFIED", "object": {"data": {"instances": '["pg-1"]'}}},
        {"type": "DELETED", "object": {}},
    ]
    queries: list[dict[str, str]] = []

    class Answer:
        def __init__(self, body: bytes) -> None:
            self.lines = body.splitlines(keepends=True)

        def __enter__(self) -> Answer:
            return self

        def __exit__(self, *_: object) -> None:
            pass

        def read(self) -> bytes:
            return b"".join(self.lines)

        def __iter__(self):  # type: ignore[no-untyped-def]
            seen = []
            for line in self.lines:
                seen.append(json.loads(line)["type"])
                yield line
                if seen == ["MODIFIED"]:
                    assert source.fenced  # the MODIFIED event fenced pg-1
            stop.set()

    def request(query: dict[str, str], timeout: float) -> Answer:
        queries.append(query)
        if "watch" in query:
            return Answer(b"".join(json.dumps(e).encode() + b"\n" for e in events))
        return Answer(json.dumps(listed).encode())

    monkeypatch.setattr(source, "_request", request)
    source.run(stop)
    assert queries[0] == {"fieldSelector": "metadata.name=pg-fencing"}
    assert queries[1]["resourceVersion"] == "7" and queries[1]["watch"] == "1"
    assert not source.fenced  # the ConfigMap's deletion fences nothing


# --- the serving certificate ------------------------------------------------------------


def write_certificate(directory: Path, authority: pki.Authority) -> bytes:
    """A serving certificate for 127.0.0.1 under ``directory/current``, swapped in as the
    kubelet swaps a Secret volume: both files in a new directory, then one atomic rename of
    the link to it (never one file new and the other old); its PEM."""
    issued = authority.issue(common_name="demo", hosts=("127.0.0.1",), server=True)
    version = directory / f"v{len(list(directory.glob('v*')))}"
    version.mkdir()
    (version / "tls.crt").write_bytes(issued.cert)
    (version / "tls.key").write_bytes(issued.key)
    link = directory / "next"
    link.symlink_to(version.name)
    link.replace(directory / "current")
    return issued.cert


def served_certificate(port: int, authority: pki.Authority) -> bytes | None:
    """The certificate the fenced probes present, verified against ``authority`` (DER)."""
    context = ssl.create_default_context(cadata=authority.cert_pem.decode())
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=1) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            return tls.getpeercert(binary_form=True)
    except OSError:
        return None


def der(pem: bytes) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pem.decode())


def test_a_renewed_certificate_reloads_patroni_without_restarting_it(tmp_path: Path) -> None:
    authority = pki.Authority.new("demo CA")
    write_certificate(tmp_path, authority)
    hups = tmp_path / "hups"
    # Stands in for Patroni: counts the SIGHUPs it gets (its reload), keeps running.
    children = Children(
        ["sh", "-c", f"trap 'echo hup >> {hups}' HUP; while :; do sleep 0.05; done"]
    )
    ticks = iter(range(0, 10**9, 100))  # every loop of the supervisor is past the interval

    def drive() -> None:
        eventually(lambda: bool(children.running()), "Patroni to start")
        write_certificate(tmp_path, authority)
        # One change, one reload: an unchanged certificate (every loop before) reloads nothing.
        eventually(lambda: hups.exists(), "the reload")
        assert hups.read_text() == "hup\n"
        assert len(children.spawned) == 1 and children.running() == children.spawned
        signal.raise_signal(signal.SIGTERM)

    certificate = supervisor.Certificate(
        str(tmp_path / "current" / "tls.crt"), str(tmp_path / "current" / "tls.key")
    )
    supervise(Source(False), children, drive, certificate=certificate, clock=lambda: next(ticks))


def test_the_fenced_probes_serve_the_current_certificate(tmp_path: Path) -> None:
    authority = pki.Authority.new("demo CA")
    first = write_certificate(tmp_path, authority)
    ticks = iter(range(0, 10**9, 100))

    def drive() -> None:
        port = supervise.port  # type: ignore[attr-defined]
        eventually(lambda: served_certificate(port, authority) == der(first), "HTTPS probes")
        renewed = write_certificate(tmp_path, authority)
        eventually(lambda: served_certificate(port, authority) == der(renewed), "the renewed one")
        signal.raise_signal(signal.SIGTERM)

    certificate = supervisor.Certificate(
        str(tmp_path / "current" / "tls.crt"), str(tmp_path / "current" / "tls.key")
    )
    code = supervise(
        Source(True), Children(), drive, certificate=certificate, clock=lambda: next(ticks)
    )
    assert code == 0


def test_a_certificate_change_is_seen_once(tmp_path: Path) -> None:
    authority = pki.Authority.new("demo CA")
    write_certificate(tmp_path, authority)
    certificate = supervisor.Certificate(
        str(tmp_path / "current" / "tls.crt"), str(tmp_path / "current" / "tls.key")
    )
    assert not certificate.changed()
    write_certificate(tmp_path, authority)
    assert certificate.changed() and not certificate.changed()
    (tmp_path / "current").unlink()  # files gone read as a change too
    assert certificate.changed()


def test_the_waker_is_an_event_that_a_signal_handler_may_set() -> None:
    waker = supervisor.Waker()
    assert not waker.is_set() and not waker.wait(0.01)
    waker.set()
    waker.set()
    assert waker.is_set() and waker.wait(0.01)
    waker.clear()
    assert not waker.is_set()


FLOOD = """
import signal, sys, threading, time
from stateward.instance.supervisor import Waker
waker = Waker()
signal.signal(signal.SIGUSR2, lambda _s, _f: waker.set())
sent = threading.Event()
def send():
    end = time.monotonic() + 1.5
    while time.monotonic() < end:
        signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR2)
    sent.set()
threading.Thread(target=send, daemon=True).start()
woken = 0
while not sent.is_set():
    waker.clear()
    woken += waker.wait(0)
print("woken", woken > 0)
"""


def test_signal_handlers_setting_the_waker_never_hang_the_waiting_main_thread() -> None:
    """Signals flood the main thread while it clears and waits on the waker, again and again:
    with a threading.Event in its place this hangs within a second (the handler lands while
    wait() holds the event's lock and set() waits for it forever)."""
    flood = subprocess.run(
        [sys.executable, "-c", FLOOD],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONPATH": str(Path(supervisor.__file__).parents[2])},
    )
    assert flood.returncode == 0, flood.stderr[-2000:]
    assert flood.stdout.strip() == "woken True"


def test_the_pooler_gets_the_runtimes_sigterm_as_pgbouncers_safe_shutdown() -> None:
    """PgBouncer's SIGTERM would wait for every client to leave; its SIGINT lets the running
    transactions finish and exits. The child here reports which one it got."""
    children = Children(
        ["sh", "-c", "trap 'exit 2' INT; trap 'exit 15' TERM; while :; do sleep 0.05; done"]
    )

    def drive() -> None:
        eventually(lambda: bool(children.running()), "PgBouncer to start")
        signal.raise_signal(signal.SIGTERM)

    assert supervise(supervisor.Unfenced(), children, drive, signals=supervisor.POOLER_SIGNALS) == 2  # type: ignore[arg-type]


def test_the_pooler_is_never_fenced() -> None:
    source = supervisor.Unfenced()
    assert source.fenced is False and source.known.is_set()
