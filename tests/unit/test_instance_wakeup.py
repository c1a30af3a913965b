"""Waking Patroni's HA loop when a WAL sender ends (stateward.instance.wakeup): which
processes count, when the wake-up is sent, and the request a real HTTPS server receives."""

from __future__ import annotations

import base64
import http.server
import json
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stateward import pki
from stateward.instance import wakeup

pytestmark = pytest.mark.unit


def process(proc: Path, pid: int, title: bytes) -> None:
    (proc / str(pid)).mkdir()
    (proc / str(pid) / "cmdline").write_bytes(title)


def test_walsenders_are_found_by_the_title_postgresql_gives_them(tmp_path: Path) -> None:
    process(tmp_path, 1, b"/usr/bin/python3\0-m\0stateward.instance\0run\0")
    process(tmp_path, 40, b"postgres: demo: checkpointer \0\0\0")
    process(
        tmp_path, 41, b"postgres: demo: walsender replicator 10.0.0.7(40112) streaming 0/3000060"
    )
    process(
        tmp_path, 42, b"postgres: demo: walsender replicator 10.0.0.8(40118) streaming 0/3000060"
    )
    process(tmp_path, 43, b"postgres: demo: walreceiver streaming 0/3000060")
    process(tmp_path, 44, b"vi\0/tmp/postgres: demo: walsender notes\0")  # not PostgreSQL's
    (tmp_path / "self").mkdir()
    (tmp_path / "45").mkdir()  # ended between the listing and the read: no cmdline
    assert wakeup.walsenders(tmp_path) == {41, 42}
    assert wakeup.walsenders(tmp_path / "missing") == frozenset()


def test_the_loop_is_woken_when_a_walsender_ends_not_when_one_starts() -> None:
    looks = iter([{1}, {1, 2}, {1, 2}, {2}, {2, 3}, {3}, set()])
    stop = threading.Event()
    woken: list[int] = []
    seen: list[set[int]] = []

    def find() -> frozenset[int]:
        current = next(looks, None)
        if current is None:
            stop.set()
            return frozenset(seen[-1])
        seen.append(current)
        return frozenset(current)

    wakeup.watch(lambda: woken.append(len(seen)), stop, find=find, interval=0)
    # 1 left at the fourth look, 2 at the sixth, 3 at the seventh; starting never wakes.
    assert woken == [4, 6, 7]


@pytest.fixture
def patroni_api(tmp_path: Path) -> Iterator[tuple[int, Path, list[dict[str, Any]], list[int]]]:
    """An HTTPS server standing in for Patroni's REST API: records each request, answers
    with the next status of its list (200 when empty)."""
    authority = pki.Authority.new("demo CA")
    issued = authority.issue(common_name="demo-0", hosts=["demo-0.demo"], server=True)
    (tmp_path / "tls.crt").write_bytes(issued.cert)
    (tmp_path / "tls.key").write_bytes(issued.key)
    (tmp_path / "ca.crt").write_bytes(authority.cert_pem)
    received: list[dict[str, Any]] = []
    answers: list[int] = []

    class Api(http.server.BaseHTTPRequestHandler):
        def do_PATCH(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            received.append(
                {
                    "path": self.path,
                    "authorization": self.headers.get("Authorization"),
                    "body": json.loads(self.rfile.read(length)),
                }
            )
            self.send_response(answers.pop(0) if answers else 200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Api)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1], tmp_path / "ca.crt", received, answers
    finally:
        server.shutdown()
        server.server_close()


def test_the_wake_up_is_an_authenticated_patch_that_changes_nothing(
    patroni_api: tuple[int, Path, list[dict[str, Any]], list[int]],
) -> None:
    port, ca, received, _ = patroni_api
    waker = wakeup.Waker(port, ("stateward", "s3cret"), str(ca))
    assert waker.wake() is True
    (request,) = received
    assert request["path"] == "/config"
    assert request["authorization"] == "Basic " + base64.b64encode(b"stateward:s3cret").decode()
    # Patroni removes null keys and writes nothing when nothing changed: only the key that
    # is never there, set to null.
    assert request["body"] == {"stateward_wakeup": None}


def test_a_refused_wake_up_is_said_once_and_its_recovery_once(
    patroni_api: tuple[int, Path, list[dict[str, Any]], list[int]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    port, ca, received, answers = patroni_api
    answers += [401, 401]
    waker = wakeup.Waker(port, ("stateward", "wrong"), str(ca))
    assert waker.wake() is False and waker.wake() is False
    assert waker.wake() is True
    said = capsys.readouterr().err.splitlines()
    assert said == [
        "stateward-instance: could not wake Patroni: 401 Unauthorized",
        "stateward-instance: Patroni answers the wake-up again",
    ]
    assert "wrong" not in "".join(said)
    assert len(received) == 3


def test_a_server_the_cluster_ca_did_not_sign_is_never_sent_the_password(
    patroni_api: tuple[int, Path, list[dict[str, Any]], list[int]], tmp_path: Path
) -> None:
    port, _, received, _ = patroni_api
    other = tmp_path / "other-ca.crt"
    other.write_bytes(pki.Authority.new("another CA").cert_pem)
    assert wakeup.Waker(port, ("stateward", "s3cret"), str(other)).wake() is False
    assert received == []
