"""The backup benchmark stays runnable without running it (it needs root, real nodes and
minutes): its flags parse, and its arithmetic on WAL file names, pgBackRest's timestamps
and the table is right."""

from __future__ import annotations

import math

import pytest
from bench import backups

pytestmark = pytest.mark.unit


def test_defaults_measure_two_database_sizes_under_a_minute_of_load() -> None:
    args = backups.parse([])
    assert args.scales == [10, 50] and args.load_seconds == 60 and not args.no_doc
    assert backups.parse(["--scales", "1", "--load-seconds", "5"]).scales == [1]


@pytest.mark.parametrize(
    ("walfile", "number"),
    [
        ("000000010000000000000001", 1),
        ("0000000100000000000000FF", 255),
        ("000000010000000100000000", 256),  # the next log file: 256 segments of 16 MiB each
        ("000000030000000200000004", 2 * 256 + 4),  # the timeline does not count
    ],
)
def test_segment_numbers_follow_the_wal(walfile: str, number: int) -> None:
    assert backups.segment_number(walfile) == number


def test_unarchived_counts_completed_segments_only() -> None:
    current = "000000010000000000000010"
    assert backups.unarchived(current, "00000001000000000000000F") == 0  # caught up
    assert backups.unarchived(current, "00000001000000000000000C") == 3
    assert backups.unarchived(current, "") == 16  # nothing archived yet
    # Across a log-file boundary.
    assert backups.unarchived("000000010000000100000001", "0000000100000000000000FE") == 2


def test_throughput_from_pgbackrests_timestamps() -> None:
    took = backups.seconds_between("2026-12-03T08:00:00Z", "2026-12-03T08:00:50Z")
    assert took == 50
    assert backups.mb_per_s(500 * 2**20, took) == 10
    assert math.isnan(backups.mb_per_s(1, 0))


def test_the_table_has_one_row_per_scale() -> None:
    run = {
        "scale": 10, "database_mb": 160.4, "backup_mb_s": 21.33, "backup_waited_s": 14.2,
        "repository_mb": 12.0, "wal_mb_s": 3.25, "lag_segments_median": 0,
        "lag_segments_max": 2, "archived_age_max_s": 4.0, "restore_s": 40.5,
        "restore_mb_s": 3.96,
    }  # fmt: skip
    header, rule, row = backups.rows({"runs": [run]})
    assert header.count("|") == rule.count("|") == row.count("|")
    assert row == "| 10 | 160 | 21.3 | 14.2 | 12 | 3.2 | 0 / 2 | 4.0 | 40.5 | 4.0 |"
