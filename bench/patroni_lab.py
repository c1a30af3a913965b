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

This module is the entry point and one session; the settings and the pure logic are in
:mod:`bench.patroni_model`, the processes (virtualenv, members, etcd) in
:mod:`bench.patroni_processes`, one run (writer, watch, faults) in :mod:`bench.patroni_faults`
and the table and docs/benchmarks.md section in :mod:`bench.patroni_report`.

    .venv/bin/python -m bench.patroni_lab [--runs 5] [--faults switchover,node-loss] [--json PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common import (
    DOC,
    ROOT,
    Interrupted,
    environment,
    machine_busy_seconds,
    output_flags,
    raise_on_sigterm,
    say,
)
from bench.patroni_faults import run_once
from bench.patroni_model import (
    CONNECT_TIMEOUT,
    DCS,
    FAULTS,
    MEMBERS,
    OS_USER,
    PG_BIN,
    POLL,
    REQUIREMENTS,
    REST_TIMEOUT,
    STATEMENT_TIMEOUT,
    WRITE_INTERVAL,
    summarize,
)
from bench.patroni_processes import Lab, ensure_venv, psycopg_from, venv_for
from bench.patroni_report import markdown, write_doc
from stateward_local import binaries

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
    output_flags(parser)
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

    raise_on_sigterm()
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
