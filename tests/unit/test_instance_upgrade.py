"""``stateward-instance upgrade`` against a fake pg_controldata, initdb and pg_upgrade: what
it refuses (and then leaves exactly as it was), the order of its steps, and that a run a
crash interrupted finishes where it stopped. (The real binaries: the 17 image's build runs
pg_upgrade --check of 15 against 17; the real-node upgrade test runs all of it.)"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from stateward.instance import upgrade

pytestmark = pytest.mark.unit

CONTROLDATA = """pg_control version number:            1300
Database cluster state:               {state}
Data page checksum version:           {checksums}
"""
CHECK_FAILED = """Performing Consistency Checks
-----------------------------
Checking cluster versions                                     ok
Checking data type usage                                      fatal

Your installation contains the "aclitem" data type in user tables.
A list of the problem columns is in the file:
    {listing}
Failure, exiting
"""


class Tools:
    """pg_controldata, initdb and pg_upgrade as the upgrade calls them."""

    def __init__(self, layout: upgrade.Layout) -> None:
        self.layout = layout
        self.calls: list[str] = []
        self.state = "shut down"
        self.checksums = "1"
        self.check_output: str | None = None
        self.link_fails: str | None = None  # "before" or "after" the link step

    def __call__(self, argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        tool = Path(argv[0]).name
        step = tool if tool != "pg_upgrade" else ("check" if "--check" in argv else "link")
        self.calls.append(step)
        out, code = "", 0
        if tool == "pg_controldata":
            out = CONTROLDATA.format(state=self.state, checksums=self.checksums)
        elif tool == "initdb":
            Path(self.layout.new_dir).mkdir(parents=True)
            Path(self.layout.new_dir, "PG_VERSION").write_text(f"{self.layout.new}\n")
            self.initdb = argv
        elif step == "check" and self.check_output is not None:
            out, code = self.check_output, 1
        elif step == "link":
            if self.link_fails != "before":
                control = Path(self.layout.data_dir, "global", "pg_control")
                control.rename(control.with_suffix(".old"))
            if self.link_fails is not None:
                out, code = "could not link file", 1
        return subprocess.CompletedProcess(argv, code, out, "")


@pytest.fixture
def layout(tmp_path: Path) -> upgrade.Layout:
    data = tmp_path / "volume" / "pgdata"
    (data / "global").mkdir(parents=True)
    (data / "PG_VERSION").write_text("15\n")
    (data / "global" / "pg_control").write_text("control")
    (data / "base").mkdir()
    (data / "base" / "1").write_text("rows")
    return upgrade.Layout(15, 17, str(data))


def run(layout: upgrade.Layout, tools: Tools, free: int = 10 * 2**30) -> str:
    job = upgrade.Upgrade(layout, run=tools, free_bytes=lambda _: free, say=lambda _: None)
    return job.execute()


def untouched(layout: upgrade.Layout) -> bool:
    data = Path(layout.data_dir)
    return (
        (data / "PG_VERSION").read_text() == "15\n"
        and (data / "global" / "pg_control").is_file()
        and not Path(layout.new_dir).exists()
        and not Path(layout.work_dir).exists()
    )


def test_an_upgrade_checks_links_then_puts_the_new_directory_in_place(
    layout: upgrade.Layout,
) -> None:
    tools = Tools(layout)
    assert run(layout, tools) == "upgraded the data directory from PostgreSQL 15 to 17"
    assert tools.calls == ["pg_controldata", "initdb", "check", "link"]
    assert "--data-checksums" in tools.initdb and "--username=postgres" in tools.initdb
    assert upgrade.major_of(layout.data_dir) == 17
    assert not Path(layout.old_dir).exists() and not Path(layout.work_dir).exists()


def test_without_checksums_the_new_cluster_has_none_either(layout: upgrade.Layout) -> None:
    tools = Tools(layout)
    tools.checksums = "0"
    run(layout, tools)
    assert "--data-checksums" not in tools.initdb


def test_the_old_server_runs_without_what_only_the_pods_have() -> None:
    command = upgrade.pg_upgrade_command(upgrade.Layout(15, 17), check=False)
    assert "--link" in command and "--check" not in command
    assert "--old-bindir=/usr/lib/postgresql/15/bin" in command
    assert "--new-bindir=/usr/lib/postgresql/17/bin" in command
    old_options = next(a for a in command if a.startswith("--old-options="))
    for option in ("ssl=off", "archive_mode=off", "jit=off", "hba_file="):
        assert option in old_options


def test_a_finished_upgrade_run_again_is_success_and_runs_nothing(
    layout: upgrade.Layout,
) -> None:
    Path(layout.data_dir, "PG_VERSION").write_text("17\n")
    tools = Tools(layout)
    assert run(layout, tools) == "the data directory is PostgreSQL 17: upgraded"
    assert tools.calls == []


def test_a_swap_a_crash_interrupted_is_completed(layout: upgrade.Layout) -> None:
    Path(layout.data_dir).rename(layout.old_dir)
    Path(layout.new_dir).mkdir()
    Path(layout.new_dir, "PG_VERSION").write_text("17\n")
    tools = Tools(layout)
    assert "upgraded" in run(layout, tools)
    assert upgrade.major_of(layout.data_dir) == 17 and not Path(layout.old_dir).exists()
    assert tools.calls == []


@pytest.mark.parametrize(
    ("arrange", "reason"),
    [
        (lambda tools, layout: Path(layout.data_dir, "PG_VERSION").write_text("14\n"), "holds"),
        (lambda tools, layout: setattr(tools, "state", "in production"), "not shut down"),
    ],
    ids=["another major", "not shut down cleanly"],
)
def test_what_is_not_a_clean_old_cluster_is_refused(
    layout: upgrade.Layout, arrange: Any, reason: str
) -> None:
    tools = Tools(layout)
    arrange(tools, layout)
    with pytest.raises(upgrade.UpgradeRefused, match=reason):
        run(layout, tools)
    assert "initdb" not in tools.calls and not Path(layout.new_dir).exists()


def test_too_little_free_space_is_refused_before_anything_is_written(
    layout: upgrade.Layout,
) -> None:
    tools = Tools(layout)
    with pytest.raises(upgrade.UpgradeRefused, match=r"grow spec\.storageSize"):
        run(layout, tools, free=64 * 2**20)
    assert tools.calls == [] and untouched(layout)


def test_a_failed_check_is_refused_with_what_pg_upgrade_found_and_the_old_data_intact(
    layout: upgrade.Layout, tmp_path: Path
) -> None:
    listing = tmp_path / "tables_using_aclitem.txt"
    listing.write_text("In database: app\n  public.grants.acl\n")
    tools = Tools(layout)
    tools.check_output = CHECK_FAILED.format(listing=listing)
    with pytest.raises(upgrade.UpgradeRefused) as refused:
        run(layout, tools)
    message = str(refused.value)
    assert message.startswith("pg_upgrade --check found a problem: Checking data type usage")
    assert '"aclitem" data type in user tables' in message
    assert "In database: app public.grants.acl" in message  # the listing, read before it goes
    assert "\n" not in message and " ok" not in message
    assert tools.calls == ["pg_controldata", "initdb", "check"] and untouched(layout)


def test_a_link_that_failed_before_linking_is_refused_after_it_failed(
    layout: upgrade.Layout,
) -> None:
    tools = Tools(layout)
    tools.link_fails = "before"
    with pytest.raises(upgrade.UpgradeRefused, match="before linking"):
        run(layout, tools)
    assert untouched(layout)

    tools = Tools(layout)
    tools.link_fails = "after"
    with pytest.raises(upgrade.UpgradeFailed, match="after linking"):
        run(layout, tools)
    assert Path(layout.new_dir).exists()  # kept for whoever repairs it


def test_main_reports_on_one_line_and_exits_3_when_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert upgrade.main(17, 15, data_dir=str(tmp_path / "pgdata")) == upgrade.REFUSED
    assert capsys.readouterr().out == "refused: 15 is not newer than 17\n"
    assert upgrade.main(15, 17, data_dir=str(tmp_path / "pgdata")) == upgrade.REFUSED
    assert "holds PostgreSQL nothing, not 15" in capsys.readouterr().out


def test_a_finished_upgrade_leaves_its_marker_beside_the_data_not_in_it(
    layout: upgrade.Layout,
) -> None:
    run(layout, Tools(layout))
    assert Path(layout.marker).read_text() == "15\n"
    assert Path(layout.marker).parent == Path(layout.data_dir).parent  # a clone does not copy it


class Stanza:
    """psql (is this the primary?) and pgbackrest stanza-upgrade."""

    def __init__(self, primary: bool = True, upgrade_code: int = 0) -> None:
        self.primary, self.upgrade_code = primary, upgrade_code
        self.calls: list[str] = []

    def __call__(self, argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        tool = Path(argv[0]).name
        self.calls.append(tool)
        if tool == "psql":
            return subprocess.CompletedProcess(argv, 0, "t\n" if self.primary else "f\n", "")
        return subprocess.CompletedProcess(argv, self.upgrade_code, "", "ERROR: [055]: unable")


def test_the_primary_upgrades_the_stanza_once_then_forgets_the_marker(
    layout: upgrade.Layout,
) -> None:
    env = {"PGBACKREST_STANZA": "demo"}
    stanza = Stanza()
    assert upgrade.upgrade_stanza_once("psql", layout.data_dir, env=env, run=stanza)
    assert stanza.calls == []  # no marker: no upgrade happened here
    marker = Path(layout.marker)
    marker.write_text("15\n")
    replica = Stanza(primary=False)
    assert not upgrade.upgrade_stanza_once("psql", layout.data_dir, env=env, run=replica)
    assert replica.calls == ["psql"] and marker.exists()  # a replica waits
    failing = Stanza(upgrade_code=55)
    assert not upgrade.upgrade_stanza_once("psql", layout.data_dir, env=env, run=failing)
    assert marker.exists()  # tried again later
    assert upgrade.upgrade_stanza_once("psql", layout.data_dir, env=env, run=stanza)
    assert stanza.calls == ["psql", "pgbackrest"] and not marker.exists()


def test_without_a_repository_the_marker_just_goes(layout: upgrade.Layout) -> None:
    marker = Path(layout.marker)
    marker.write_text("15\n")
    stanza = Stanza()
    assert upgrade.upgrade_stanza_once("psql", layout.data_dir, env={}, run=stanza)
    assert stanza.calls == [] and not marker.exists()
