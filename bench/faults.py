"""``make bench-faults``: the RTO/RPO table — every fault of the matrix ``--runs`` times.

The same cluster, writer and verdict as ``make chaos`` and the e2e fault tests (a fresh local
cluster with three real nodes, one 3-instance PostgresCluster), but in a fixed round-robin
order so every fault gets the same number of runs. Per fault: write downtime (the longest
gap between acknowledged commits around the fault), the time until ``status.primaryPod``
names a new primary that takes writes, acknowledged writes lost, and runs in which two
servers acknowledged writes. Lost writes or a second primary fail the verdict of a run, so
those columns count violations: they must be 0.

The result goes to ``bench/results/faults.json`` and, with ``--write-doc``, replaces the
"Failures" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from tests.support.faults import FAULTS

from bench import chaos
from bench.nodes import say

RESULTS = Path("bench/results/faults.json")
DOC = Path("docs/benchmarks.md")
SECTION = "## Failures"


def schedule(runs: int, names: list[str]) -> list[str]:
    """Round-robin: every fault once, then again, so a slow drift affects all alike."""
    return [name for _ in range(runs) for name in names]


def _pair(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.1f} / {max(values):.1f}"


def rows(result: dict[str, Any]) -> list[str]:
    """The markdown table of one result."""
    lines = [
        "| fault | runs | write downtime s, median / worst | new primary after s,"
        " median / worst | acknowledged writes lost | two primaries |",
        "| --- | ---: | --- | --- | ---: | ---: |",
    ]
    for name, entry in sorted(result["faults"].items()):
        lines.append(
            f"| {name} | {entry['runs']} | {_pair(entry['downtime'])} |"
            f" {_pair(entry['promoted_after'])} | {entry['lost']} | {entry['two_primaries']} |"
        )
    return lines


def summarize(tallies: dict[str, chaos.Tally]) -> dict[str, Any]:
    faults: dict[str, Any] = {}
    for name, tally in tallies.items():
        faults[name] = {
            "runs": tally.runs,
            "downtime": [round(d, 2) for d in tally.downtimes],
            "promoted_after": [round(p, 2) for p in tally.promoted],
            "lost": sum("acknowledged write" in v for v in tally.violations),
            "two_primaries": sum("acknowledged by" in v for v in tally.violations),
            "violations": tally.violations,
        }
    return {"faults": faults}


def write_doc(result: dict[str, Any]) -> None:
    text = DOC.read_text()
    body = "\n".join(
        [
            SECTION,
            "",
            f"`make bench-faults` ({result['when']}, {result['runs']} runs of each fault, one"
            " 3-instance cluster on 3 real nodes, a writer committing one row per"
            " transaction; method in bench/faults.py).",
            "",
            *rows(result),
            "",
        ]
    )
    if SECTION in text:
        start = text.index(SECTION)
        following = text.find("\n## ", start + len(SECTION))
        text = text[:start] + body + (text[following + 1 :] if following != -1 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + body
    DOC.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make bench-faults", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each fault (default 5)")
    parser.add_argument("--only", action="append", choices=sorted(FAULTS))
    parser.add_argument("--write-doc", action="store_true", help="update docs/benchmarks.md")
    parser.add_argument("--keep", action="store_true", help="keep the cluster's state and logs")
    args = parser.parse_args(argv)
    names = args.only or sorted(FAULTS)
    tallies, code = chaos.run(schedule(args.runs, names), keep=args.keep)
    if tallies is None:
        return code
    result = {
        **summarize(tallies),
        "runs": args.runs,
        "when": time.strftime("%Y-%m-%d", time.gmtime()),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    say(f"==> results in {RESULTS}")
    print("\n".join(rows(result)))
    if args.write_doc:
        write_doc(result)
    return code


if __name__ == "__main__":
    sys.exit(main())
