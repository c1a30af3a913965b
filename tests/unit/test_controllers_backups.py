"""Backup results read from the backup pods' termination messages."""

from __future__ import annotations

import json
from typing import Any

import pytest

from stateward.controllers.postgres import backups

pytestmark = pytest.mark.unit

SUMMARY: dict[str, Any] = {
    "count": 2,
    "full": 2,
    "latest": {
        "label": "20261202-101500F",
        "type": "full",
        "startedAt": "2026-12-02T10:15:00Z",
        "finishedAt": "2026-12-02T10:15:09Z",
    },
    "recoverableFrom": "2026-12-01T10:15:09Z",
    "archivedWal": "000000010000000000000007",
}


def backup_pod(
    job: str, phase: str, message: str | None, finished: str = "2026-12-02T10:15:10Z"
) -> dict[str, Any]:
    terminated: dict[str, Any] = {"exitCode": 0 if phase == "Succeeded" else 1}
    terminated["finishedAt"] = finished
    if message is not None:
        terminated["message"] = message
    return {
        "metadata": {
            "name": f"{job}-abcde",
            "labels": {"stateward.io/backup": "scheduled", "batch.kubernetes.io/job-name": job},
        },
        "status": {
            "phase": phase,
            "containerStatuses": [{"name": "backup", "state": {"terminated": terminated}}],
        },
    }


def test_a_reported_success_gives_the_status() -> None:
    found = backups.outcomes([backup_pod("demo-backup-1", "Succeeded", json.dumps(SUMMARY))])
    assert [o.succeeded for o in found] == [True]
    status = backups.backups_status(found, None)
    assert status == {**SUMMARY, "job": "demo-backup-1"}


def test_a_succeeded_pod_without_a_report_is_no_backup() -> None:
    # What a simulated node does: the Job "completes" and nothing ran.
    found = backups.outcomes([backup_pod("demo-backup-1", "Succeeded", None)])
    assert found == []
    assert backups.backups_status(found, None) is None


def test_a_failure_carries_its_reason() -> None:
    failed = backup_pod("demo-backup-2", "Failed", json.dumps({"error": "repository unreachable"}))
    silent = backup_pod("demo-backup-3", "Failed", None, finished="2026-12-02T10:20:00Z")
    found = backups.outcomes([failed, silent])
    assert [o.summary["error"] for o in found] == [
        "repository unreachable",
        "the backup pod failed without saying why; see its log",
    ]
    assert backups.backups_status(found, None) is None


def test_outcomes_are_ordered_by_when_they_finished() -> None:
    late = backup_pod("b", "Failed", "{}", finished="2026-12-02T11:00:00Z")
    early = backup_pod("a", "Succeeded", json.dumps(SUMMARY), finished="2026-12-02T10:00:00Z")
    assert [o.job for o in backups.outcomes([late, early])] == ["a", "b"]


def test_running_pods_and_other_pods_are_ignored() -> None:
    running = backup_pod("a", "Running", None)
    instance = {"metadata": {"name": "demo-0", "labels": {}}, "status": {"phase": "Running"}}
    assert backups.outcomes([running, instance]) == []


def test_a_newer_status_is_kept_when_its_job_is_gone() -> None:
    newer = {**SUMMARY, "latest": {**SUMMARY["latest"], "finishedAt": "2026-12-03T00:00:00Z"}}
    found = backups.outcomes([backup_pod("old", "Succeeded", json.dumps(SUMMARY))])
    assert backups.backups_status(found, newer) == newer


def test_unknown_keys_in_a_report_do_not_reach_the_status() -> None:
    report = json.dumps({**SUMMARY, "password": "x"})
    status = backups.backups_status(backups.outcomes([backup_pod("a", "Succeeded", report)]), None)
    assert status is not None and "password" not in status


def test_garbage_messages_are_no_report() -> None:
    assert backups.backup_result(backup_pod("a", "Succeeded", "not json")) == {}
    assert backups.backup_result(backup_pod("a", "Succeeded", "[1]")) == {}


def test_a_job_report_names_the_backup_its_pod_completed() -> None:
    report = backups.job_report(
        [
            backup_pod(
                "demo-final",
                "Failed",
                json.dumps({"error": "store unreachable"}),
                finished="2026-12-02T10:14:00Z",
            ),
            backup_pod("demo-final", "Succeeded", json.dumps(SUMMARY)),
        ]
    )
    assert report.latest == SUMMARY["latest"]
    assert report.errors == ("store unreachable",)


def test_a_job_report_gives_the_newest_failure_first() -> None:
    report = backups.job_report(
        [
            backup_pod(
                "demo-final",
                "Failed",
                json.dumps({"error": "first"}),
                finished="2026-12-02T10:14:00Z",
            ),
            backup_pod("demo-final", "Failed", None, finished="2026-12-02T10:16:00Z"),
            backup_pod(
                "demo-final",
                "Failed",
                json.dumps({"error": "second"}),
                finished="2026-12-02T10:15:00Z",
            ),
        ]
    )
    assert report.latest is None
    assert report.errors == ("see its log", "second", "first")


def test_a_job_whose_pod_completed_without_a_report_has_no_backup() -> None:
    report = backups.job_report([backup_pod("demo-final", "Succeeded", None)])
    assert report.latest is None
    assert report.errors == ()
