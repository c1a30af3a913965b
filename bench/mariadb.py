"""``make bench-mariadb``: a MariaDB Database losing its primary — write downtime, time to a
new primary, and acknowledged writes lost.

A fresh local cluster with three real nodes (``bench.dataplane.local_cluster``), the operator
as a process, one 3-server MariaDB 10.11 Database. ``--runs`` times: a writer inserts numbered
rows through the ``NAME-primary`` Service as an application would, the primary's pod is
deleted (``tests.support.databases.lose_the_primary``, the same steps as the real-node test),
and the run records the longest gap between acknowledged writes, the time until
``status.lastFailover`` named the new primary, and acknowledged writes the new primary lacks
(must be 0). Before the next run the Database is whole again: three servers ready, the old
primary back as a replica.

The result goes to ``bench/results/mariadb.json`` and, unless ``--no-doc``, between the
markers of the "MariaDB failover" section of docs/benchmarks.md. Needs root and no other
cluster with real nodes on this host.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import uuid
from pathlib import Path
from typing import Any

from lightkube import Client
from lightkube.config.kubeconfig import KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace
from tests.support.databases import create, lose_the_primary, running

from bench.dataplane import local_cluster, operator_for
from bench.nodes import say
from bench.patroni_lab import replace_block

RESULTS = Path("bench/results/mariadb.json")
DOC = Path("docs/benchmarks.md")
SECTION = "## MariaDB failover"
BEGIN = "<!-- mariadb:begin -->"
END = "<!-- mariadb:end -->"
NAME = "ha"
METHOD = f"""\
{SECTION}

What losing the primary of a MariaDB `Database` costs: `make bench-mariadb` (`python -m
bench.mariadb`, `--help` for the options) rewrites the part between the markers below.

**Method.** A fresh local cluster with 3 real nodes, the operator as a process on the host,
one 3-server MariaDB 10.11 Database (semi-synchronous replication, AFTER_SYNC). Each run: a
writer inserts numbered rows one at a time through the `{NAME}-primary` Service (reconnecting
after an error, as an application would); the primary's pod is deleted; *write downtime* is
the longest gap between two acknowledged inserts, *reported* the time from the delete call
until `status.lastFailover` names the new primary, and *lost* the acknowledged inserts the new
primary does not hold. The Database is whole again (old primary back as a replica) before
the next run. The machine has 2 cores shared with other work.
"""


def summary(runs: list[dict[str, Any]]) -> list[str]:
    """The table: one row per run, then median and worst."""
    lines = [
        "| run | from → to | writes acknowledged | lost | write downtime s | reported s |",
        "| ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for index, r in enumerate(runs, 1):
        lines.append(
            f"| {index} | {r['old']} → {r['new']} | {r['acknowledged']} | {r['lost']}"
            f" | {r['downtime_s']:.1f} | {r['reported_s']:.1f} |"
        )
    if runs:
        gaps = [r["downtime_s"] for r in runs]
        reported = [r["reported_s"] for r in runs]
        lines.append(
            f"| median / worst | | | {sum(r['lost'] for r in runs)} in total"
            f" | {statistics.median(gaps):.1f} / {max(gaps):.1f}"
            f" | {statistics.median(reported):.1f} / {max(reported):.1f} |"
        )
    return lines


def run(runs: int, keep: bool) -> dict[str, Any]:
    failures: list[str] = []
    results: list[dict[str, Any]] = []
    with local_cluster(keep, failures) as real, operator_for(real):
        client = Client(KubeConfig.from_file(real.kubeconfig), field_manager="stateward-bench")
        ns = f"bench-{uuid.uuid4().hex[:8]}"
        client.create(Namespace(metadata=ObjectMeta(name=ns)))
        create(client, ns, NAME, "mariadb", "10.11", 3)
        running(client, ns, NAME, 3)
        for index in range(1, runs + 1):
            say(f"==> run {index} of {runs}: deleting the primary under a writer")
            failover = lose_the_primary(client, ns, NAME, f"run{index}")
            results.append(
                {
                    "old": failover.old,
                    "new": failover.new,
                    "acknowledged": len(failover.acknowledged),
                    "lost": len(failover.lost),
                    "downtime_s": failover.longest_gap,
                    "reported_s": failover.reported_after,
                }
            )
            say(f"    {summary(results)[-2]}")
            running(client, ns, NAME, 3)
    return {"date": datetime.date.today().isoformat(), "runs": results, "up_failures": failures}


def write_doc(result: dict[str, Any]) -> None:
    block = "\n".join([f"Measured {result['date']}.", "", *summary(result["runs"])]) + "\n"
    current = DOC.read_text() if DOC.exists() else "# Benchmarks\n"
    DOC.write_text(replace_block(current, block, METHOD, begin=BEGIN, end=END))


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.mariadb", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--runs", type=int, default=5, help="primaries lost in a row (5)")
    parser.add_argument("--no-doc", action="store_true", help="do not touch docs/benchmarks.md")
    parser.add_argument("--keep", action="store_true", help="keep the cluster's state and logs")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    result = run(args.runs, args.keep)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print("\n".join(summary(result["runs"])))
    if not args.no_doc:
        write_doc(result)
    lost = sum(r["lost"] for r in result["runs"])
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
