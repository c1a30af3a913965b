"""``make bench-faults``: the RTO/RPO table — every fault of the matrix ``--runs`` times.

The same cluster, writer and verdict as ``make chaos`` and the e2e fault tests (a fresh local
cluster with three real nodes, one 3-instance PostgresCluster), but in a fixed round-robin
order so every fault gets the same number of runs. Per fault: write downtime (the longest
gap between acknowledged commits around the fault), the time until ``status.primaryPod``
names a new primary that takes writes, acknowledged writes lost, and runs in which two
servers acknowledged writes. Lost writes or a second primary fail the verdict of a run, so
those columns count violations: they must be 0.

Then, unless ``--no-reference``, the same kinds of fault on bare Patroni
(``bench.patroni_lab``, no Kubernetes, in the same run) for the ratio column: write downtime
here over write downtime there, for the faults both have (a powered-off node is ``node-loss``
there; a hung node is ``node-freeze`` in both; a killed postmaster is ``postgres-kill``).

The result goes to ``bench/results/faults.json`` and, unless ``--no-doc``, replaces the
"Failures" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lab.faults import FAULTS

from bench import chaos
from bench.common import say

RESULTS = Path("bench/results/faults.json")
DOC = Path("docs/benchmarks.md")
SECTION = "## Failures"
REFERENCE = {
    "node-stop": "node-loss",
    "node-freeze": "node-freeze",
    "postgres-kill": "postgres-kill",
}
"""Our fault → the bare-Patroni fault it is compared with."""


def schedule(runs: int, names: list[str]) -> list[str]:
    """Round-robin: every fault once, then again, so a slow drift affects all alike."""
    return [name for _ in range(runs) for name in names]


def median_worst(values: list[float]) -> str:
    """``median / max`` to one decimal, or '-' of nothing."""
    if not values:
        return "-"
    return f"{statistics.median(values):.1f} / {max(values):.1f}"


def ratio(entry: dict[str, Any], reference: dict[str, Any] | None, name: str) -> str:
    """Median write downtime here over the same on bare Patroni, with that median."""
    theirs = ((reference or {}).get("faults") or {}).get(REFERENCE.get(name, ""))
    if not theirs or not entry["downtime"]:
        return "-"
    median = statistics.median(e["downtime_s"] for e in theirs)
    return f"{statistics.median(entry['downtime']) / median:.2f} (bare {median:.1f} s)"


def rows(result: dict[str, Any]) -> list[str]:
    """The markdown table of one result."""
    reference = result.get("reference")
    lines = [
        "| fault | runs | write downtime s, median / worst | new primary after s,"
        " median / worst | acknowledged writes lost | two primaries | vs bare Patroni |",
        "| --- | ---: | --- | --- | ---: | ---: | --- |",
    ]
    for name, entry in sorted(result["faults"].items()):
        lines.append(
            f"| {name} | {entry['runs']} | {median_worst(entry['downtime'])} |"
            f" {median_worst(entry['promoted_after'])} | {entry['lost']} |"
            f" {entry['two_primaries']} |"
            f" {ratio(entry, reference, name)} |"
        )
    return lines


def bare_patroni(runs: int) -> dict[str, Any] | None:
    """The reference faults on bare Patroni, measured now (None if it could not run)."""
    faults = sorted(set(REFERENCE.values()))
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "patroni.json"
        argv = [sys.executable, "-m", "bench.patroni_lab", "--runs", str(runs), "--no-doc"]
        argv += ["--json", str(out), "--faults", ",".join(faults)]
        say(f"==> bare Patroni: {', '.join(faults)}, {runs} runs each")
        if subprocess.run(argv, check=False).returncode != 0 or not out.exists():
            say("    bare Patroni did not run: no ratio column")
            return None
        return dict(json.loads(out.read_text()))


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
    parser.add_argument("--no-doc", action="store_true", help="leave docs/benchmarks.md alone")
    parser.add_argument("--keep", action="store_true", help="keep the cluster's state and logs")
    parser.add_argument(
        "--no-reference", action="store_true", help="skip the bare-Patroni runs (no ratio)"
    )
    args = parser.parse_args(argv)
    names = args.only or sorted(FAULTS)
    tallies, code = chaos.run(schedule(args.runs, names), keep=args.keep)
    if tallies is None:
        return code
    result = {
        **summarize(tallies),
        "runs": args.runs,
        "when": time.strftime("%Y-%m-%d", time.gmtime()),
        "reference": None if args.no_reference else bare_patroni(args.runs),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    say(f"==> results in {RESULTS}")
    print("\n".join(rows(result)))
    if not args.no_doc:
        write_doc(result)
    return code


if __name__ == "__main__":
    sys.exit(main())
