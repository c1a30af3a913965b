"""``make bench-mariadb``: the MariaDB fault matrix, every fault ``--runs`` times, beside
PostgreSQL's numbers for the same faults.

The same cluster, writer and verdict as ``make chaos --engine mariadb`` and the real-node
tests (a fresh local cluster with three real nodes, the operator as a process, one 3-server
MariaDB 10.11 Database; ``lab.database_faults``), in a fixed round-robin order so
every fault gets the same number of runs. Per fault: write downtime (the longest gap between
acknowledged inserts around the fault; the writer tries every server, as a connector with a
host list does), the time until ``status.lastFailover`` names the new primary, acknowledged
writes lost, and runs in which two servers acknowledged writes — those two count verdict
violations and must be 0. Beside them, PostgreSQL's median write downtime for the same
fault, from the "Failures" table ``make bench-faults`` keeps in docs/benchmarks.md (with the
date it was measured).

The result goes to ``bench/results/mariadb.json`` and, unless ``--no-doc``, between the
markers of the "MariaDB failover" section of docs/benchmarks.md. Needs root and no other
cluster with real nodes on this host.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

from lab.database_faults import FAULTS, POSTGRES_TWIN

from bench import chaos
from bench.common import say, write_block
from bench.faults import SECTION as POSTGRES_SECTION
from bench.faults import median_worst, schedule, summarize

RESULTS = Path("bench/results/mariadb.json")
DOC = Path("docs/benchmarks.md")
SECTION = "## MariaDB failover"
BEGIN = "<!-- mariadb:begin -->"
END = "<!-- mariadb:end -->"
METHOD = f"""\
{SECTION}

What failures cost a MariaDB `Database`: `make bench-mariadb` (`python -m bench.mariadb`,
`--help` for the options) rewrites the part between the markers below.

**Method.** A fresh local cluster with 3 real nodes, the operator as a process on the host,
one 3-server MariaDB 10.11 Database (semi-synchronous replication, AFTER_SYNC, no fallback),
one server per node. Every fault of the MariaDB matrix (`lab/database_faults.py`,
the same the real-node tests and `make chaos --engine mariadb` run), round robin, 5 runs
each by default: a writer inserts numbered rows one at a time into whichever server takes
writes (trying every server's address after an error, as a connector with a host list
does); the fault is injected, then healed; *write downtime* is the longest gap between two
acknowledged inserts, *new primary after* the time from the fault until
`status.lastFailover` names the new primary. A run passes the verdict only if every
acknowledged row is on every server afterwards, no server acknowledged a write after
another took over, and no volume that held data was deleted: *lost* and *two primaries*
count runs that failed it. *PostgreSQL* is the median write downtime of the same fault in
the Failures table above (`make bench-faults`). The machine has 2 cores shared with other
work.
"""


def postgres_medians(text: str) -> tuple[dict[str, float], str]:
    """PostgreSQL's median write downtime per fault from the Failures table of
    docs/benchmarks.md, and the date it was measured ("" when unknown)."""
    if POSTGRES_SECTION not in text:
        return {}, ""
    section = text.split(POSTGRES_SECTION, 1)[1].split("\n## ", 1)[0]
    found = re.search(r"\((\d{4}-\d{2}-\d{2})", section)
    medians: dict[str, float] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and re.fullmatch(r"[\d.]+ / [\d.]+", cells[2]):
            medians[cells[0]] = float(cells[2].split(" / ")[0])
    return medians, found.group(1) if found else ""


def rows(result: dict[str, Any], postgres: dict[str, float]) -> list[str]:
    """The markdown table: one row per fault."""
    lines = [
        "| fault | runs | write downtime s, median / worst | new primary after s,"
        " median / worst | acknowledged writes lost | two primaries | PostgreSQL, same fault |",
        "| --- | ---: | --- | --- | ---: | ---: | --- |",
    ]
    for name, entry in sorted(result["faults"].items()):
        twin = POSTGRES_TWIN.get(name)
        theirs = (
            f"{postgres[twin]:.1f} s ({twin})" if twin in postgres else "-"
        )  # fmt: skip
        lines.append(
            f"| {name} | {entry['runs']} | {median_worst(entry['downtime'])} |"
            f" {median_worst(entry['promoted_after'])} | {entry['lost']} |"
            f" {entry['two_primaries']} |"
            f" {theirs} |"
        )
    return lines


def write_doc(result: dict[str, Any], postgres: dict[str, float], measured: str) -> None:
    lines = rows(result, postgres)
    block = "\n".join(
        [
            f"Measured {result['when']}, {result['runs']} runs of each fault"
            f"{f'; PostgreSQL measured {measured}' if measured else ''}.",
            "",
            *lines,
        ]
    ) + "\n"  # fmt: skip
    write_block(DOC, block, METHOD, begin=BEGIN, end=END)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.mariadb", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--runs", type=int, default=5, help="runs of each fault (5)")
    parser.add_argument("--only", action="append", choices=sorted(FAULTS))
    parser.add_argument("--no-doc", action="store_true", help="do not touch docs/benchmarks.md")
    parser.add_argument("--keep", action="store_true", help="keep the cluster's state and logs")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    names = args.only or sorted(FAULTS)
    say(f"==> MariaDB faults: {', '.join(names)}, {args.runs} runs each")
    tallies, code = chaos.run(schedule(args.runs, names), keep=args.keep, engine="mariadb")
    if tallies is None:
        return code
    result = {
        **summarize(tallies),
        "runs": args.runs,
        "when": time.strftime("%Y-%m-%d", time.gmtime()),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    postgres, measured = postgres_medians(DOC.read_text() if DOC.exists() else "")
    print("\n".join(rows(result, postgres)))
    if not args.no_doc:
        write_doc(result, postgres, measured)
    return code


if __name__ == "__main__":
    sys.exit(main())
