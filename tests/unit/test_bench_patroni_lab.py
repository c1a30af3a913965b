"""The bare-Patroni benchmark stays runnable without running it (it needs root, PostgreSQL 15,
etcd and minutes): it imports, parses its flags, keeps its functions small, reads Patroni's
``GET /cluster`` and ``GET /patroni`` right, and its per-fault summary and markdown rows say
what the runs measured."""

from __future__ import annotations

import ast
import math
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_bench import _statements

pytestmark = pytest.mark.unit

BENCH = Path(__file__).resolve().parents[2] / "bench"
MODULES = ("patroni_lab", "patroni_model", "patroni_processes", "patroni_faults", "patroni_report")
MAX_STATEMENTS = 40

# Patroni 4.1's GET /cluster of a healthy 3-member cluster in synchronous mode (trimmed).
HEALTHY: dict[str, Any] = {
    "members": [
        {"name": "m1", "role": "leader", "state": "running", "host": "127.0.0.1", "timeline": 2},
        {"name": "m2", "role": "sync_standby", "state": "streaming", "lag": 0},
        {"name": "m3", "role": "replica", "state": "streaming", "lag": 0},
    ],
    "scope": "lab",
}
NAMES = ("m1", "m2", "m3")


def _cluster(*members: tuple[str, str, str]) -> dict[str, Any]:
    return {"members": [{"name": n, "role": r, "state": s} for n, r, s in members]}


@pytest.mark.parametrize("module", MODULES)
def test_no_function_is_a_wall_of_statements(module: str) -> None:
    tree = ast.parse((BENCH / f"{module}.py").read_text())
    sizes = {
        node.name: _statements(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    assert {name: n for name, n in sizes.items() if n > MAX_STATEMENTS} == {}


def test_it_imports_and_parses_its_flags() -> None:
    from bench import patroni_lab
    from bench.patroni_model import FAULTS

    args = patroni_lab.parse(["--runs", "2", "--faults", "node-loss,switchover", "--no-doc"])
    assert (args.runs, args.faults, args.no_doc, args.keep) == (
        2,
        ["node-loss", "switchover"],
        True,
        False,
    )
    defaults = patroni_lab.parse([])
    assert (defaults.runs, defaults.faults, defaults.json) == (5, list(FAULTS), None)
    with pytest.raises(SystemExit) as exit_info:
        patroni_lab.parse(["--help"])
    assert exit_info.value.code == 0
    for wrong in (["--runs", "0"], ["--faults", "reboot"], ["--faults", ","]):
        with pytest.raises(SystemExit):
            patroni_lab.parse(wrong)


def test_it_installs_the_patroni_of_the_instance_image_with_the_etcd3_dcs() -> None:
    from bench.patroni_model import REQUIREMENTS, lab_requirements

    from stateward_local.images import catalog

    assert lab_requirements(["patroni[kubernetes,psycopg3]==4.1.5", "psycopg[binary]==3.3.9"]) == [
        "patroni[etcd3,psycopg3]==4.1.5",
        "psycopg[binary]==3.3.9",
    ]
    image_pin = next(r for r in catalog.PATRONI_REQUIREMENTS if r.startswith("patroni["))
    assert REQUIREMENTS[0].split("==") == ["patroni[etcd3,psycopg3]", image_pin.split("==")[1]]


def test_the_cluster_json_gives_the_leader_and_the_synchronous_standby() -> None:
    from bench.patroni_model import parse_cluster

    view = parse_cluster(HEALTHY)
    assert (view.leader, view.sync) == ("m1", ("m2",))
    assert view.members["m3"] == ("replica", "streaming")
    assert view.state("m1") == "running"
    assert view.state("m9") is None
    nobody = parse_cluster(_cluster(("m1", "replica", "stopped"), ("m2", "replica", "streaming")))
    assert (nobody.leader, nobody.sync) == (None, ())
    assert parse_cluster({}).members == {}


def test_healthy_means_one_running_leader_one_sync_standby_and_everyone_streaming() -> None:
    from bench.patroni_model import healthy, parse_cluster

    assert healthy(parse_cluster(HEALTHY), NAMES)
    not_yet = [
        # a replica still starting (after pg_rewind)
        _cluster(
            ("m1", "leader", "running"),
            ("m2", "sync_standby", "streaming"),
            ("m3", "replica", "starting"),
        ),
        # no synchronous standby assigned yet (just after a postmaster restart)
        _cluster(
            ("m1", "leader", "running"),
            ("m2", "replica", "streaming"),
            ("m3", "replica", "streaming"),
        ),
        # the leader's PostgreSQL is not up
        _cluster(
            ("m1", "leader", "starting"),
            ("m2", "sync_standby", "streaming"),
            ("m3", "replica", "streaming"),
        ),
        # a member missing (killed, not yet back in the DCS)
        _cluster(("m1", "leader", "running"), ("m2", "sync_standby", "streaming")),
        # no leader at all
        _cluster(
            ("m1", "replica", "running"),
            ("m2", "replica", "streaming"),
            ("m3", "replica", "streaming"),
        ),
    ]
    assert [healthy(parse_cluster(body), NAMES) for body in not_yet] == [False] * len(not_yet)
    assert not healthy(None, NAMES)


def _round(t: float, own: dict[str, Any], leaders: dict[str, str | None]) -> Any:
    """A poll round: each member's own report, and the leader each member's view names
    (running), or None where it did not answer."""
    from bench.patroni_model import ClusterView, Round

    views = {
        name: None if leader is None else ClusterView(leader, (), {leader: ("leader", "running")})
        for name, leader in leaders.items()
    }
    return Round(t, own, views)


def _me(role: str, started: str = "t0", state: str = "running") -> dict[str, Any]:
    return {"role": role, "state": state, "postmaster_start_time": started}


def test_the_new_primary_is_another_leader_in_a_cluster_view() -> None:
    from bench.patroni_model import ClusterView, Round, new_primary

    rounds = [
        _round(0.5, {"m1": _me("primary"), "m2": _me("replica")}, {"m1": "m1", "m2": "m1"}),
        _round(1.0, {"m1": None, "m2": _me("replica")}, {"m1": None, "m2": "m1"}),
        _round(1.5, {"m1": None, "m2": _me("primary")}, {"m1": None, "m2": "m2"}),
    ]
    assert new_primary(rounds, "m1", "t0", since=0.0) == (1.5, "m2")
    # Rounds before the fault do not count, and a leader that does not run does not either.
    assert new_primary(rounds, "m2", "t0", since=1.6) is None
    not_running = Round(3.0, {}, {"m3": ClusterView("m2", (), {"m2": ("leader", "stopped")})})
    assert new_primary([not_running], "m1", "t0", since=0.0) is None


def test_a_postmaster_restarted_in_place_counts_once_it_runs_as_primary_again() -> None:
    from bench.patroni_model import new_primary

    rounds = [
        # the old postmaster, still reported (the kill not yet noticed)
        _round(0.2, {"m1": _me("primary", "t0")}, {"m1": "m1"}),
        # restarting: the lock kept, the new postmaster not yet a running primary
        _round(1.2, {"m1": _me("primary", "t1", state="starting")}, {"m1": "m1"}),
        _round(2.2, {"m1": _me("primary", "t1")}, {"m1": "m1"}),
    ]
    assert new_primary(rounds, "m1", "t0", since=0.0) == (2.2, "m1")


def test_two_primaries_are_two_members_each_reporting_itself_a_running_primary() -> None:
    from bench.patroni_faults import watched
    from bench.patroni_model import primaries, view_leaders

    calm = _round(1.0, {"m1": _me("replica"), "m2": _me("primary")}, {"m1": "m2", "m2": "m2"})
    resumed = _round(
        1.2,
        {"m1": _me("primary"), "m2": _me("primary"), "m3": _me("replica")},
        {"m1": "m1", "m2": "m2"},
    )
    demoting = _round(1.4, {"m1": _me("primary", state="stopping"), "m2": _me("primary")}, {})
    assert primaries(calm) == ["m2"]
    assert primaries(resumed) == ["m1", "m2"]
    assert primaries(demoting) == ["m2"]
    assert view_leaders(resumed) == {"m1", "m2"}
    seen = watched([calm, resumed, demoting], since=1.1)
    assert seen["two_primaries"]
    assert seen["two_primaries_rounds"] == [{"at_s": 0.1, "primaries": ["m1", "m2"]}]
    assert (seen["views_disagree_rounds"], seen["poll_rounds"]) == (1, 2)
    assert seen["poll_gap_max_s"] == pytest.approx(0.2)
    assert not watched([calm, demoting], since=0.0)["two_primaries"]


def test_a_members_processes_are_the_whole_tree_below_it() -> None:
    from bench.patroni_model import descendants

    tree = {10: [11, 12], 11: [13], 12: [], 13: [], 20: [21]}
    assert descendants(10, lambda pid: tree.get(pid, [])) == [10, 11, 12, 13]
    assert descendants(99, lambda pid: []) == [99]


def _entry(
    downtime: float,
    moved: float,
    *,
    lost: int = 0,
    acked: int = 100,
    twice: bool = False,
    same: bool = False,
) -> dict[str, Any]:
    return {
        "downtime_s": downtime,
        "new_primary_s": moved,
        "lost": lost,
        "acknowledged": acked,
        "two_primaries": twice,
        "same_member": same,
    }


def test_the_summary_of_one_fault() -> None:
    from bench.patroni_model import summarize

    entries = [_entry(2.0, 2.5), _entry(3.0, 3.1, lost=1, twice=True), _entry(2.5, 2.9)]
    assert summarize(entries) == {
        "runs": 3,
        "downtime_s": (2.5, 3.0),
        "new_primary_s": (2.9, 3.1),
        "lost": 1,
        "acknowledged": 300,
        "two_primaries_runs": 1,
        "same_member_runs": 0,
    }
    empty = summarize([])
    assert empty["runs"] == 0
    assert all(math.isnan(v) for v in empty["downtime_s"])


def test_the_markdown_rows_one_per_fault_in_a_fixed_order() -> None:
    from bench.patroni_report import rows

    result = {
        "faults": {
            "node-loss": [_entry(20.1, 20.0), _entry(20.5, 20.4, acked=50)],
            "switchover": [_entry(2.41, 2.6), _entry(2.38, 2.5), _entry(2.6, 2.7)],
            "postgres-kill": [_entry(3.2, 3.3, same=True), _entry(3.9, 4.0, same=True)],
            "node-freeze": [_entry(22.3, 21.9, twice=True), _entry(22.0, 21.5)],
        }
    }
    assert rows(result) == [
        "| fault | runs | write downtime median / worst | time to new primary median / worst"
        " | acked writes lost | two primaries seen |",
        "|---|---|---|---|---|---|",
        "| switchover | 3 | 2.41 / 2.60 s | 2.6 / 2.7 s | **0** of 300 | no |",
        "| postgres-kill | 2 | 3.55 / 3.90 s | 3.6 / 4.0 s (restarted in place 2 of 2)"
        " | **0** of 200 | no |",
        "| node-loss | 2 | 20.30 / 20.50 s | 20.2 / 20.4 s | **0** of 150 | no |",
        "| node-freeze | 2 | 22.15 / 22.30 s | 21.7 / 21.9 s | **0** of 200"
        " | **yes, 1 of 2 runs** |",
    ]
    only = rows({"faults": {"switchover": [_entry(1.0, 1.0, lost=2)]}})
    assert only[2:] == ["| switchover | 1 | 1.00 / 1.00 s | 1.0 / 1.0 s | **2** of 100 | no |"]


def test_the_doc_block_replaces_its_markers_or_is_appended_with_the_method(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench import patroni_report
    from bench.patroni_report import BEGIN, END, METHOD, SECTION, write_doc

    doc = tmp_path / "benchmarks.md"
    monkeypatch.setattr(patroni_report, "DOC", doc)
    write_doc("first\n")
    assert doc.read_text() == f"# Benchmarks\n\n{METHOD}\n{BEGIN}\nfirst\n{END}\n"
    assert METHOD.startswith(f"{SECTION}\n")
    doc.write_text(doc.read_text() + "\n## Next\n")
    write_doc("second\n")
    assert doc.read_text() == f"# Benchmarks\n\n{METHOD}\n{BEGIN}\nsecond\n{END}\n\n## Next\n"


def test_the_members_listen_on_loopback_only_with_the_recorded_dcs(tmp_path: Path) -> None:
    from bench.patroni_faults import writer_dsn
    from bench.patroni_model import DCS
    from bench.patroni_processes import Lab, patroni_config

    lab = Lab(tmp_path, Path("python"), Path("etcd"), None)
    try:
        member = lab.members["m2"]
        config = patroni_config(member, lab.etcd_port, "secret")
        addresses = [
            config["restapi"]["listen"],
            config["restapi"]["connect_address"],
            config["postgresql"]["listen"],
            config["postgresql"]["connect_address"],
            config["etcd3"]["hosts"],
        ]
        assert all(a.startswith("127.0.0.1:") for a in addresses)
        assert config["bootstrap"]["dcs"] is DCS
        assert (DCS["ttl"], DCS["loop_wait"], DCS["retry_timeout"]) == (20, 1, 5)
        assert DCS["synchronous_mode"] is True
        assert DCS["postgresql"]["use_pg_rewind"] and DCS["postgresql"]["use_slots"]
        assert "unix_socket_directories" not in DCS["postgresql"]["parameters"]
        assert config["postgresql"]["data_dir"] == str(tmp_path / "m2" / "data")
        ports = {m.pg_port for m in lab.members.values()} | {
            m.api_port for m in lab.members.values()
        }
        assert len(ports | {lab.etcd_port, lab.peer_port}) == 8
        dsn = writer_dsn(lab)
        assert "host=127.0.0.1,127.0.0.1,127.0.0.1 " in dsn
        assert f"port={','.join(str(m.pg_port) for m in lab.members.values())} " in dsn
        assert dsn.endswith(" target_session_attrs=read-write")
        assert "connect_timeout=2" in dsn
        single = writer_dsn(lab, [member], any_role=True)
        assert f"host=127.0.0.1 port={member.pg_port} " in single
        assert "target_session_attrs" not in single
    finally:
        lab.http.close()


def test_pauses_are_the_long_gaps_that_end_after_the_fault() -> None:
    from bench.patroni_faults import pauses

    stamps = [0.0, 2.0, 2.1, 10.0, 10.1, 10.2, 13.2, 13.3]
    # The fault at 1.0: 0 → 2 ends after it, then 2.1 → 10.0 and 10.2 → 13.2.
    assert pauses(stamps, 1.0) == [[-1.0, 2.0], [1.1, 7.9], [9.2, 3.0]]
    assert pauses(stamps, 11.0, longer_than=5) == []
    assert pauses([], 0.0) == []
