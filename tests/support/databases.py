"""Databases (MySQL and MariaDB servers) as a user's program sees them: created, waited for
until Running, their credentials, SQL through a pod's address, and a writer that records
every acknowledged write — shared by the real-node tests and ``make bench-mariadb``."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import itertools
import socket
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

import pymysql
from lightkube import Client, codecs
from lightkube.resources.core_v1 import Pod, Secret, Service
from lightkube.types import PatchType

from stateward.controllers.kube import DatabaseResource
from tests.support.waiting import wait_for


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
                                 autocommit=True, connect_timeout=5, ssl=tls_of(app))  # fmt: skip
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


class Writer:
    """Inserts numbered rows through the ``-primary`` Service (as an application would) and
    records each acknowledged one with the moment it was acknowledged."""

    def __init__(self, address: str, app: dict[str, str], table: str = "acked") -> None:
        self.address, self.app, self.table = address, app, table
        self.acked: list[tuple[int, float]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        connection: Any = None
        number = 0
        while not self.stop.is_set():
            try:
                if connection is None:
                    connection = pymysql.connect(
                        host=self.address, port=3306, user=self.app["user"],
                        password=self.app["password"], database=self.app["dbname"],
                        autocommit=True, connect_timeout=2, read_timeout=5, write_timeout=5,
                        ssl=tls_of(self.app),
                    )  # fmt: skip
                with connection.cursor() as cursor:
                    insert = f"INSERT INTO {self.table} (n) VALUES (%s)"  # noqa: S608 (our name)
                    cursor.execute(insert, (number + 1,))
                number += 1
                self.acked.append((number, time.monotonic()))
            except pymysql.MySQLError:
                with contextlib.suppress(Exception):
                    if connection is not None:
                        connection.close()
                connection = None
                number += 1  # a row that may or may not have been written: never reused
                self.stop.wait(0.1)

    def __enter__(self) -> Writer:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)

    def since(self, moment: float) -> int:
        return sum(1 for _, at in self.acked if at > moment)

    def longest_gap(self) -> float:
        stamps = [at for _, at in self.acked]
        return max((b - a for a, b in itertools.pairwise(stamps)), default=0.0)


class ServersWriter:
    """An application inserting numbered rows into whichever server takes writes: it keeps
    one connection while that works and, when it fails, tries every server's address in
    turn (as a connector with a list of hosts does), using the first that is writable. Each
    acknowledged row is recorded with when and by which server; a commit without an answer
    in 5 s (a server waiting for a replica's acknowledgement that never comes) is not."""

    def __init__(self, addresses: Callable[[], list[str]], app: dict[str, str], table: str) -> None:
        self.addresses, self.app, self.table = addresses, app, table
        self.acked: list[tuple[int, float, str]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.known: list[str] = []

    def _connect(self) -> tuple[Any, str] | None:
        with contextlib.suppress(Exception):
            self.known = self.addresses() or self.known  # the API server may be cut off too
        for address in self.known:
            try:
                connection = pymysql.connect(
                    host=address, port=3306, user=self.app["user"],
                    password=self.app["password"], database=self.app["dbname"],
                    autocommit=True, connect_timeout=2, read_timeout=5, write_timeout=5,
                    ssl=tls_of(self.app),
                )  # fmt: skip
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
                    insert = f"INSERT INTO {self.table} (n) VALUES (%s)"  # noqa: S608 (our name)
                    cursor.execute(insert, (number,))
                self.acked.append((number, time.monotonic(), current[1]))
            except pymysql.MySQLError:
                with contextlib.suppress(Exception):
                    if current is not None:
                        current[0].close()
                current = None  # the row ``number`` may or may not exist: never reused

    def __enter__(self) -> ServersWriter:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)

    def wait_acks(self, count: int, timeout: float = 120) -> None:
        """Wait for ``count`` more acknowledged writes than there are now."""
        start = len(self.acked)
        wait_for(lambda: len(self.acked) >= start + count,
                 what=f"{count} more acknowledged writes", timeout=timeout)  # fmt: skip

    def longest_gap(self) -> float:
        stamps = [at for _, at, _ in self.acked]
        return max((b - a for a, b in itertools.pairwise(stamps)), default=0.0)

    def servers(self) -> list[str]:
        """The servers that acknowledged writes, in order, each run counted once: ``[old,
        new]`` for one failover; ``[old, new, old]`` means two servers accepted writes."""
        runs = [server for _, _, server in self.acked]
        return [s for i, s in enumerate(runs) if i == 0 or runs[i - 1] != s]


@dataclasses.dataclass(frozen=True)
class Failover:
    """One primary lost under a writer, as the writer and the status saw it."""

    old: str
    new: str
    acknowledged: frozenset[int]
    lost: tuple[int, ...]
    """Acknowledged writes the new primary does not have: must be empty."""
    longest_gap: float
    """Seconds: the longest time between two acknowledged writes (the write downtime)."""
    reported_after: float
    """Seconds from the pod's deletion until ``status.lastFailover`` named the new primary."""


def lose_the_primary(client: Client, ns: str, name: str, table: str) -> Failover:
    """Delete the primary's pod while a writer inserts into ``table`` (made here) through the
    ``NAME-primary`` Service; wait for the operator to report the failover and for writes to
    be acknowledged again (by the new primary: the old one was fenced first); then compare
    what was acknowledged with what the new primary holds."""
    status = client.get(DatabaseResource, name, namespace=ns).to_dict()["status"]
    old, before = status["primaryPod"], status.get("lastFailover")
    app = secret(client, ns, f"{name}-app")
    query(pod_ip(client, ns, old), app, f"CREATE TABLE {table} (n INT PRIMARY KEY)")
    service = client.get(Service, f"{name}-primary", namespace=ns).spec.clusterIP  # type: ignore[union-attr]
    assert service
    with Writer(service, app, table) as writer:
        wait_for(lambda: len(writer.acked) >= 50, what="the writer under way", timeout=60)
        deleted_at = time.monotonic()
        client.delete(Pod, old, namespace=ns)

        def reported() -> dict[str, Any] | None:
            found = client.get(DatabaseResource, name, namespace=ns).to_dict().get("status") or {}
            last = found.get("lastFailover")
            return last if last and last != before and last.get("fromPod") == old else None

        failover = wait_for(reported, what="the operator to fail over", timeout=120)
        reported_at = time.monotonic()
        wait_for(lambda: writer.since(reported_at) >= 50,
                 what="writes again through the Service", timeout=120)  # fmt: skip
    new = failover["toPod"]
    acknowledged = frozenset(n for n, _ in writer.acked)
    rows = query(pod_ip(client, ns, new), app, f"SELECT n FROM {table}")  # noqa: S608 (ours)
    stored = {row[0] for row in rows}
    return Failover(
        old=old,
        new=new,
        acknowledged=acknowledged,
        lost=tuple(sorted(acknowledged - stored)),
        longest_gap=writer.longest_gap(),
        reported_after=reported_at - deleted_at,
    )


def refused(address: str, **options: Any) -> pymysql.MySQLError | None:
    """The error a login from the network gets, or None if it got in."""
    try:
        pymysql.connect(host=address, port=3306, connect_timeout=5, **options).close()
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
