"""The processes of the bare-Patroni lab (:mod:`bench.patroni_lab`): the cached virtualenv
with the lab's Patroni (and running it, or a copy of it, as the ``postgres`` user), psycopg
from that virtualenv, each :class:`Member`'s Patroni configuration, and the :class:`Lab` of
one etcd and three members on 127.0.0.1: starting them, asking their REST APIs, and stopping
everything it started."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import httpx

from bench.common import alive, children, say
from bench.dataplane import wait_until
from bench.patroni_model import (
    DCS,
    HEALTHY_TIMEOUT,
    MEMBERS,
    PG_BIN,
    REQUIREMENTS,
    REST_TIMEOUT,
    SCOPE,
    ClusterView,
    claims_primary,
    descendants,
    healthy,
    parse_cluster,
)
from stateward_local import binaries
from stateward_local.controlplane.processes import free_port_base

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
