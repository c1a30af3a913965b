"""Bare Patroni, no Kubernetes: the reference for the data plane's failover numbers.

Three Patroni members (the Patroni version of the instance image, with the etcd3 DCS instead
of Kubernetes) on a single-member etcd, each with its own PostgreSQL 15 data directory, all on
127.0.0.1 in a temporary directory; Patroni runs as the OS user ``postgres`` when this runs
as root (PostgreSQL refuses root). A writer thread inserts numbered rows, one autocommit
statement each, through whichever member accepts writes (libpq multi-host,
``target_session_attrs=read-write``), and notes when each insert was acknowledged. Each fault
runs ``--runs`` times, each run from a healthy cluster (one leader, one synchronous standby,
every replica streaming, as every member's ``GET /cluster`` and ``GET /patroni`` say):

* ``switchover``: ``POST /switchover`` on the leader, to the synchronous standby;
* ``postgres-kill``: SIGKILL of the primary's postmaster (Patroni restarts it or fails over);
* ``node-loss``: SIGKILL of the primary's Patroni and PostgreSQL processes together (the
  leader lock is never released: the ttl bounds it); that member's Patroni is then started
  again and rejoins (pg_rewind) before the next run;
* ``node-freeze``: SIGSTOP of the same processes until another member is primary, then
  SIGCONT, and the old primary must rejoin as a replica.

Measured per run: the write downtime (longest gap between acknowledged inserts that overlaps
[fault, healthy again]), the time from the fault until ``GET /cluster`` names another leader
(or, for a postmaster restarted in place, until that member's own ``GET /patroni`` reports a
running primary with a new postmaster), acknowledged rows missing on the final leader, and
whether two members ever reported themselves running primaries in the same poll round (every
member's REST API polled every 0.2 s from the fault until the cluster is healthy again).

Installs its own Patroni into a virtualenv cached outside the repository
(``~/.cache/stateward/bench/patroni-venv``) and uses the etcd of the local cluster's binary
cache (``make binaries``). Prints a table and writes it into docs/benchmarks.md between
``<!-- patroni-lab:begin -->`` and ``<!-- patroni-lab:end -->``; the rest of that file is left
alone.

    .venv/bin/python -m bench.patroni_lab [--runs 5] [--faults switchover,node-loss] [--json PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import itertools
import json
import os
import pwd
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from bench.dataplane import longest_gap, lost_rows, median_max, parse_rows, wait_until
from bench.nodes import Interrupted, children, environment, say
from bench.run import machine_busy_seconds
from stateward.api.validation import OPERATOR_PARAMETERS
from stateward_local import binaries
from stateward_local.controlplane.processes import free_port_base
from stateward_local.images import catalog

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "benchmarks.md"
BEGIN = "<!-- patroni-lab:begin -->"
END = "<!-- patroni-lab:end -->"
SECTION = "## Bare Patroni reference"

FAULTS = ("switchover", "postgres-kill", "node-loss", "node-freeze")
MEMBERS = ("m1", "m2", "m3")
SCOPE = "lab"
OS_USER = "postgres"
PG_BIN = Path("/usr/lib/postgresql/15/bin")
PRIMARY_ROLES = frozenset({"primary", "master"})
POLL = 0.2
REST_TIMEOUT = 0.5
WRITE_INTERVAL = 0.01
"""Pause between two inserts, so the writer does not take a core of the two."""
STATEMENT_TIMEOUT = 3.0
"""An insert not acknowledged by then is abandoned (the connection closed, a new one made):
an insert sent to a frozen primary would otherwise wait forever."""
CONNECT_TIMEOUT = 2
HEALTHY_TIMEOUT = 240.0
NEW_PRIMARY_TIMEOUT = 120.0

DCS: dict[str, Any] = {
    "ttl": 20,
    "loop_wait": 1,
    "retry_timeout": 5,
    "primary_start_timeout": 10,
    "synchronous_mode": True,
    "synchronous_mode_strict": False,
    "synchronous_node_count": 1,
    "postgresql": {
        "use_pg_rewind": True,
        "use_slots": True,
        # The parameters of our instances, but for the socket directory (one per member).
        "parameters": {k: v for k, v in OPERATOR_PARAMETERS.items() if "socket" not in k},
    },
}
"""Patroni's cluster-wide configuration (``bootstrap.dcs``), as recorded in the results."""


# --- pure helpers ---------------------------------------------------------------------------


def lab_requirements(image_requirements: Sequence[str]) -> list[str]:
    """The instance image's Patroni pins with the etcd3 DCS instead of Kubernetes."""
    return [r.replace("[kubernetes,", "[etcd3,") for r in image_requirements]


REQUIREMENTS = lab_requirements(catalog.PATRONI_REQUIREMENTS)


@dataclasses.dataclass(frozen=True)
class ClusterView:
    """One member's ``GET /cluster``: the leader, the synchronous standbys, every member's
    role and state."""

    leader: str | None
    sync: tuple[str, ...]
    members: dict[str, tuple[str, str]]

    def state(self, name: str) -> str | None:
        return self.members.get(name, ("", None))[1]


def parse_cluster(body: dict[str, Any]) -> ClusterView:
    members = {
        str(m["name"]): (str(m.get("role", "")), str(m.get("state", "")))
        for m in body.get("members") or []
    }
    leaders = [n for n, (role, _) in members.items() if role in ("leader", "standby_leader")]
    sync = tuple(sorted(n for n, (role, _) in members.items() if role == "sync_standby"))
    return ClusterView(leaders[0] if leaders else None, sync, members)


def healthy(view: ClusterView | None, names: Iterable[str]) -> bool:
    """Every member listed, the leader running, exactly one synchronous standby, and every
    other member streaming from the leader."""
    if view is None or view.leader is None or sorted(view.members) != sorted(names):
        return False
    others = [n for n in view.members if n != view.leader]
    return (
        view.state(view.leader) == "running"
        and len(view.sync) == 1
        and all(view.state(n) == "streaming" for n in others)
    )


@dataclasses.dataclass(frozen=True)
class Round:
    """One poll of every member: its own ``GET /patroni`` and its ``GET /cluster`` (None when
    it did not answer in time, or was not asked: a frozen member)."""

    t: float
    own: dict[str, dict[str, Any] | None]
    views: dict[str, ClusterView | None]


def claims_primary(own: dict[str, Any] | None) -> bool:
    return own is not None and own.get("role") in PRIMARY_ROLES and own.get("state") == "running"


def primaries(round_: Round) -> list[str]:
    """The members that report themselves a running primary in this round."""
    return sorted(n for n, own in round_.own.items() if claims_primary(own))


def view_leaders(round_: Round) -> set[str]:
    """The leaders named by the members' ``GET /cluster`` in this round (each from that
    member's cached view of the DCS: they may disagree for a moment)."""
    return {v.leader for v in round_.views.values() if v is not None and v.leader is not None}


def new_primary(
    rounds: Sequence[Round], old: str, old_start: str | None, since: float
) -> tuple[float, str] | None:
    """When, and which, the first round at or after ``since`` showed a primary other than
    ``old``'s pre-fault postmaster: a ``GET /cluster`` naming another, running leader; or
    ``old`` itself reporting a running primary whose postmaster started anew."""
    for r in rounds:
        if r.t < since:
            continue
        for view in r.views.values():
            if view and view.leader and view.leader != old and view.state(view.leader) == "running":
                return r.t, view.leader
        own = r.own.get(old) or {}
        if claims_primary(own) and own.get("postmaster_start_time") != old_start:
            return r.t, old
    return None


def descendants(pid: int, children_of: Callable[[int], Iterable[int]]) -> list[int]:
    """``pid`` and every process below it, parents first."""
    found, queue = [], [pid]
    while queue:
        current = queue.pop(0)
        if current not in found:
            found.append(current)
            queue.extend(children_of(current))
    return found


def summarize(entries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One fault's runs in a few numbers."""
    return {
        "runs": len(entries),
        "downtime_s": median_max([e["downtime_s"] for e in entries]),
        "new_primary_s": median_max([e["new_primary_s"] for e in entries]),
        "lost": sum(e["lost"] for e in entries),
        "acknowledged": sum(e["acknowledged"] for e in entries),
        "two_primaries_runs": sum(bool(e["two_primaries"]) for e in entries),
        "same_member_runs": sum(bool(e["same_member"]) for e in entries),
    }


def _pair(values: Sequence[float], digits: int = 1) -> str:
    middle, top = values
    return f"{middle:.{digits}f} / {top:.{digits}f} s"


def rows(result: dict[str, Any]) -> list[str]:
    """The markdown table of ``result`` (what :func:`measure` returns, or its JSON): a header,
    its rule and one row per fault measured."""
    lines = [
        "| fault | runs | write downtime median / worst | time to new primary median / worst"
        " | acked writes lost | two primaries seen |",
        "|---|---|---|---|---|---|",
    ]
    for fault in FAULTS:
        entries = result["faults"].get(fault)
        if not entries:
            continue
        s = summarize(entries)
        moved = _pair(s["new_primary_s"])
        if s["same_member_runs"]:
            moved += f" (restarted in place {s['same_member_runs']} of {s['runs']})"
        twice = f"**yes, {s['two_primaries_runs']} of {s['runs']} runs**"
        lines.append(
            f"| {fault} | {s['runs']} | {_pair(s['downtime_s'], 2)} | {moved}"
            f" | **{s['lost']}** of {s['acknowledged']}"
            f" | {twice if s['two_primaries_runs'] else 'no'} |"
        )
    return lines


def replace_block(
    current: str, block: str, method: str, *, begin: str = BEGIN, end: str = END
) -> str:
    """``current`` with the text between ``begin`` and ``end`` replaced by ``block`` (or,
    without the markers, the method and the block appended)."""
    marked = f"{begin}\n{block}{end}\n"
    if begin in current and end in current:
        head, _, rest = current.partition(begin)
        _, _, tail = rest.partition(end)
        return head + marked + tail.removeprefix("\n")
    return current.rstrip() + "\n\n" + method + "\n" + marked


# --- the Patroni virtualenv -----------------------------------------------------------------


def venv_dir() -> Path:
    return binaries.cache_dir() / "bench" / "patroni-venv"


def _as_user(user: str | None) -> dict[str, Any]:
    """Popen arguments that run a child as ``user`` (nothing when None: as ourselves)."""
    return {} if user is None else {"user": user, "group": user, "extra_groups": []}


def runs_as(user: str | None, argv: Sequence[str], cwd: Path) -> bool:
    """Whether ``argv`` exits 0 when run as ``user`` in ``cwd``."""
    try:
        done = subprocess.run(
            argv, cwd=cwd, capture_output=True, timeout=60, check=False, **_as_user(user)
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def interpreter(user: str | None) -> str:
    """A Python that ``user`` can run: ours unless it lives where ``user`` cannot reach (a
    pyenv under /root), else the system's."""
    ours = str(getattr(sys, "_base_executable", sys.executable))
    candidates = [ours, shutil.which("python3", path="/usr/bin:/bin") or ""]
    for candidate in filter(None, candidates):
        if runs_as(user, [candidate, "-c", "import venv"], Path("/")):
            return candidate
    raise RuntimeError(f"no Python interpreter that the user {user} can run: {candidates}")


def ensure_venv(user: str | None) -> Path:
    """The cached virtualenv with Patroni, built once (its stamp names what is in it)."""
    target = venv_dir()
    stamp = target / "stateward-requirements.json"
    with contextlib.suppress(OSError, ValueError):
        if json.loads(stamp.read_text())["requirements"] == REQUIREMENTS:
            return target
    python = interpreter(user)
    say(f"==> installing {' '.join(REQUIREMENTS)} into {target} (once; a minute or two)")
    shutil.rmtree(target, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([python, "-m", "venv", str(target)], check=True, timeout=300)
    pip = [str(target / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    subprocess.run([*pip, "install", "--quiet", *REQUIREMENTS], check=True, timeout=900)
    stamp.write_text(json.dumps({"requirements": REQUIREMENTS, "python": python}) + "\n")
    say("    installed")
    return target


def venv_for(user: str | None, venv: Path, scratch: Path) -> Path:
    """``venv`` if ``user`` can run Patroni from it, else a copy in ``scratch`` (the cache
    below a 0700 home is out of the ``postgres`` user's reach)."""
    python = venv / "bin" / "python"
    if runs_as(user, [str(python), "-c", "import patroni"], scratch):
        return venv
    copy = scratch / "patroni-venv"
    shutil.copytree(venv, copy, symlinks=True)
    if user is not None:
        owner = pwd.getpwnam(user)
        for path in [copy, *copy.rglob("*")]:
            os.chown(path, owner.pw_uid, owner.pw_gid, follow_symlinks=False)
    if not runs_as(user, [str(copy / "bin" / "python"), "-c", "import patroni"], scratch):
        raise RuntimeError(f"the user {user} cannot run Patroni from {venv} nor from {copy}")
    return copy


def psycopg_from(venv: Path) -> Any:
    """psycopg, imported from the Patroni virtualenv (the project's own has none)."""
    for site in sorted((venv / "lib").glob("python3*/site-packages")):
        if str(site) not in sys.path:
            sys.path.append(str(site))
    return importlib.import_module("psycopg")


# --- processes ------------------------------------------------------------------------------


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :].split()[0] != "Z"


def postmaster_pid(data_dir: Path) -> int | None:
    """The live postmaster of ``data_dir`` (first line of postmaster.pid), or None."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        pid = int((data_dir / "postmaster.pid").read_text().splitlines()[0])
        return pid if alive(pid) else None
    return None


def signal_all(pids: Iterable[int], signum: signal.Signals) -> list[int]:
    """Send ``signum`` to each of ``pids`` still there; the pids it reached."""
    reached = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
            reached.append(pid)
    return reached


@dataclasses.dataclass
class Member:
    name: str
    pg_port: int
    api_port: int
    home: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def data_dir(self) -> Path:
        return self.home / "data"

    @property
    def config(self) -> Path:
        return self.home / "patroni.yml"

    @property
    def log(self) -> Path:
        return self.home.parent / "logs" / f"{self.name}.log"

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def pids(self) -> list[int]:
        """Patroni and everything below it, and the postmaster and its children (Patroni
        starts the postmaster detached: it is not Patroni's child)."""
        found = []
        if self.process is not None and self.process.poll() is None:
            found += descendants(self.process.pid, children)
        postmaster = postmaster_pid(self.data_dir)
        if postmaster is not None:
            found += [p for p in descendants(postmaster, children) if p not in found]
        return found


def patroni_config(member: Member, etcd_port: int, password: str) -> dict[str, Any]:
    address = f"127.0.0.1:{member.pg_port}"
    return {
        "scope": SCOPE,
        "name": member.name,
        "restapi": {"listen": f"127.0.0.1:{member.api_port}"}
        | {"connect_address": f"127.0.0.1:{member.api_port}"},
        "etcd3": {"hosts": f"127.0.0.1:{etcd_port}"},
        "bootstrap": {"dcs": DCS, "initdb": [{"encoding": "UTF8"}, "data-checksums"]},
        "postgresql": {
            "listen": address,
            "connect_address": address,
            "data_dir": str(member.data_dir),
            "bin_dir": str(PG_BIN),
            "pgpass": str(member.home / "pgpass"),
            "use_unix_socket": True,
            "parameters": {"unix_socket_directories": str(member.home)},
            "authentication": {
                "superuser": {"username": "postgres", "password": password},
                "replication": {"username": "replicator", "password": password},
            },
            "pg_hba": [
                "local all all trust",
                "host replication replicator 127.0.0.1/32 scram-sha-256",
                "host all all 127.0.0.1/32 scram-sha-256",
            ],
            "basebackup": [{"checkpoint": "fast"}],
        },
        "watchdog": {"mode": "off"},
    }


class Lab:
    """etcd and three Patroni members in ``root``, on ports from ``base``; ``stop()`` ends
    every process it started (frozen ones are continued first)."""

    def __init__(self, root: Path, python: Path, etcd: Path, user: str | None) -> None:
        self.root, self.python, self.etcd_binary, self.user = root, python, etcd, user
        base = free_port_base(count=2 + 2 * len(MEMBERS))
        self.etcd_port, self.peer_port = base, base + 1
        self.password = secrets.token_hex(16)
        self.members = {
            name: Member(name, base + 2 + i, base + 2 + len(MEMBERS) + i, root / name)
            for i, name in enumerate(MEMBERS)
        }
        self.etcd: subprocess.Popen[bytes] | None = None
        self.http = httpx.Client(timeout=REST_TIMEOUT)
        (root / "logs").mkdir()

    def _own(self, path: Path) -> None:
        if self.user is not None:
            owner = pwd.getpwnam(self.user)
            os.chown(path, owner.pw_uid, owner.pw_gid)

    def start_etcd(self) -> None:
        peer = f"http://127.0.0.1:{self.peer_port}"
        client = f"http://127.0.0.1:{self.etcd_port}"
        argv = [
            str(self.etcd_binary), "--name=lab", f"--data-dir={self.root / 'etcd'}",
            f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=lab={peer}", "--initial-cluster-state=new", "--log-level=warn",
        ]  # fmt: skip
        with (self.root / "logs" / "etcd.log").open("ab") as log:
            self.etcd = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip

        def up() -> bool:
            if self.etcd is not None and self.etcd.poll() is not None:
                raise RuntimeError(f"etcd exited; see {self.root / 'logs' / 'etcd.log'}")
            with contextlib.suppress(httpx.HTTPError, ValueError):
                return bool(self.http.get(f"{client}/health").json().get("health") == "true")
            return False

        wait_until(up, what="etcd to be healthy", timeout=60)

    def start(self, member: Member) -> None:
        """Start (or start again) ``member``'s Patroni."""
        if not member.home.exists():
            member.home.mkdir(mode=0o700)
            self._own(member.home)
            member.config.write_text(
                json.dumps(patroni_config(member, self.etcd_port, self.password), indent=2)
            )  # JSON is YAML
            self._own(member.config)
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(member.home),
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
        }
        with member.log.open("ab") as log:
            member.process = subprocess.Popen(
                [str(self.python), "-m", "patroni", str(member.config)],
                cwd=member.home, env=env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, umask=0o077,
                **_as_user(self.user),
            )  # fmt: skip

    def get(self, member: Member, path: str) -> dict[str, Any] | None:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            response = self.http.get(member.api + path)
            body: dict[str, Any] = response.json()
            return body
        return None

    def view(self, member: Member) -> ClusterView | None:
        body = self.get(member, "/cluster")
        return parse_cluster(body) if body is not None else None

    def healthy(self) -> ClusterView | None:
        """The shared view when every member agrees the cluster is healthy (and each one's
        PostgreSQL runs in the role the view gives it), else None."""
        views = [self.view(m) for m in self.members.values()]
        first = views[0]
        if first is None or not all(healthy(v, MEMBERS) and v == first for v in views):
            return None
        for member in self.members.values():
            own = self.get(member, "/patroni")
            if own is None or claims_primary(own) != (member.name == first.leader):
                return None
        return first

    def wait_healthy(self, timeout: float = HEALTHY_TIMEOUT) -> ClusterView:
        def check() -> ClusterView | None:
            for member in self.members.values():
                if member.process is not None and member.process.poll() is not None:
                    raise RuntimeError(f"Patroni {member.name} exited; see {member.log}")
            return self.healthy()

        return wait_until(check, what="a healthy cluster", timeout=timeout, interval=0.5)

    def stop(self) -> None:
        """Patroni first (it stops its PostgreSQL), then whatever is left, then etcd; a
        second Ctrl-C does not cut this short."""
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
        try:
            self._stop()
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)

    def _stop(self) -> None:
        for member in self.members.values():
            signal_all(member.pids(), signal.SIGCONT)
            if member.process is not None and member.process.poll() is None:
                member.process.terminate()
        deadline = time.monotonic() + 30
        for member in self.members.values():
            while member.process is not None and member.process.poll() is None:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            signal_all(member.pids(), signal.SIGKILL)
            if member.process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    member.process.wait(timeout=10)
        if self.etcd is not None and self.etcd.poll() is None:
            self.etcd.terminate()
            try:
                self.etcd.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.etcd.kill()
                self.etcd.wait(timeout=15)
        self.http.close()


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


# --- one session ----------------------------------------------------------------------------


def etcd_binary() -> Path | None:
    """The etcd of the local cluster's binary cache (the path ``binaries.locate().etcd``
    gives once everything is built), or None while it is not built: this needs only etcd."""
    if binaries.missing_files(binaries.ETCD):
        return None
    return binaries.component_dir(binaries.ETCD) / "etcd"


def versions(python: Path, etcd: Path) -> dict[str, str]:
    def first_line(argv: list[str]) -> str:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        return (done.stdout or done.stderr).strip().splitlines()[0] if done.returncode == 0 else "?"

    return {
        "patroni": "Patroni "
        + first_line([str(python), "-c", "import patroni.version as v; print(v.__version__)"]),
        "postgresql": first_line([str(PG_BIN / "postgres"), "--version"]).replace(
            "postgres (PostgreSQL)", "PostgreSQL"
        ),
        "etcd": first_line([str(etcd), "--version"]).replace("Version: ", ""),
    }


@contextlib.contextmanager
def lab_session(etcd: Path, keep: bool) -> Iterator[tuple[Lab, Any, dict[str, Any]]]:
    """A healthy lab in a temporary directory, stopped afterwards; the directory (with the
    logs) is kept when asked to, or when something failed."""
    user = OS_USER if os.geteuid() == 0 else None
    venv = ensure_venv(user)
    root = Path(tempfile.mkdtemp(prefix="stateward-bench-patroni-"))
    if user is not None:
        owner = pwd.getpwnam(user)
        os.chown(root, owner.pw_uid, owner.pw_gid)
    try:
        python = venv_for(user, venv, root) / "bin" / "python"
        lab = Lab(root, python, etcd, user)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    try:
        say(f"==> etcd on 127.0.0.1:{lab.etcd_port}, 3 Patroni members as {user or 'ourselves'}")
        lab.start_etcd()
        for member in lab.members.values():
            lab.start(member)
        began = time.monotonic()
        lab.wait_healthy()
        took = round(time.monotonic() - began, 1)
        say(f"    healthy after {took:.1f}s; state and logs in {root}")
        facts: dict[str, Any] = {**versions(python, etcd), "os_user": user or "self"}
        facts["bootstrap_s"] = took
        yield lab, psycopg_from(venv), facts
    except BaseException:
        keep = True
        raise
    finally:
        say("==> stopping Patroni, PostgreSQL and etcd")
        lab.stop()
        if keep:
            say(f"    state and logs kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def config_used() -> dict[str, Any]:
    return {
        "dcs": DCS,
        "members": len(MEMBERS),
        "pg_bin": str(PG_BIN),
        "poll_interval_s": POLL,
        "rest_timeout_s": REST_TIMEOUT,
        "writer": {
            "pause_between_inserts_s": WRITE_INTERVAL,
            "statement_timeout_s": STATEMENT_TIMEOUT,
            "connect_timeout_s": CONNECT_TIMEOUT,
        },
        "requirements": REQUIREMENTS,
    }


def measure(args: argparse.Namespace, etcd: Path) -> dict[str, Any]:
    began, busy = time.monotonic(), machine_busy_seconds()
    result: dict[str, Any] = {"runs": args.runs, "config": config_used(), "faults": {}}
    with lab_session(etcd, args.keep) as (lab, psycopg, found):
        result["lab"] = found
        for kind in args.faults:
            say(f"==> {kind}, {args.runs} runs")
            entries = result["faults"][kind] = []
            for run in range(1, args.runs + 1):
                entry = run_once(lab, psycopg, kind, run)
                entries.append(entry)
                say(
                    f"    {kind} {run}: {entry['from']} → {entry['to']} after"
                    f" {entry['new_primary_s']:.1f}s, writes down {entry['downtime_s']:.2f}s,"
                    f" lost {entry['lost']} of {entry['acknowledged']}, two primaries"
                    f" {entry['two_primaries']}, healthy after {entry['healthy_again_s']:.1f}s"
                )
    result["summary"] = {kind: summarize(entries) for kind, entries in result["faults"].items()}
    result["took_s"] = round(time.monotonic() - began, 1)
    result["machine_busy_cpus"] = round((machine_busy_seconds() - busy) / result["took_s"], 2)
    return result


# --- report ---------------------------------------------------------------------------------


def markdown(result: dict[str, Any], env: dict[str, str]) -> str:
    dcs, v = result["config"]["dcs"], result["lab"]
    settings = ", ".join(f"{k} {dcs[k]}" for k in dcs if k != "postgresql")
    pg = dcs["postgresql"]
    moves = [
        f"{kind}: " + ", ".join(f"{e['from']} → {e['to']}" for e in entries)
        for kind, entries in result["faults"].items()
    ]
    lines = [
        f"Run {env['date']} on {env['machine']}; {v['patroni']}, {v['postgresql']},"
        f" {v['etcd']}; 3 members on 127.0.0.1 as OS user `{v['os_user']}`; runs:"
        f" {result['runs']} of each; whole run {result['took_s']:.0f} s, during which the"
        f" machine's CPUs were busy {result['machine_busy_cpus']:.2f} of {os.cpu_count()} on"
        " average (this run and any other work).",
        "",
        f"Patroni (`bootstrap.dcs`): {settings}; use_pg_rewind {pg['use_pg_rewind']},"
        f" use_slots {pg['use_slots']}.",
        "",
        *rows(result),
        "",
        "Primary moves: " + "; ".join(moves) + ".",
    ]
    return "\n".join(lines) + "\n"


INTRO = f"""\
{SECTION}

What Patroni itself gives, without Kubernetes or the operator: the reference for the data
plane's failover numbers above. `.venv/bin/python -m bench.patroni_lab` (`make
bench-patroni`; `--runs 5` by default, `--help` for the rest) rewrites the part between the
markers below; the rest of this section is written by hand.
"""
HOW = """\
**Method.** Patroni {patroni} (the instance image's pin, with the etcd3 DCS instead of
Kubernetes; installed into a virtualenv cached under `~/.cache/stateward/bench/`) runs three
members on a single-member etcd (the local cluster's etcd binary), each with its own PostgreSQL
15 data directory (the host's `/usr/lib/postgresql/15/bin`, the same PostgreSQL parameters as
our instances), all on 127.0.0.1, as the OS user `postgres`. A writer thread keeps one libpq
connection (multi-host, `target_session_attrs=read-write`, `connect_timeout=2`) and inserts
numbered rows, one autocommit statement each, {pause:.0f} ms apart; an insert not acknowledged
in {abandon:.0f} s is abandoned and the writer connects again. *Write downtime* is the longest
gap between consecutive acknowledged inserts that overlaps the interval from the fault until
the cluster is healthy again (so a second stall after the new primary, waiting for a
synchronous standby say, would count). *Time to new primary* runs from the fault to the first
poll in which a member's `GET /cluster` names another leader, running (or, for a postmaster
restarted in place, in which that member's own `GET /patroni` reports a running primary with
a new `postmaster_start_time`). *Acked writes lost* are acknowledged numbers missing on the
leader once the cluster is healthy again. *Two primaries seen*: two members' own `GET
/patroni` reported `role: primary, state: running` in the same poll (every member polled at
once every {poll} s, {timeout} s timeout, from the fault until healthy again; a frozen member
is not asked). Every run starts from a healthy cluster: all three `GET /cluster` agree on one
running leader, one synchronous standby and the other member streaming. The faults:
`switchover` is `POST /switchover` to the leader naming the synchronous standby;
`postgres-kill` a SIGKILL of the primary's postmaster; `node-loss` SIGKILL of the primary's
Patroni and all its PostgreSQL processes at once (after which its Patroni is started again and
rejoins); `node-freeze` SIGSTOP of the same processes until another member is primary, then
SIGCONT.
"""
METHOD = (
    INTRO
    + "\n"
    + textwrap.fill(
        " ".join(
            HOW.format(
                patroni=REQUIREMENTS[0].split("==")[1],
                pause=WRITE_INTERVAL * 1000,
                abandon=STATEMENT_TIMEOUT,
                poll=POLL,
                timeout=REST_TIMEOUT,
            ).split()
        ),
        width=93,
        break_long_words=False,
        break_on_hyphens=False,
    )
    + "\n"
)


def write_doc(text: str) -> None:
    current = DOC.read_text() if DOC.exists() else "# Benchmarks\n"
    DOC.write_text(replace_block(current, text, METHOD))


# --- entry point ----------------------------------------------------------------------------


def faults_list(text: str) -> list[str]:
    chosen = [f.strip() for f in text.split(",") if f.strip()]
    unknown = sorted(set(chosen) - set(FAULTS))
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"faults are among {', '.join(FAULTS)}; not {unknown}")
    return chosen


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.patroni_lab", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--runs", type=int, default=5, help="runs of each fault (5)")
    parser.add_argument(
        "--faults", type=faults_list, default=list(FAULTS), help=f"comma-separated, of {FAULTS}"
    )
    parser.add_argument("--keep", action="store_true", help="keep the state and logs")
    parser.add_argument("--no-doc", action="store_true", help="do not write docs/benchmarks.md")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    etcd = etcd_binary()
    if etcd is None:
        say("etcd is not built: `make binaries` builds it into the cache; then run this again")
        return 2
    if not (PG_BIN / "postgres").is_file():
        say(f"PostgreSQL 15 is not installed: no {PG_BIN / 'postgres'}")
        return 2

    def interrupted(signum: int, _frame: Any) -> None:
        raise Interrupted(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupted)
    env = environment()
    say(f"==> bare Patroni benchmark: {env['machine']}")
    try:
        result = measure(args, etcd)
    except (KeyboardInterrupt, Interrupted):
        say("\n==> interrupted; everything started was stopped")
        return 130
    result["environment"] = env
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    text = markdown(result, env)
    say("")
    say(text)
    if not args.no_doc:
        write_doc(text)
        say(f"==> results written to {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
