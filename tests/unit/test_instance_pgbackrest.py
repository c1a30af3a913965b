"""pgBackRest's options, the archive command, and reading ``pgbackrest info``."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from stateward.instance import pgbackrest
from stateward.specs.postgres import backup
from tests.support import clusters

pytestmark = pytest.mark.unit


def _backup(label: str, kind: str, start: int, stop: int, **extra: Any) -> dict[str, Any]:
    return {
        "archive": {"start": "000000010000000000000002", "stop": "000000010000000000000003"},
        "error": False,
        "info": {
            "delta": 22992597,
            "repository": {"delta": 4534023, "size": 4534023},
            "size": 22992597,
        },
        "label": label,
        "timestamp": {"start": start, "stop": stop},
        "type": kind,
        **extra,
    }


# The shape pgBackRest 2.45 prints (trimmed), measured against versitygw.
INFO: list[dict[str, Any]] = [
    {
        "archive": [
            {
                "id": "15-1",
                "max": "000000010000000000000005",
                "min": "000000010000000000000001",
            }
        ],
        "backup": [
            _backup("20261202-142441F", "full", 1796221481, 1796221488),
            _backup(
                "20261202-142441F_20261202-142451I",
                "incr",
                1796221491,
                1796221493,
                prior="20261202-142441F",
            ),
        ],
        "name": "demo",
        "status": {"code": 0, "message": "ok"},
    }
]


def test_summary_counts_complete_backups_and_gives_the_window() -> None:
    summary = pgbackrest.summarize(INFO, "demo")
    assert summary == {
        "count": 2,
        "full": 1,
        "latest": {
            "label": "20261202-142441F_20261202-142451I",
            "type": "incr",
            "startedAt": "2026-12-02T14:24:51Z",
            "finishedAt": "2026-12-02T14:24:53Z",
            "sizeBytes": 22992597,
            "repositoryBytes": 4534023,
        },
        "recoverableFrom": "2026-12-02T14:24:48Z",
        "archivedWal": "000000010000000000000005",
    }


def test_a_backup_pgbackrest_marks_as_errored_does_not_count() -> None:
    info = copy.deepcopy(INFO)
    info[0]["backup"][1]["error"] = True
    summary = pgbackrest.summarize(info, "demo")
    assert summary["count"] == 1
    assert summary["latest"]["label"] == "20261202-142441F"


def test_an_empty_repository_has_no_latest_backup() -> None:
    info = [{"name": "demo", "backup": [], "archive": [], "status": {"code": 2}}]
    with pytest.raises(ValueError, match="unusable"):
        pgbackrest.summarize(info, "demo")
    info[0]["status"] = {"code": 0}
    assert pgbackrest.summarize(info, "demo") == {"count": 0, "full": 0}


def test_a_missing_stanza_is_an_error() -> None:
    with pytest.raises(ValueError, match="stanza 'other'"):
        pgbackrest.summarize(INFO, "other")


def test_a_backup_without_timestamps_is_ignored() -> None:
    info = copy.deepcopy(INFO)
    del info[0]["backup"][0]["timestamp"]
    assert pgbackrest.summarize(info, "demo")["count"] == 1


def test_archive_command_without_and_with_a_repository() -> None:
    assert backup.archive_command(clusters.make_cluster()) == "/bin/true"
    cluster = clusters.make_cluster(backup=clusters.BACKUP)
    assert backup.archive_command(cluster) == "pgbackrest --stanza=demo archive-push %p"


def test_options_never_hold_the_keys() -> None:
    cluster = clusters.make_cluster(backup=clusters.BACKUP)
    options = backup.pgbackrest_options(cluster, data_dir="/d", socket_dir="/s", port=5432)
    assert not [name for name in options if "KEY" in name and "CA" not in name]
    assert list(options) == sorted(options)
    assert options["PGBACKREST_LOG_LEVEL_FILE"] == "off"
    # No y/n values: PyYAML leaves them unquoted and YAML 1.1 readers (kubectl) then take
    # them for booleans; "off" is quoted by every dumper that knows YAML 1.1.
    assert not {v for v in options.values() if v.lower() in ("y", "n")}
    assert (
        backup.pgbackrest_options(clusters.make_cluster(), data_dir="/d", socket_dir="/s", port=1)
        == {}
    )


def test_an_unreachable_store_is_reported_within_minutes() -> None:
    cluster = clusters.make_cluster(backup=clusters.BACKUP)
    options = backup.pgbackrest_options(cluster, data_dir="/d", socket_dir="/s", port=5432)
    # pgBackRest retries an I/O 8 times: 8 x 20 s, not 8 x its default 60 s.
    assert int(options["PGBACKREST_IO_TIMEOUT"]) <= 20


@pytest.mark.parametrize(
    ("stamp", "expected"),
    [
        ("2026-12-02T10:15:00Z", "2026-12-02 10:15:00+00"),
        ("2026-12-02T12:15:00+02:00", "2026-12-02 10:15:00+00"),
        ("2026-12-02T10:15:00.250Z", "2026-12-02 10:15:00.25+00"),
    ],
)
def test_target_times_are_given_to_pgbackrest_in_utc(stamp: str, expected: str) -> None:
    assert pgbackrest.pg_time(stamp) == expected


def test_restore_names_the_source_for_the_wal_it_fetches() -> None:
    argv = pgbackrest.restore_argv(stanza="orders", path="/db/orders", data_dir="/data")
    assert argv[:5] == [
        "pgbackrest",
        "--log-level-console=info",
        "--stanza=orders",
        "--repo1-path=/db/orders",
        "--pg1-path=/data",
    ]
    assert "restore" in argv
    # Not the pods' own repository (the environment's): the source's.
    assert (
        "--recovery-option=restore_command=pgbackrest --stanza=orders --repo1-path=/db/orders"
        ' archive-get %f "%p"'
    ) in argv
    assert not any(a.startswith("--type") for a in argv)  # latest: all the WAL there is


def test_restore_to_a_time_or_a_restore_point_promotes_there() -> None:
    timed = pgbackrest.restore_argv(
        stanza="s", path="/p", data_dir="/d", target_time="2026-12-02T10:15:00Z"
    )
    assert timed[-3:] == [
        "--type=time",
        "--target=2026-12-02 10:15:00+00",
        "--target-action=promote",
    ]
    named = pgbackrest.restore_argv(stanza="s", path="/p", data_dir="/d", restore_point="before")
    assert named[-3:] == ["--type=name", "--target=before", "--target-action=promote"]


def test_restore_command_for_patroni() -> None:
    assert backup.restore_command(clusters.make_cluster(backup=clusters.BACKUP)) is None
    cluster = clusters.make_cluster(
        backup=clusters.BACKUP,
        bootstrap={"restore": {"cluster": "orders", "targetTime": "2026-12-02T10:15:00Z"}},
    )
    assert backup.restore_command(cluster) == (
        "stateward-instance restore --stanza orders --path /db/orders"
        " --target-time 2026-12-02T10:15:00Z"
    )
    elsewhere = clusters.make_cluster(
        backup=clusters.BACKUP,
        bootstrap={"restore": {"cluster": "orders", "path": "/prod/o", "restorePoint": "rp1"}},
    )
    assert backup.restore_command(elsewhere) == (
        "stateward-instance restore --stanza orders --path /prod/o --restore-point rp1"
    )


def test_the_keys_file_holds_the_keys_and_refuses_what_would_inject_an_option() -> None:
    assert pgbackrest.keys_conf("AKIA1", "s3cr3t/+x") == (
        "[global]\nrepo1-s3-key=AKIA1\nrepo1-s3-key-secret=s3cr3t/+x\n"
    )
    for key, secret in (("", "x"), ("AKIA1", "x\nrepo1-path=/other"), ("a\r", "b")):
        with pytest.raises(ValueError, match="S3 key") as raised:
            pgbackrest.keys_conf(key, secret)
        assert "repo1-path" not in str(raised.value) and "s3cr3t" not in str(raised.value)
