"""The chaos soak's schedule and summary (bench/chaos.py)."""

from __future__ import annotations

from bench import chaos
from lab.faults import FAULTS, Outcome


def test_a_seed_gives_the_same_schedule_of_known_faults() -> None:
    first = chaos.plan(30, seed=7, names=sorted(FAULTS))
    assert first == chaos.plan(30, seed=7, names=sorted(FAULTS))
    assert len(first) == 30 and set(first) <= set(FAULTS)
    assert chaos.plan(5, seed=1, names=["node-stop"]) == ["node-stop"] * 5


def test_the_summary_counts_runs_failovers_downtime_and_violations() -> None:
    tallies: dict[str, chaos.Tally] = {}
    tallies.setdefault("node-stop", chaos.Tally())
    tallies.setdefault("postgres-kill", chaos.Tally())
    chaos.record(tallies, Outcome("node-stop", "f-0", "f-1", 4.0, ["a", "b"]))
    chaos.record(tallies, Outcome("node-stop", "f-1", "f-2", 6.0, ["b", "c"]))
    chaos.record(tallies, Outcome("postgres-kill", "f-2", "f-2", 3.0, ["c"]))
    tallies["postgres-kill"].runs += 1
    tallies["postgres-kill"].violations.append("lost 1 acknowledged write")
    rows = chaos.summary(tallies)
    assert rows[2] == "| node-stop | 2 | 2 | 5.0 s / 6.0 s | 0 |"
    assert rows[3] == "| postgres-kill | 2 | 0 | 3.0 s / 3.0 s | 1 |"
    assert rows[-1] == "| **all** | 4 | 2 | | 1 |"


def test_a_fault_that_never_completed_shows_no_downtime() -> None:
    tallies = {"node-freeze": chaos.Tally(runs=1, violations=["did not recover"])}
    assert chaos.summary(tallies)[2] == "| node-freeze | 1 | 0 | - | 1 |"


def test_the_fault_bench_runs_every_fault_alike_and_tabulates_them() -> None:
    from bench import faults as bench_faults

    assert bench_faults.schedule(2, ["a", "b"]) == ["a", "b", "a", "b"]
    tallies = {"node-stop": chaos.Tally()}
    chaos.record(tallies, Outcome("node-stop", "f-0", "f-1", 4.0, ["a", "b"], 3.5))
    chaos.record(tallies, Outcome("node-stop", "f-1", "f-2", 6.0, ["b", "c"], 5.5))
    tallies["postgres-kill"] = chaos.Tally(runs=1, violations=["lost 2 acknowledged writes"])
    result = bench_faults.summarize(tallies)
    lines = bench_faults.rows(result)
    assert lines[2] == "| node-stop | 2 | 5.0 / 6.0 | 4.5 / 5.5 | 0 | 0 | - |"
    assert lines[3] == "| postgres-kill | 1 | - | - | 1 | 0 | - |"
    # With bare Patroni measured in the same run: the ratio of median write downtimes.
    result["reference"] = {"faults": {"node-loss": [{"downtime_s": 20.0}, {"downtime_s": 22.0}]}}
    assert bench_faults.rows(result)[2].endswith("| 0.24 (bare 21.0 s) |")


def test_chaos_targets_a_mariadb_database_with_its_own_matrix() -> None:
    from lab import database_faults

    args = chaos.parse(["--engine", "mariadb", "--only", "mariadbd-kill"])
    assert args.engine == "mariadb"
    assert chaos.MATRICES["mariadb"].faults is database_faults.FAULTS
    assert chaos.MATRICES["postgres"].faults is FAULTS
    # A fault of the other engine is refused before any cluster is made.
    assert chaos.main(["--engine", "mariadb", "--only", "postgres-kill", "--faults", "1"]) == 2
