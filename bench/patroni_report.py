"""The report of the bare-Patroni lab (:mod:`bench.patroni_lab`): the markdown table with
one row per fault, the text of a session's results, and the section of docs/benchmarks.md
they go into (its introduction and method, written the first time, and the block between
``<!-- patroni-lab:begin -->`` and ``<!-- patroni-lab:end -->``, rewritten each time)."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Sequence
from typing import Any

from bench.common import DOC, write_block
from bench.patroni_model import (
    FAULTS,
    POLL,
    REQUIREMENTS,
    REST_TIMEOUT,
    STATEMENT_TIMEOUT,
    WRITE_INTERVAL,
    summarize,
)

BEGIN = "<!-- patroni-lab:begin -->"
END = "<!-- patroni-lab:end -->"
SECTION = "## Bare Patroni reference"


def _pair(values: Sequence[float], digits: int = 1) -> str:
    middle, top = values
    return f"{middle:.{digits}f} / {top:.{digits}f} s"


def rows(result: dict[str, Any]) -> list[str]:
    """The markdown table of ``result`` (what :func:`bench.patroni_lab.measure` returns, or
    its JSON): a header, its rule and one row per fault measured."""
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
    write_block(DOC, text, METHOD, begin=BEGIN, end=END)
