"""The operator's SQL sessions with MySQL and MariaDB servers: a hung server never holds a
reconcile, and no replication change is sent by an operator replica whose hold on the leader
Lease may not outlast it (issue 22: "SQL fenced by leadership")."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from typing import Any

import pytest

from stateward.api.v1alpha1 import Engine
from stateward.controllers.mariadb import sql
from stateward.runtime.leader import LeaderElector
from tests.support.clock import Clock

pytestmark = pytest.mark.unit


@pytest.fixture
async def silent_server(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[str]:
    """A server on loopback that accepts connections and never says a word (a frozen node's
    kernel still completes the TCP handshake for a while: this is what the operator meets)."""
    held: list[asyncio.StreamWriter] = []

    async def accept(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    monkeypatch.setattr(sql.spec, "PORT", server.sockets[0].getsockname()[1])
    monkeypatch.setattr(sql, "CONNECT_TIMEOUT", 0.3)
    try:
        yield "127.0.0.1"
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()


CREDENTIALS = sql.Credentials(root_password="r00t", replication_password="repl")


async def test_a_server_that_never_answers_is_observed_as_unreachable_not_waited_for(
    silent_server: str,
) -> None:
    # The bound is the session's, not a thread left behind: the call itself returns.
    observed = await asyncio.wait_for(sql.observe(silent_server, CREDENTIALS, Engine.MARIADB), 10)
    assert observed == {}


async def test_a_change_to_a_server_that_never_answers_fails_with_its_address_and_no_secret(
    silent_server: str,
) -> None:
    with pytest.raises(sql.SQLError) as raised:
        await asyncio.wait_for(sql.fence(silent_server, CREDENTIALS, Engine.MARIADB), 10)
    message = str(raised.value)
    assert silent_server in message and "log in" in message
    assert "r00t" not in message and "repl" not in message


class Recorder:
    """Stands in for the session and the wire: records each statement and its deadline."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, float]] = []

    @contextlib.asynccontextmanager
    async def session(self, address: str, credentials: sql.Credentials) -> AsyncIterator[Any]:
        yield object()

    async def query(
        self,
        address: str,
        connection: Any,
        statement: str,
        params: Any = None,
        *,
        within: float = sql.STATEMENT_TIMEOUT,
    ) -> dict[str, Any]:
        self.sent.append((statement, within))
        return {}


@pytest.fixture
def wire(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    recorder = Recorder()
    monkeypatch.setattr(sql, "_session", recorder.session)
    monkeypatch.setattr(sql, "_query", recorder.query)
    return recorder


def holding(*terms: float) -> sql.Credentials:
    """Credentials of an operator whose term left reads ``terms`` in turn (then the last)."""
    values = itertools.chain(terms, itertools.repeat(terms[-1]))
    return sql.Credentials(
        root_password="r00t", replication_password="repl", leadership=lambda: next(values)
    )


async def test_an_operator_that_lost_the_lease_sends_no_promotion(wire: Recorder) -> None:
    with pytest.raises(sql.NotLeader, match="leader Lease"):
        await sql.open_writes("10.0.0.5", holding(0.0), Engine.MARIADB, semi_sync=True)
    assert wire.sent == []


async def test_a_failover_stops_sending_the_moment_the_term_runs_short(wire: Recorder) -> None:
    # The promotion's first statements go out; the term then runs short: the rest (the one
    # that opens writes) is never sent.
    statements = (*sql.MARIADB.semi_sync[True], *sql.MARIADB.open_writes)
    with pytest.raises(sql.NotLeader):
        await sql.open_writes(
            "10.0.0.5", holding(12.0, 12.0, 12.0, 1.0), Engine.MARIADB, semi_sync=True
        )
    assert [s for s, _ in wire.sent] == list(statements[:3])
    assert "SET GLOBAL read_only = OFF" not in [s for s, _ in wire.sent]


async def test_each_change_is_given_up_on_before_the_term_could_pass(wire: Recorder) -> None:
    await sql.fence("10.0.0.5", holding(30.0, 4.0, 2.0), Engine.MARIADB)
    deadlines = [within for _, within in wire.sent]
    assert deadlines[0] == sql.STATEMENT_TIMEOUT, "a long term: the usual deadline"
    assert deadlines[1] == 4.0 - sql.CHANGE_MARGIN
    assert all(within == 2.0 - sql.CHANGE_MARGIN for within in deadlines[2:])
    assert len(wire.sent) == len(sql.MARIADB.fence)


async def test_reading_a_server_needs_no_lease(wire: Recorder) -> None:
    # Observing is what a standby may do too; only changes are fenced.
    await sql.observe("10.0.0.5", holding(0.0), Engine.MARIADB)
    assert [s for s, _ in wire.sent] == [
        "SELECT @@read_only AS read_only, @@gtid_current_pos AS gtid,"
        " @@rpl_semi_sync_master_enabled AS semi_sync",
        "SHOW SLAVE STATUS",
    ]


async def test_a_term_counts_from_when_its_renew_was_sent_not_answered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A renew the API server took 1.5 s to answer may have been committed (and seen by a
    # candidate, who then waits one lease duration) 1.5 s before we heard of it.
    clock = Clock(1000.0)
    elector = LeaderElector(
        client=None,  # type: ignore[arg-type]
        namespace="ops",
        name="stateward",
        identity="a",
        lease_duration=15,
        renew_deadline=10,
        retry_period=0.01,
        clock=clock,
    )
    stop = asyncio.Event()

    async def slow_renew() -> bool:
        clock.now += 1.5
        stop.set()
        return True

    async def released() -> None:
        return None

    monkeypatch.setattr(elector, "_try_acquire_or_renew", slow_renew)
    monkeypatch.setattr(elector, "_release", released)
    await asyncio.wait_for(elector.run(stop), 10)
    assert elector.is_leader()
    assert elector.term_left() == pytest.approx(13.5)
    clock.now += 8.0
    assert elector.term_left() == pytest.approx(5.5)
    clock.now += 0.6  # the renew is 10.1 s old: past the renew deadline, no longer leader
    assert not elector.is_leader() and elector.term_left() == 0.0
