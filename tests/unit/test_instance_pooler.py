"""What the instances do for the pooler: make PgBouncer's role and its lookup function on
the primary, once, and nothing that lets PgBouncer see a superuser's or a replication role's
password."""

from __future__ import annotations

import subprocess
import threading
import time
from typing import Any

import pytest

from stateward.instance import pooler

pytestmark = pytest.mark.unit


class Psql:
    """psql on the pod's socket: answers STATE with ``state``, ENSURE with ``ensure_code``."""

    def __init__(self, state: str | None, ensure_code: int = 0) -> None:
        self.state, self.ensure_code = state, ensure_code
        self.statements: list[tuple[str, str, str]] = []

    def __call__(self, argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        user, database = argv[argv.index("-U") + 1], argv[argv.index("-d") + 1]
        statement = argv[-1]
        self.statements.append((user, database, statement))
        if statement == pooler.STATE:
            if self.state is None:
                return subprocess.CompletedProcess(argv, 2, "", "could not connect")
            return subprocess.CompletedProcess(argv, 0, f"{self.state}\n", "")
        assert statement == pooler.ENSURE
        return subprocess.CompletedProcess(argv, self.ensure_code, "", "")


def test_the_primary_makes_the_role_and_function_as_the_superuser_in_postgres() -> None:
    psql = Psql("primary")
    assert pooler.ensure_once("psql", run=psql) is True
    assert [s for _, _, s in psql.statements] == [pooler.STATE, pooler.ENSURE]
    assert {(u, d) for u, d, _ in psql.statements} == {("postgres", pooler.AUTH_DATABASE)}


def test_once_the_function_exists_nothing_more_is_run() -> None:
    psql = Psql("ready")
    assert pooler.ensure_once("psql", run=psql) is True
    assert [s for _, _, s in psql.statements] == [pooler.STATE]


@pytest.mark.parametrize("state", ["replica", None])
def test_a_replica_or_a_silent_postgresql_waits_for_the_primary(state: str | None) -> None:
    psql = Psql(state)
    assert pooler.ensure_once("psql", run=psql) is False
    assert [s for _, _, s in psql.statements] == [pooler.STATE]


def test_a_failed_ensure_is_tried_again(capsys: pytest.CaptureFixture[str]) -> None:
    assert pooler.ensure_once("psql", run=Psql("primary", ensure_code=1)) is False
    assert "lookup function was not made" in capsys.readouterr().err


def test_the_background_loop_stops_once_done(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = iter([False, False, True])
    calls: list[str] = []

    def once(psql: str) -> bool:
        calls.append(psql)
        return next(answers)

    monkeypatch.setattr(pooler, "ensure_once", once)
    thread = pooler.ensure_in_background("psql", threading.Event(), interval=0.01)
    thread.join(timeout=10)
    assert not thread.is_alive() and calls == ["psql"] * 3


def test_the_background_loop_ends_on_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    tries: list[str] = []
    monkeypatch.setattr(pooler, "ensure_once", lambda psql: tries.append(psql) or False)
    stop = threading.Event()
    thread = pooler.ensure_in_background("psql", stop, interval=0.01)
    eventually = time.monotonic() + 10
    while len(tries) < 2 and time.monotonic() < eventually:
        time.sleep(0.01)
    stop.set()
    thread.join(timeout=10)
    assert not thread.is_alive()


def test_the_lookup_answers_only_for_ordinary_login_roles() -> None:
    sql = pooler.ENSURE
    assert "security definer" in sql and "set search_path = pg_catalog, pg_temp" in sql
    for refusal in (
        "rolcanlogin",
        "not rolsuper",
        "not rolreplication",
        "not rolbypassrls",
        "rolname !~ '^(stateward_|pg_)'",
        "rolvaliduntil is null or rolvaliduntil > now()",
    ):
        assert refusal in sql
    # Nobody but PgBouncer's role may run it; the role itself has no password.
    assert f"revoke all on function {pooler.LOOKUP}(text) from public" in sql
    assert f"grant execute on function {pooler.LOOKUP}(text) to {pooler.ROLE}" in sql
    assert f"create role {pooler.ROLE} login;" in sql and "password" not in sql.lower().replace(
        "rolpassword", ""
    )
    assert "if not exists" in sql and "create or replace function" in sql  # idempotent
