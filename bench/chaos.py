"""``make chaos``: a soak of random faults against one cluster with a writer running.

A fresh local cluster with three real nodes, the operator, and one 3-instance
PostgresCluster (``--engine postgres``, the default) or 3-server MariaDB Database
(``--engine mariadb``); then ``--faults`` faults (default 50) drawn at random from that
engine's fault matrix (``lab.faults.FAULTS``, ``lab.database_faults.
FAULTS``: the same the e2e tests run). After each one the cluster must be healthy again,
every acknowledged write must be on every member, and no server may have acknowledged a
write after another took over. A summary table is printed; the exit status is 1 on any
violation, 2 when the cluster could not be set up.

Not part of ``make test``: 50 faults take about an hour on two cores.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
import traceback
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from lab import database_faults, faults

from bench.common import say
from bench.dataplane import local_cluster
from stateward_local.cluster import LocalCluster


@dataclass(frozen=True)
class Matrix:
    """One engine's fault matrix and how to set up, break and judge its cluster."""

    faults: Mapping[str, Any]
    lab_on: Callable[[LocalCluster], AbstractContextManager[Any]]
    run_fault: Callable[[Any, Any], Any]
    healthy: Callable[..., Any]


MATRICES = {
    "postgres": Matrix(
        faults.FAULTS, lambda real: faults.lab_on(real, "chaos"), faults.run_fault, faults.healthy
    ),
    "mariadb": Matrix(
        database_faults.FAULTS,
        lambda real: database_faults.lab_on(real, "chaos-operator"),
        database_faults.run_fault,
        database_faults.healthy,
    ),
}


@dataclass
class Tally:
    """What happened to one kind of fault over the soak."""

    runs: int = 0
    failovers: int = 0
    downtimes: list[float] = field(default_factory=list)
    promoted: list[float] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)


def record(tallies: dict[str, Tally], outcome: faults.Outcome | database_faults.Outcome) -> None:
    tally = tallies[outcome.fault]
    tally.runs += 1
    tally.failovers += outcome.primary != outcome.old
    tally.downtimes.append(outcome.downtime)
    if outcome.promoted_after is not None:
        tally.promoted.append(outcome.promoted_after)


def summary(tallies: dict[str, Tally]) -> list[str]:
    """The table printed at the end: one row per fault kind, then the total."""
    rows = [
        "| fault | runs | failovers | write downtime median / worst | violations |",
        "| --- | ---: | ---: | --- | ---: |",
    ]
    for name in sorted(tallies):
        t = tallies[name]
        downtime = (
            f"{statistics.median(t.downtimes):.1f} s / {max(t.downtimes):.1f} s"
            if t.downtimes
            else "-"
        )
        rows.append(f"| {name} | {t.runs} | {t.failovers} | {downtime} | {len(t.violations)} |")
    total = sum(len(t.violations) for t in tallies.values())
    runs = sum(t.runs for t in tallies.values())
    rows.append(f"| **all** | {runs} | {sum(t.failovers for t in tallies.values())} | | {total} |")
    return rows


def plan(count: int, seed: int, names: Sequence[str]) -> list[str]:
    """``count`` faults drawn from ``names``, reproducibly for a seed."""
    chooser = random.Random(seed)
    return [chooser.choice(list(names)) for _ in range(count)]


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="make chaos", description=__doc__.splitlines()[0])
    parser.add_argument("--faults", type=int, default=50, help="how many faults (default 50)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: time)")
    parser.add_argument(
        "--engine", choices=sorted(MATRICES), default="postgres",
        help="a PostgresCluster (default) or a MariaDB Database",
    )  # fmt: skip
    every = sorted({name for matrix in MATRICES.values() for name in matrix.faults})
    parser.add_argument(
        "--only", action="append", choices=every, help="draw only these faults (of the engine)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the cluster's state and logs")
    return parser.parse_args(argv)


def soak(lab: Any, schedule: list[str], matrix: Matrix) -> dict[str, Tally]:
    tallies: dict[str, Tally] = defaultdict(Tally)
    for index, name in enumerate(schedule, start=1):
        say(f"==> fault {index}/{len(schedule)}: {name}")
        started = time.monotonic()
        try:
            outcome = matrix.run_fault(lab, matrix.faults[name])
        except AssertionError as error:
            tallies[name].runs += 1
            tallies[name].violations.append(str(error))
            say(f"    VIOLATION: {error}")
            # The next fault needs a healthy cluster; if it never comes back, stop here.
            try:
                matrix.healthy(lab, timeout=600)
            except AssertionError:
                say("    the cluster did not recover: stopping the soak")
                break
            continue
        record(tallies, outcome)
        say(
            f"    ok in {time.monotonic() - started:.0f} s: primary {outcome.old} →"
            f" {outcome.primary}, write downtime {outcome.downtime:.2f} s"
        )
    return tallies


def run(
    schedule: list[str], *, keep: bool, engine: str = "postgres"
) -> tuple[dict[str, Tally] | None, int]:
    """The faults of ``schedule`` against a fresh cluster of ``engine``: the tallies and the
    exit status (0, 1 on any violation), or None and 2 when the cluster could not be set up."""
    failures: list[str] = []
    matrix = MATRICES[engine]
    try:
        with local_cluster(keep, failures) as cluster, matrix.lab_on(cluster) as lab:
            tallies = soak(lab, schedule, matrix)
    except Exception:
        traceback.print_exc()
        say(f"chaos: the cluster could not be set up or run ({'; '.join(failures)})")
        return None, 2
    violations = [v for t in tallies.values() for v in t.violations]
    for violation in violations:
        print(f"violation: {violation}")
    return tallies, 1 if violations else 0


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    seed = args.seed if args.seed is not None else int(time.time())
    matrix = MATRICES[args.engine]
    foreign = sorted(set(args.only or ()) - set(matrix.faults))
    if foreign:
        say(f"chaos: {', '.join(foreign)} is not a fault of {args.engine}: --only takes"
            f" {', '.join(sorted(matrix.faults))}")  # fmt: skip
        return 2
    schedule = plan(args.faults, seed, args.only or sorted(matrix.faults))
    say(
        f"==> chaos: {args.faults} faults on {args.engine}, seed {seed}"
        f" (--seed {seed} repeats this schedule)"
    )
    tallies, code = run(schedule, keep=args.keep, engine=args.engine)
    if tallies is not None:
        print("\n".join(summary(tallies)))
    return code


if __name__ == "__main__":
    sys.exit(main())
