"""One run of the bare-Patroni lab (:mod:`bench.patroni_lab`): the :class:`Writer` that
inserts numbered rows through whichever member accepts writes, the :class:`Watch` that polls
every member's REST API, the faults themselves (switchover, postmaster kill, node loss, node
freeze) and the recovery after each, and :func:`run_once`, which puts them together and says
what the writer and the watch saw."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import select
import signal
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench.dataplane import longest_gap, lost_rows, parse_rows, wait_until
from bench.patroni_model import (
    CONNECT_TIMEOUT,
    MEMBERS,
    NEW_PRIMARY_TIMEOUT,
    POLL,
    STATEMENT_TIMEOUT,
    WRITE_INTERVAL,
    Round,
    new_primary,
    primaries,
    view_leaders,
)
from bench.patroni_processes import Lab, Member, postmaster_pid, signal_all

# --- the writer -----------------------------------------------------------------------------


def timed(psycopg: Any, conn: Any, sql: str, timeout: float) -> Any | None:
    """The last result of ``sql`` on ``conn`` (libpq's own calls, under a deadline), or None
    when it failed or was not answered in time."""
    pgconn = conn.pgconn
    try:
        pgconn.send_query(sql.encode())
        deadline = time.monotonic() + timeout
        pgconn.consume_input()
        while pgconn.is_busy():
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            select.select([pgconn.socket], [], [], left)
            pgconn.consume_input()
        results = list(iter(pgconn.get_result, None))
    except (OSError, psycopg.Error):
        return None
    ok = (psycopg.pq.ExecStatus.COMMAND_OK, psycopg.pq.ExecStatus.TUPLES_OK)
    return results[-1] if results and all(r.status in ok for r in results) else None


class Writer:
    """Inserts numbered rows into ``table``, one autocommit statement each, through whichever
    member accepts writes, and notes each acknowledged number with its monotonic time."""

    def __init__(self, psycopg: Any, dsn: str, table: str) -> None:
        self.psycopg, self.dsn, self.table = psycopg, dsn, table
        self.acknowledged: list[tuple[int, float]] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="writer", daemon=True)

    def connect(self) -> Any | None:
        try:
            return self.psycopg.connect(self.dsn, autocommit=True)
        except self.psycopg.Error:
            return None

    def _loop(self) -> None:
        conn = None
        for n in itertools.count(1):
            if self._stop.is_set():
                break
            if conn is None:
                conn = self.connect()
            statement = f"insert into {self.table} values ({n:d})"  # noqa: S608 - our own
            if conn is not None and timed(self.psycopg, conn, statement, STATEMENT_TIMEOUT):
                self.acknowledged.append((n, time.monotonic()))
                self._stop.wait(WRITE_INTERVAL)
                continue
            self.failures += 1
            if conn is not None:
                conn.close()
                conn = None
            self._stop.wait(WRITE_INTERVAL)
        if conn is not None:
            conn.close()

    def stamps(self) -> list[float]:
        return [t for _, t in self.acknowledged]

    def wait_acks_after(self, since: float, count: int, timeout: float = 60) -> None:
        wait_until(
            lambda: sum(1 for t in self.stamps() if t > since) >= count,
            what=f"{count} acknowledged inserts",
            timeout=timeout,
        )

    def __enter__(self) -> Writer:
        conn = self.connect()
        create = f"create table if not exists {self.table} (n int primary key)"
        if conn is None or timed(self.psycopg, conn, create, 30) is None:
            raise RuntimeError(f"could not create the table {self.table}")
        conn.close()
        self._thread.start()
        self.wait_acks_after(0.0, 10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def writer_dsn(lab: Lab, members: Iterable[Member] | None = None, *, any_role: bool = False) -> str:
    chosen = list(members if members is not None else lab.members.values())
    hosts = ",".join("127.0.0.1" for _ in chosen)
    ports = ",".join(str(m.pg_port) for m in chosen)
    attrs = "" if any_role else " target_session_attrs=read-write"
    return (
        f"host={hosts} port={ports} dbname=postgres user=postgres password={lab.password}"
        f" connect_timeout={CONNECT_TIMEOUT} application_name=bench-writer{attrs}"
    )


def rows_on(lab: Lab, psycopg: Any, member: Member, table: str) -> set[int]:
    """The row numbers in ``table`` on ``member`` itself."""
    query = f"select coalesce(string_agg(n::text, ','), '') from {table}"  # noqa: S608
    with contextlib.closing(psycopg.connect(writer_dsn(lab, [member], any_role=True))) as conn:
        result = timed(psycopg, conn, query, 60)
    if result is None:
        raise RuntimeError(f"could not read {table} on {member.name}")
    return parse_rows((result.get_value(0, 0) or b"").decode())


# --- the watch ------------------------------------------------------------------------------


class Watch:
    """Polls every member's ``GET /patroni`` and ``GET /cluster`` every POLL seconds, all at
    once, into ``rounds``; members in ``silenced`` (frozen ones) are not asked."""

    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        self.rounds: list[Round] = []
        self.silenced: set[str] = set()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=2 * len(MEMBERS), thread_name_prefix="watch")
        self._thread = threading.Thread(target=self._loop, name="watch", daemon=True)

    def _round(self) -> Round:
        t = time.monotonic()
        asked = [m for m in self.lab.members.values() if m.name not in self.silenced]
        own = {m.name: self._pool.submit(self.lab.get, m, "/patroni") for m in asked}
        views = {m.name: self._pool.submit(self.lab.view, m) for m in asked}
        return Round(
            t,
            {n: f.result() for n, f in own.items()},
            {n: f.result() for n, f in views.items()},
        )

    def _loop(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            self.rounds.append(self._round())
            self._stop.wait(max(0.0, POLL - (time.monotonic() - began)))

    def wait_new_primary(self, old: str, old_start: str | None, since: float) -> tuple[float, str]:
        return wait_until(
            lambda: new_primary(list(self.rounds), old, old_start, since),
            what=f"a primary other than {old}'s postmaster of {old_start}",
            timeout=NEW_PRIMARY_TIMEOUT,
            interval=0.05,
        )

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self._pool.shutdown(wait=True)


# --- faults ---------------------------------------------------------------------------------


@dataclasses.dataclass
class Fault:
    """What one fault did to the cluster, for the run that follows it."""

    lab: Lab
    watch: Watch
    old: Member
    sync: Member
    detail: dict[str, Any] = dataclasses.field(default_factory=dict)
    stopped: list[int] = dataclasses.field(default_factory=list)


def switchover(fault: Fault) -> None:
    body = {"leader": fault.old.name, "candidate": fault.sync.name}
    response = fault.lab.http.post(f"{fault.old.api}/switchover", json=body, timeout=90)
    fault.detail["response"] = f"{response.status_code} {response.text.strip()}"
    if response.status_code != 200:
        raise RuntimeError(f"switchover refused: {fault.detail['response']}")


def postgres_kill(fault: Fault) -> None:
    postmaster = postmaster_pid(fault.old.data_dir)
    if postmaster is None:
        raise RuntimeError(f"no postmaster running for {fault.old.name}")
    os.kill(postmaster, signal.SIGKILL)
    fault.detail["postmaster"] = postmaster


def node_loss(fault: Fault) -> None:
    pids = fault.old.pids()
    signal_all(pids, signal.SIGSTOP)  # nothing of the member acts between the two kills
    fault.detail["killed"] = signal_all(pids, signal.SIGKILL)


def node_freeze(fault: Fault) -> None:
    fault.watch.silenced.add(fault.old.name)
    fault.stopped = signal_all(fault.old.pids(), signal.SIGSTOP)
    fault.detail["stopped"] = fault.stopped


def recover(fault: Fault, kind: str) -> None:
    """After the new primary: bring the old one back (a restart, or SIGCONT)."""
    if kind == "node-loss":
        if fault.old.process is not None:
            fault.old.process.wait(timeout=30)
        fault.lab.start(fault.old)
    elif kind == "node-freeze":
        fault.detail["frozen_s"] = round(time.monotonic() - fault.detail["at"], 2)
        signal_all(fault.stopped, signal.SIGCONT)
        fault.watch.silenced.discard(fault.old.name)


ACTIONS: dict[str, Callable[[Fault], None]] = {
    "switchover": switchover,
    "postgres-kill": postgres_kill,
    "node-loss": node_loss,
    "node-freeze": node_freeze,
}


def log_size(member: Member) -> int:
    with contextlib.suppress(OSError):
        return member.log.stat().st_size
    return 0


def rewound(member: Member, offset: int) -> bool:
    """Whether ``member``'s Patroni ran pg_rewind since its log was ``offset`` bytes long."""
    with contextlib.suppress(OSError), member.log.open("rb") as log:
        log.seek(offset)
        return b"pg_rewind" in log.read()
    return False


def pauses(stamps: Sequence[float], start: float, longer_than: float = 0.5) -> list[list[float]]:
    """[seconds after ``start`` the pause began, its length] of each gap between consecutive
    ``stamps`` longer than ``longer_than`` that ends after ``start``."""
    return [
        [round(a - start, 2), round(b - a, 2)]
        for a, b in itertools.pairwise(stamps)
        if b >= start and b - a > longer_than
    ]


def outcome(writer: Writer, start: float, end: float, present: set[int]) -> dict[str, Any]:
    """What the writer saw between the fault (``start``) and the cluster healthy again."""
    lost = lost_rows((n for n, _ in writer.acknowledged), present)
    steady = [b - a for a, b in itertools.pairwise(writer.stamps()) if b < start]
    return {
        "downtime_s": round(longest_gap(writer.stamps(), start, end), 3),
        "pauses": pauses(writer.stamps(), start),
        "acknowledged": len(writer.acknowledged),
        "lost": len(lost),
        "lost_sample": lost[:20],
        "failed_attempts": writer.failures,
        "insert_gap_before_s": round(sorted(steady)[len(steady) // 2], 4) if steady else None,
    }


def watched(rounds: Sequence[Round], since: float) -> dict[str, Any]:
    during = [r for r in rounds if r.t >= since]
    twice = [r for r in during if len(primaries(r)) > 1]
    gaps = [b.t - a.t for a, b in itertools.pairwise(during)]
    return {
        "two_primaries": bool(twice),
        "two_primaries_rounds": [
            {"at_s": round(r.t - since, 2), "primaries": primaries(r)} for r in twice
        ],
        "views_disagree_rounds": sum(len(view_leaders(r)) > 1 for r in during),
        "poll_rounds": len(during),
        "poll_gap_max_s": round(max(gaps, default=0.0), 2),
    }


def run_once(lab: Lab, psycopg: Any, kind: str, run: int) -> dict[str, Any]:
    view = lab.wait_healthy()
    assert view.leader is not None
    old, sync = lab.members[view.leader], lab.members[view.sync[0]]
    old_start = (lab.get(old, "/patroni") or {}).get("postmaster_start_time")
    offset = log_size(old)
    table = f"{kind.replace('-', '_')}_{run}"
    with Writer(psycopg, writer_dsn(lab), table) as writer, Watch(lab) as watch:
        fault = Fault(lab, watch, old, sync)
        at = fault.detail["at"] = time.monotonic()
        ACTIONS[kind](fault)
        moved_at, new = watch.wait_new_primary(old.name, old_start, at)
        recover(fault, kind)
        writer.wait_acks_after(moved_at, 20)
        final = lab.wait_healthy()
        healthy_at = time.monotonic()
    assert final.leader is not None
    present = rows_on(lab, psycopg, lab.members[final.leader], table)
    result = outcome(writer, at, healthy_at, present)
    result |= watched(watch.rounds, at)
    fault.detail.pop("at")
    return result | {
        "run": run,
        "from": old.name,
        "sync": sync.name,
        "to": new,
        "same_member": new == old.name,
        "final_leader": final.leader,
        "new_primary_s": round(moved_at - at, 2),
        "healthy_again_s": round(healthy_at - at, 2),
        "old_rewound": rewound(old, offset),
        "detail": fault.detail,
    }
