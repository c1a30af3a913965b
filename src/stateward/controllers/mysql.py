"""Replication of a MySQL or MariaDB Database, driven by the operator over SQL.

Servers start read-only (``specs.mysql``); each reconcile reads every server's state
(read-only or writable, whom it replicates from, its GTID position) and :func:`plan` decides,
as a pure function of that snapshot, what to change: which server is the primary (the one
labelled so and still reachable; the first ready server when the Database never had one),
making it writable, pointing every other server at it with GTID auto-positioning, making a
writable server that is not the primary read-only again, and the role labels the Services
select on. The SQL of each engine is in :class:`Dialect`.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Any

import pymysql

from stateward.api import v1alpha1
from stateward.specs import meta
from stateward.specs import mysql as spec

CONNECT_TIMEOUT = 3


@dataclasses.dataclass(frozen=True)
class Server:
    """One server as observed: its pod, and what it said over SQL (None: unreachable)."""

    pod: str
    ready: bool
    role: str | None
    writable: bool | None = None
    source: str | None = None
    """The host it replicates from, if it is configured as a replica."""
    replicating: bool = False
    """Both replication threads running."""
    gtid: str = ""

    @property
    def reachable(self) -> bool:
        return self.writable is not None


@dataclasses.dataclass(frozen=True)
class Plan:
    primary: str | None
    promote: str | None = None
    follow: tuple[str, ...] = ()
    fence: tuple[str, ...] = ()
    labels: dict[str, str | None] = dataclasses.field(default_factory=dict)
    """Pod -> the role label it should carry (None: no role label)."""
    waiting: str | None = None
    """Why no primary could be chosen yet."""


def host_of(database: v1alpha1.Database, pod: str) -> str:
    """The stable DNS name of a server: what replicas connect to."""
    return f"{pod}.{database.headless_service_name}.{database.namespace}.svc.cluster.local"


def ordinal(pod: str) -> int:
    return int(pod.rsplit("-", 1)[1])


def plan(database: v1alpha1.Database, servers: Sequence[Server], previous: str | None) -> Plan:
    """What to change, from one snapshot of the servers. ``previous`` is the primary the
    status last named."""
    by_pod = {s.pod: s for s in servers}
    labelled = [s for s in servers if s.role == meta.PRIMARY_ROLE and s.reachable]
    writable = [s for s in servers if s.writable]
    primary: Server | None = None
    promote: str | None = None
    if len(labelled) == 1 and labelled[0].writable:
        primary = labelled[0]
    elif len(writable) == 1 and writable[0].ready:
        primary = writable[0]  # made writable, not yet labelled (the operator restarted)
    elif previous is None or previous not in by_pod:
        candidates = sorted(
            (s for s in servers if s.ready and s.reachable), key=lambda s: ordinal(s.pod)
        )
        if previous is None and candidates:
            primary, promote = candidates[0], candidates[0].pod
    elif by_pod[previous].reachable and by_pod[previous].ready:
        primary, promote = by_pod[previous], previous  # read-only after a restart: resume
    if primary is None:
        return Plan(
            primary=None,
            labels={
                s.pod: None for s in servers if s.role == meta.PRIMARY_ROLE and not s.reachable
            },
            waiting=(
                f"the primary {previous} is not reachable"
                if previous
                else "no server is ready to become the primary yet"
            ),
        )
    source = host_of(database, primary.pod)
    follow = tuple(
        s.pod
        for s in servers
        if s.pod != primary.pod and s.reachable and (s.source != source or not s.replicating)
    )
    fence = tuple(s.pod for s in servers if s.pod != primary.pod and s.writable)
    labels: dict[str, str | None] = {}
    for s in servers:
        if s.pod == primary.pod:
            wanted: str | None = meta.PRIMARY_ROLE
        elif s.reachable and s.source == source and s.replicating:
            wanted = meta.REPLICA_ROLE
        else:
            wanted = None
        if s.role != wanted:
            labels[s.pod] = wanted
    return Plan(primary=primary.pod, promote=promote, follow=follow, fence=fence, labels=labels)


# --- SQL ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Dialect:
    """What differs between MariaDB and MySQL."""

    replica_status: str
    source_host: str
    io_running: str
    sql_running: str
    gtid: str
    promote: tuple[str, ...]
    fence: tuple[str, ...]
    follow: str

    def follow_statements(self, host: str) -> tuple[str, ...]:
        return ("STOP REPLICA" if "REPLICA" in self.replica_status else "STOP SLAVE",
                self.follow, "START REPLICA" if "REPLICA" in self.replica_status
                else "START SLAVE")  # fmt: skip


MARIADB = Dialect(
    replica_status="SHOW SLAVE STATUS",
    source_host="Master_Host",
    io_running="Slave_IO_Running",
    sql_running="Slave_SQL_Running",
    gtid="@@gtid_current_pos",
    promote=("STOP SLAVE", "RESET SLAVE ALL", "SET GLOBAL read_only = OFF"),
    fence=("SET GLOBAL read_only = ON",),
    follow=(
        "CHANGE MASTER TO MASTER_HOST = %(host)s, MASTER_PORT = %(port)s,"
        " MASTER_USER = %(user)s, MASTER_PASSWORD = %(password)s,"
        " MASTER_USE_GTID = slave_pos, MASTER_CONNECT_RETRY = 1"
    ),
)
MYSQL = Dialect(
    replica_status="SHOW REPLICA STATUS",
    source_host="Source_Host",
    io_running="Replica_IO_Running",
    sql_running="Replica_SQL_Running",
    gtid="@@gtid_executed",
    promote=(
        "STOP REPLICA",
        "RESET REPLICA ALL",
        "SET GLOBAL super_read_only = OFF",
        "SET GLOBAL read_only = OFF",
    ),
    fence=("SET GLOBAL super_read_only = ON",),
    follow=(
        "CHANGE REPLICATION SOURCE TO SOURCE_HOST = %(host)s, SOURCE_PORT = %(port)s,"
        " SOURCE_USER = %(user)s, SOURCE_PASSWORD = %(password)s, SOURCE_AUTO_POSITION = 1,"
        " GET_SOURCE_PUBLIC_KEY = 1, SOURCE_CONNECT_RETRY = 1"
    ),
)


def dialect(engine: v1alpha1.Engine) -> Dialect:
    return MARIADB if engine is v1alpha1.Engine.MARIADB else MYSQL


@dataclasses.dataclass(frozen=True)
class Credentials:
    root_password: str = dataclasses.field(repr=False)
    replication_password: str = dataclasses.field(repr=False)


class SQLError(Exception):
    """A server refused or could not be reached; the message names the pod, never a value
    of the credentials."""


def _connect(address: str, credentials: Credentials) -> Any:
    return pymysql.connect(
        host=address,
        port=spec.PORT,
        user="root",
        password=credentials.root_password,
        connect_timeout=CONNECT_TIMEOUT,
        read_timeout=10,
        write_timeout=10,
        autocommit=True,
    )


def _observe(address: str, credentials: Credentials, sql: Dialect) -> dict[str, Any]:
    connection = _connect(address, credentials)
    try:
        with connection.cursor(pymysql.cursors.DictCursor) as cursor:
            cursor.execute(f"SELECT @@read_only AS read_only, {sql.gtid} AS gtid")
            row = cursor.fetchone() or {}
            cursor.execute(sql.replica_status)
            replica = cursor.fetchone() or {}
    finally:
        connection.close()
    return {
        "writable": not int(row.get("read_only") or 0),
        "gtid": str(row.get("gtid") or ""),
        "source": replica.get(sql.source_host) or None,
        "replicating": replica.get(sql.io_running) == "Yes"
        and replica.get(sql.sql_running) == "Yes",
    }


def _execute(
    address: str, credentials: Credentials, statements: Sequence[str], **params: Any
) -> None:
    connection = _connect(address, credentials)
    try:
        with connection.cursor() as cursor:
            for statement in statements:
                cursor.execute(statement, params or None)
    finally:
        connection.close()


async def observe(
    address: str | None, credentials: Credentials, engine: v1alpha1.Engine
) -> dict[str, Any]:
    """What a server says about itself; ``{}`` when it cannot be asked."""
    if not address:
        return {}
    try:
        return await asyncio.to_thread(_observe, address, credentials, dialect(engine))
    except pymysql.MySQLError:
        return {}


async def promote(address: str, credentials: Credentials, engine: v1alpha1.Engine) -> None:
    await _run(address, credentials, dialect(engine).promote)


async def fence(address: str, credentials: Credentials, engine: v1alpha1.Engine) -> None:
    await _run(address, credentials, dialect(engine).fence)


async def follow(
    address: str, credentials: Credentials, engine: v1alpha1.Engine, source: str
) -> None:
    sql = dialect(engine)
    await _run(
        address,
        credentials,
        sql.follow_statements(source),
        host=source,
        port=spec.PORT,
        user=spec.REPLICATION_USER,
        password=credentials.replication_password,
    )


async def _run(
    address: str, credentials: Credentials, statements: Sequence[str], **params: Any
) -> None:
    try:
        await asyncio.to_thread(_execute, address, credentials, statements, **params)
    except pymysql.MySQLError as error:
        code = error.args[0] if error.args else "?"
        raise SQLError(
            f"the server at {address} refused a replication change (error {code})"
        ) from None
