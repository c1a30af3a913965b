"""Databases (MySQL and MariaDB servers) as a user's program sees them: created, waited for
until Running, their credentials, SQL through a pod's address, and a writer that records
every acknowledged write — shared by the real-node tests and ``make bench-mariadb``."""

from __future__ import annotations

import base64
import contextlib
import itertools
import socket
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

import pymysql
from lightkube import Client, codecs
from lightkube.resources.core_v1 import Pod, Secret
from lightkube.types import PatchType

from lab.waiting import wait_for
from stateward.controllers.kube import DatabaseResource


def create(client: Client, ns: str, name: str, engine: str, version: str, replicas: int) -> None:
    client.create(
        codecs.from_dict(
            {
                "apiVersion": "stateward.io/v1alpha1",
                "kind": "Database",
                "metadata": {"name": name, "namespace": ns},
                "spec": {"engine": engine, "version": version, "replicas": replicas,
                         "storage": {"size": "1Gi"}},
            }
        )
    )  # fmt: skip


def running(
    client: Client, ns: str, name: str, replicas: int, timeout: float = 240
) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        found: dict[str, Any] = client.get(DatabaseResource, name, namespace=ns).to_dict()
        status = found.get("status") or {}
        done = status.get("phase") == "Running" and status.get("readyReplicas") == replicas
        return found if done and status.get("observedGeneration") == found["metadata"][
            "generation"] else None  # fmt: skip

    return wait_for(check, what=f"{ns}/{name} Running with {replicas}", timeout=timeout, interval=1)


def resize(client: Client, ns: str, name: str, spec: dict[str, Any]) -> None:
    client.patch(DatabaseResource, name, {"spec": spec}, namespace=ns,
                 patch_type=PatchType.MERGE)  # fmt: skip


def secret(client: Client, ns: str, name: str) -> dict[str, str]:
    found = client.get(Secret, name, namespace=ns)
    return {k: base64.b64decode(v).decode() for k, v in (found.data or {}).items()}


def pod_ip(client: Client, ns: str, pod: str) -> str:
    found = client.get(Pod, pod, namespace=ns)
    assert found.status is not None and found.status.podIP
    return found.status.podIP


def tls_of(app: dict[str, str]) -> ssl.SSLContext:
    """How an application connects: over TLS, trusting the Database's CA from the app Secret
    (by pod or Service IP here, so the chain is checked and not the name)."""
    assert "ca.crt" in app, "the app Secret carries no ca.crt"
    context = ssl.create_default_context(cadata=app["ca.crt"])
    context.check_hostname = False
    return context


def query(address: str, app: dict[str, str], statement: str) -> tuple[Any, ...]:
    connection = pymysql.connect(host=address, port=3306, user=app["user"],
                                 password=app["password"], database=app["dbname"],
                                 autocommit=True, connect_timeout=5, read_timeout=30,
                                 write_timeout=30, ssl=tls_of(app))  # fmt: skip
    try:
        with connection.cursor() as cursor:
            cursor.execute(statement)
            return tuple(cursor.fetchall())
    finally:
        connection.close()


def roles(client: Client, ns: str) -> dict[str, str | None]:
    return {
        p.metadata.name: (p.metadata.labels or {}).get("stateward.io/role")  # type: ignore[union-attr]
        for p in client.list(Pod, namespace=ns, labels={"app.kubernetes.io/name": "mariadb"})
        if p.metadata is not None and p.metadata.deletionTimestamp is None
    }


PROBE_BASE = 1_000_000_000
"""The probe's rows are numbered from here: the writer's never reach it."""


class ServersWriter:
    """An application inserting numbered rows into whichever server takes writes: it keeps
    one connection while that works and, when it fails, tries every server's address in
    turn (as a connector with a list of hosts does), using the first that is writable. Each
    acknowledged row is recorded with when and by which server; a commit without an answer
    in 5 s (a server waiting for a replica's acknowledgement that never comes) is not.

    Beside it a probe tries an insert on *every* server twice a second, whatever its role,
    as a client with a stale address would: what any server acknowledges counts — it must
    survive like the writer's rows, and it shows a second server accepting writes even while
    the writer is busy with the first."""

    def __init__(self, addresses: Callable[[], list[str]], app: dict[str, str], table: str) -> None:
        self.addresses, self.app, self.table = addresses, app, table
        self.acked: list[tuple[int, float, str]] = []
        self.probed: list[tuple[int, float, str]] = []
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._run, daemon=True),
            threading.Thread(target=self._probe, daemon=True),
        ]
        self.known: list[str] = []
        self.insert = f"INSERT INTO {table} (n) VALUES (%s)"  # noqa: S608 - our own table

    def _login(self, address: str) -> Any:
        return pymysql.connect(
            host=address, port=3306, user=self.app["user"], password=self.app["password"],
            database=self.app["dbname"], autocommit=True, connect_timeout=2, read_timeout=5,
            write_timeout=5, ssl=tls_of(self.app),
        )  # fmt: skip

    def _connect(self) -> tuple[Any, str] | None:
        with contextlib.suppress(Exception):
            self.known = self.addresses() or self.known  # the API server may be cut off too
        for address in self.known:
            try:
                connection = self._login(address)
            except pymysql.MySQLError:
                continue
            with connection.cursor() as cursor:
                cursor.execute("SELECT @@read_only")
                if cursor.fetchone() == (0,):
                    return connection, address
            connection.close()
        return None

    def _run(self) -> None:
        current: tuple[Any, str] | None = None
        number = 0
        while not self.stop.is_set():
            try:
                if current is None:
                    current = self._connect()
                    if current is None:
                        self.stop.wait(0.2)
                        continue
                number += 1
                with current[0].cursor() as cursor:
                    cursor.execute(self.insert, (number,))
                self.acked.append((number, time.monotonic(), current[1]))
            except pymysql.MySQLError:
                with contextlib.suppress(Exception):
                    if current is not None:
                        current[0].close()
                current = None  # the row ``number`` may or may not exist: never reused

    def _probe(self) -> None:
        number = PROBE_BASE
        while not self.stop.wait(0.5):
            for address in list(self.known):
                number += 1
                try:
                    connection = self._login(address)
                except pymysql.MySQLError:
                    continue
                try:
                    with connection.cursor() as cursor:
                        cursor.execute(self.insert, (number,))
                    self.probed.append((number, time.monotonic(), address))
                except pymysql.MySQLError:
                    pass  # read-only, or no answer in time: not acknowledged
                finally:
                    with contextlib.suppress(Exception):
                        connection.close()

    def __enter__(self) -> ServersWriter:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)

    def wait_acks(self, count: int, timeout: float = 120) -> None:
        """Wait for ``count`` more acknowledged writes of the writer than there are now."""
        start = len(self.acked)
        wait_for(lambda: len(self.acked) >= start + count,
                 what=f"{count} more acknowledged writes", timeout=timeout)  # fmt: skip

    def acknowledged(self) -> frozenset[int]:
        """Every row a server acknowledged, the writer's and the probe's."""
        return frozenset(n for n, _, _ in (*self.acked, *self.probed))

    def longest_gap(self) -> float:
        """The writer's longest wait between two acknowledged writes (the write downtime)."""
        stamps = [at for _, at, _ in self.acked]
        return max((b - a for a, b in itertools.pairwise(stamps)), default=0.0)

    def servers(self) -> list[str]:
        """The servers that acknowledged writes (the writer's and the probe's), in the order
        of the acknowledgements, each run counted once: ``[old, new]`` for one failover;
        ``[old, new, old]`` means two servers accepted writes."""
        runs = [server for _, _, server in sorted((*self.acked, *self.probed),
                                                  key=lambda ack: ack[1])]  # fmt: skip
        return [s for i, s in enumerate(runs) if i == 0 or runs[i - 1] != s]


def refused(address: str, **options: Any) -> pymysql.MySQLError | None:
    """The error a login from the network gets, or None if it got in."""
    try:
        pymysql.connect(
            host=address, port=3306, connect_timeout=5, read_timeout=10, **options
        ).close()
    except pymysql.MySQLError as error:
        return error
    return None


def clone_stream_bytes(
    address: str, port: int, *, context: ssl.SSLContext | None, token: str
) -> bytes:
    """What a client gets from a MariaDB server's clone port after sending ``token`` (the old
    protocol: the replication password on one line), plainly or over TLS with ``context``."""
    received = b""
    try:
        with socket.create_connection((address, port), timeout=5) as raw:
            stream = context.wrap_socket(raw, server_hostname=address) if context else raw
            with stream:
                stream.sendall(token.encode() + b"\n")
                while len(received) < 65536:
                    chunk = stream.recv(65536)
                    if not chunk:
                        break
                    received += chunk
    except (OSError, ssl.SSLError):
        pass
    return received
