"""The operator's SQL client of MySQL and MariaDB servers: sessions bound by deadlines and
by the leader Lease, what each server reports, and the replication changes the failover
plan (``controllers.mariadb.failover``) asks for. The SQL of each engine is in
:class:`Dialect`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import ssl
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import aiomysql
import pymysql

from stateward.api import v1alpha1
from stateward.controllers.mariadb.failover import caught_up
from stateward.specs import tls
from stateward.specs.mariadb import servers as spec

CONNECT_TIMEOUT = 3.0
"""Seconds to open a session: TCP, TLS and authentication."""
STATEMENT_TIMEOUT = 8.0
"""Seconds a statement may take before the operator abandons it and closes the session (a
hung server never holds a reconcile). Above the fence's lock wait (5 s)."""
CHANGE_MARGIN = 0.5
"""A replication change's deadline ends this long before the leader Lease could pass."""
MIN_CHANGE_WINDOW = 1.0 + CHANGE_MARGIN
"""No change is sent with less of the term left than this."""
ACCESS_DENIED = 1045
Connection = Any
"""An ``aiomysql`` connection (the driver ships no types)."""


@dataclasses.dataclass(frozen=True)
class Dialect:
    """What differs between MariaDB and MySQL."""

    replica_status: str
    source_host: str
    io_running: str
    sql_running: str
    received: str
    """The replica status column with what it has received."""
    gtid: str
    stop_receiving: str
    sql_state: str
    """The replica status column saying what the applier does."""
    wait_applied: str | None
    """Waits (at most 8 s, under the read timeout) until %(received)s has been applied: 0 when
    it has, 1 when the time ran out. None: poll the server's position (:func:`caught_up`)."""
    detach: tuple[str, ...]
    """Stop replicating and forget the source (the relay log goes too)."""
    semi_sync_clients: str | None
    """How many replicas acknowledge the primary's commits (None: no semi-sync)."""
    semi_sync_enabled: str | None
    """Whether the primary waits for acknowledgements (None: no semi-sync)."""
    semi_sync: dict[bool, tuple[str, ...]]
    """Make the server wait for a replica's acknowledgement of every commit (True), with no
    timeout to fall back to asynchronous replication, or not (False: no replicas)."""
    open_writes: tuple[str, ...]
    """Take writes: last, once the replicas are pointed at it (semi-synchronous commits
    then find a replica to acknowledge them)."""
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
    received="Gtid_IO_Pos",
    gtid="@@gtid_current_pos",
    stop_receiving="STOP SLAVE IO_THREAD",
    sql_state="Slave_SQL_Running_State",
    wait_applied=None,
    detach=("STOP SLAVE", "RESET SLAVE ALL", "SET GLOBAL rpl_semi_sync_master_enabled = OFF"),
    semi_sync_clients="SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS"
    " WHERE VARIABLE_NAME = 'RPL_SEMI_SYNC_MASTER_CLIENTS'",
    semi_sync_enabled="@@rpl_semi_sync_master_enabled",
    # Only the primary waits for acknowledgements: a replica's applier that waited too (its
    # own binary log has no replica) stalled every replicated commit. The timeout is set
    # here too, for a server started with an older configuration.
    semi_sync={
        True: (
            f"SET GLOBAL rpl_semi_sync_master_timeout = {spec.SEMI_SYNC_TIMEOUT_MS}",
            "SET GLOBAL rpl_semi_sync_master_wait_point = AFTER_SYNC",
            "SET GLOBAL rpl_semi_sync_master_enabled = ON",
        ),
        False: ("SET GLOBAL rpl_semi_sync_master_enabled = OFF",),
    },
    open_writes=("SET GLOBAL read_only = OFF",),
    # The application's sessions closed first: a commit waiting for an acknowledgement that
    # no replica will send any more (a former primary back from a freeze or a partition)
    # gets an error, never an acknowledgement, and it no longer holds the commit lock that
    # read_only waits for (read_only first hung behind such a commit for good). Then
    # read-only, within 5 s or the reconcile fails and tries again; then the sessions that
    # came in meanwhile; semi-sync off last, with nothing left to acknowledge.
    fence=(
        f"KILL CONNECTION USER '{spec.APP_USER}'",
        "SET SESSION lock_wait_timeout = 5",
        "SET GLOBAL read_only = ON",
        f"KILL CONNECTION USER '{spec.APP_USER}'",
        "SET GLOBAL rpl_semi_sync_master_enabled = OFF",
    ),
    # Over TLS, showing the replication certificate (the user requires it) and checking the
    # source's certificate for the name it is reached by (``host_of``: the wildcard of the
    # headless Service).
    follow=(
        "CHANGE MASTER TO MASTER_HOST = %(host)s, MASTER_PORT = %(port)s,"
        " MASTER_USER = %(user)s, MASTER_PASSWORD = %(password)s,"
        " MASTER_USE_GTID = current_pos, MASTER_CONNECT_RETRY = 1,"
        f" MASTER_SSL = 1, MASTER_SSL_CA = '{spec.TLS_DIR}/{tls.CA_CERT_KEY}',"
        f" MASTER_SSL_CERT = '{spec.TLS_DIR}/replication.crt',"
        f" MASTER_SSL_KEY = '{spec.TLS_DIR}/replication.key',"
        " MASTER_SSL_VERIFY_SERVER_CERT = 1"
    ),
)
MYSQL = Dialect(
    replica_status="SHOW REPLICA STATUS",
    source_host="Source_Host",
    io_running="Replica_IO_Running",
    sql_running="Replica_SQL_Running",
    received="Retrieved_Gtid_Set",
    gtid="@@gtid_executed",
    stop_receiving="STOP REPLICA IO_THREAD",
    sql_state="Replica_SQL_Running_State",
    wait_applied="SELECT WAIT_FOR_EXECUTED_GTID_SET(%(received)s, 8)",
    detach=("STOP REPLICA", "RESET REPLICA ALL"),
    semi_sync_clients=None,
    semi_sync_enabled=None,
    semi_sync={True: (), False: ()},
    open_writes=("SET GLOBAL super_read_only = OFF", "SET GLOBAL read_only = OFF"),
    fence=("SET GLOBAL super_read_only = ON",),
    follow=(
        "CHANGE REPLICATION SOURCE TO SOURCE_HOST = %(host)s, SOURCE_PORT = %(port)s,"
        " SOURCE_USER = %(user)s, SOURCE_PASSWORD = %(password)s, SOURCE_AUTO_POSITION = 1,"
        " GET_SOURCE_PUBLIC_KEY = 1, SOURCE_CONNECT_RETRY = 1"
    ),
)


def dialect(engine: v1alpha1.Engine) -> Dialect:
    return MARIADB if engine is v1alpha1.Engine.MARIADB else MYSQL


def always_leader() -> float:
    """Leadership without a Lease (a single operator replica, or tests): never runs out."""
    return math.inf


@dataclasses.dataclass(frozen=True)
class Credentials:
    root_password: str = dataclasses.field(repr=False)
    replication_password: str = dataclasses.field(repr=False)
    tls: ssl.SSLContext | None = dataclasses.field(default=None, repr=False)
    """MariaDB: the operator's client certificate and the Database's CA. The operator then
    logs in as its own account (``tls.MARIADB_OPERATOR_USERNAME``), which only that
    certificate opens; servers are addressed by IP, so the chain is checked, not the name."""
    leadership: Callable[[], float] = dataclasses.field(default=always_leader, repr=False)
    """Seconds for which no other operator replica can hold the leader Lease (0: this one
    does not hold it). A replication change is sent only while at least
    :data:`MIN_CHANGE_WINDOW` is left, and its deadline is cut to end
    :data:`CHANGE_MARGIN` before the term does (at most :data:`STATEMENT_TIMEOUT`): no
    failover or promotion statement runs on a server after this replica may have lost
    leadership."""


class SQLError(Exception):
    """A server refused or could not be reached; the message names the pod, never a value
    of the credentials."""


class NotLeader(SQLError):
    """A replication change was not sent: this operator replica's hold on the leader Lease
    is not sure to outlast it."""


def _code(error: pymysql.MySQLError) -> object:
    return error.args[0] if error.args else "?"


@contextlib.asynccontextmanager
async def _session(address: str, credentials: Credentials) -> AsyncIterator[Connection]:
    """A connection, logged in within :data:`CONNECT_TIMEOUT` (TCP, TLS, authentication);
    closed on the way out however that is (a timeout or a cancellation closes the socket)."""
    try:
        async with asyncio.timeout(CONNECT_TIMEOUT):
            connection = await _connect(address, credentials)
    except TimeoutError:
        raise SQLError(
            f"the server at {address} did not let the operator log in within {CONNECT_TIMEOUT:.0f}s"
        ) from None
    except (pymysql.MySQLError, OSError) as error:
        code = _code(error) if isinstance(error, pymysql.MySQLError) else type(error).__name__
        raise SQLError(f"the server at {address} refused the operator (error {code})") from None
    try:
        yield connection
    finally:
        connection.close()


async def _connect(address: str, credentials: Credentials) -> Connection:
    if credentials.tls is None:
        return await _login(address, "root", credentials.root_password, None)
    try:
        return await _login(address, tls.MARIADB_OPERATOR_USERNAME, "", credentials.tls)
    except pymysql.err.OperationalError as error:
        if _code(error) != ACCESS_DENIED:
            raise
    # A server started before its accounts had the operator's (``users.sql`` adds it at the
    # next start) still has root over the network: log in that way.
    return await _login(address, "root", credentials.root_password, None)


async def _login(
    address: str, user: str, password: str, context: ssl.SSLContext | None
) -> Connection:
    return await aiomysql.connect(
        host=address,
        port=spec.PORT,
        user=user,
        password=password,
        ssl=context,
        connect_timeout=CONNECT_TIMEOUT,
        autocommit=True,
    )


async def _query(
    address: str,
    connection: Connection,
    statement: str,
    params: dict[str, Any] | None = None,
    *,
    within: float = STATEMENT_TIMEOUT,
) -> dict[str, Any]:
    """One statement, answered ``within`` seconds or abandoned (the connection is closed):
    its first row by column name."""
    try:
        async with asyncio.timeout(within), connection.cursor(aiomysql.DictCursor) as cursor:
            await cursor.execute(statement, params)
            return dict(await cursor.fetchone() or {})
    except TimeoutError:
        raise SQLError(f"the server at {address} did not answer within {within:.1f}s") from None
    except pymysql.MySQLError as error:
        raise SQLError(f"the server at {address} refused a query (error {_code(error)})") from None
    except OSError as error:
        raise SQLError(
            f"the server at {address} dropped the session ({type(error).__name__})"
        ) from None


async def _observe(address: str, credentials: Credentials, sql: Dialect) -> dict[str, Any]:
    semi_sync = f", {sql.semi_sync_enabled} AS semi_sync" if sql.semi_sync_enabled else ""
    async with _session(address, credentials) as connection:
        row = await _query(
            address, connection, f"SELECT @@read_only AS read_only, {sql.gtid} AS gtid{semi_sync}"
        )
        replica = await _query(address, connection, sql.replica_status)
    return {
        "writable": not int(row.get("read_only") or 0),
        "semi_sync": bool(int(row["semi_sync"])) if row.get("semi_sync") is not None else None,
        "gtid": str(row.get("gtid") or ""),
        "source": replica.get(sql.source_host) or None,
        "replicating": replica.get(sql.io_running) == "Yes"
        and replica.get(sql.sql_running) == "Yes",
        "received": str(replica.get(sql.received) or ""),
        "replica_error": int(replica.get("Last_IO_Errno") or replica.get("Last_SQL_Errno") or 0),
    }


async def _scalar(
    address: str,
    credentials: Credentials,
    statement: str,
    *,
    within: float = STATEMENT_TIMEOUT,
    **params: Any,
) -> Any:
    """The first value of the first row."""
    async with _session(address, credentials) as connection:
        row = await _query(address, connection, statement, params or None, within=within)
    return next(iter(row.values()), None)


async def observe(
    address: str | None, credentials: Credentials, engine: v1alpha1.Engine
) -> dict[str, Any]:
    """What a server says about itself; ``{}`` when it cannot be asked."""
    if not address:
        return {}
    try:
        return await _observe(address, credentials, dialect(engine))
    except SQLError:
        return {}


async def detach(
    address: str, credentials: Credentials, engine: v1alpha1.Engine, received: str = ""
) -> None:
    """The first half of a promotion: a replica applies everything it received, then stops
    replicating. It stays read-only until :func:`open_writes`."""
    sql = dialect(engine)
    if received:
        # Stop taking more from the lost primary, then apply what the relay log holds: the
        # reset drops the relay log, and with it anything not applied. (Not a wait for the
        # received GTID: the last one may begin a transaction that never arrived whole.)
        await _run(address, credentials, (sql.stop_receiving,))
        if not await _relay_log_applied(address, credentials, sql, within=8.0):
            raise SQLError(f"the server at {address} is still applying its relay log")
    await _run(address, credentials, sql.detach)


async def _relay_log_applied(
    address: str, credentials: Credentials, sql: Dialect, *, within: float
) -> bool:
    """Whether the applier, no longer receiving, says it has read all of the relay log."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        async with _session(address, credentials) as connection:
            row = await _query(address, connection, sql.replica_status)
        state = str(row.get(sql.sql_state) or "")
        if "read all relay log" in state or not state:
            return True
        if asyncio.get_running_loop().time() >= deadline:
            return False
        await asyncio.sleep(0.2)


async def wait_for_replicas(
    address: str, credentials: Credentials, engine: v1alpha1.Engine, *, within: float = 5.0
) -> bool:
    """Until a replica is connected to acknowledge commits (semi-synchronous replication):
    a commit with none waits out the whole timeout. False if none came ``within`` seconds."""
    query = dialect(engine).semi_sync_clients
    if query is None:
        return True
    deadline = asyncio.get_running_loop().time() + within
    while True:
        if int(await _scalar(address, credentials, query) or 0) >= 1:
            return True
        if asyncio.get_running_loop().time() >= deadline:
            return False
        await asyncio.sleep(0.2)


async def open_writes(
    address: str, credentials: Credentials, engine: v1alpha1.Engine, *, semi_sync: bool
) -> None:
    """Take writes; with ``semi_sync`` (the Database has replicas) each commit waits for a
    replica's acknowledgement, however long."""
    sql = dialect(engine)
    await _run(address, credentials, (*sql.semi_sync[semi_sync], *sql.open_writes))


async def set_semi_sync(
    address: str, credentials: Credentials, engine: v1alpha1.Engine, *, on: bool
) -> None:
    """The primary's wait for acknowledgements, on while the Database has replicas."""
    await _run(address, credentials, dialect(engine).semi_sync[on])


async def stop_receiving(address: str, credentials: Credentials, engine: v1alpha1.Engine) -> None:
    """A replica takes no more from its source (and so acknowledges nothing more of it); it
    still applies what it received."""
    await _run(address, credentials, (dialect(engine).stop_receiving,))


async def promote(
    address: str,
    credentials: Credentials,
    engine: v1alpha1.Engine,
    received: str = "",
    *,
    semi_sync: bool,
) -> None:
    """Make the server the primary at once (both halves)."""
    await detach(address, credentials, engine, received)
    await open_writes(address, credentials, engine, semi_sync=semi_sync)


async def switchover(
    primary: str,
    target: str,
    credentials: Credentials,
    engine: v1alpha1.Engine,
    *,
    semi_sync: bool,
) -> None:
    """A planned change of primary: the primary stops taking writes, the target applies
    everything the primary wrote, then takes over (the others are pointed at it next). If
    the target cannot catch up, the primary takes writes again and nothing changed."""
    sql = dialect(engine)
    await _run(primary, credentials, sql.fence)
    written = await observe(primary, credentials, engine)
    if not written or not await _applied(target, credentials, sql, written["gtid"], within=8.0):
        await promote(primary, credentials, engine, semi_sync=semi_sync)
        raise SQLError(f"the server at {target} did not catch up with the primary in time")
    await promote(target, credentials, engine, semi_sync=semi_sync)


async def _applied(
    address: str, credentials: Credentials, sql: Dialect, written: str, *, within: float
) -> bool:
    """Whether the server applies everything up to ``written`` within ``within`` seconds."""
    if sql.wait_applied is not None:
        waited = await _scalar(
            address, credentials, sql.wait_applied, within=within + STATEMENT_TIMEOUT,
            received=written,
        )  # fmt: skip
        return bool(waited == 0)
    deadline = asyncio.get_running_loop().time() + within
    while True:
        if caught_up(str(await _scalar(address, credentials, f"SELECT {sql.gtid}") or ""), written):
            return True
        if asyncio.get_running_loop().time() >= deadline:
            return False
        await asyncio.sleep(0.2)


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
    """Replication changes, one statement at a time, each sent only while this operator
    replica surely holds the leader Lease for longer than the statement may take."""
    async with _session(address, credentials) as connection:
        for statement in statements:
            # The statement's deadline ends inside the term: the operator gives up on it (and
            # closes the connection) before another replica can hold the Lease.
            left = credentials.leadership()
            if left < MIN_CHANGE_WINDOW:
                raise NotLeader(
                    f"this operator replica may lose the leader Lease before a change to the"
                    f" server at {address} completes: nothing more sent"
                )
            timeout = min(STATEMENT_TIMEOUT, left - CHANGE_MARGIN)
            try:
                await _query(address, connection, statement, params or None, within=timeout)
            except SQLError as error:
                raise SQLError(f"{error} (a replication change)") from None
