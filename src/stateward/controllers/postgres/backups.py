"""What the backup Jobs reported, read from their pods: pure functions of observed objects.

Each backup pod ends with a termination message (``instance.backup``): the repository's
summary from ``pgbackrest info`` after a backup pgBackRest completed, or the reason it did
not. ``status.lastBackupTime`` and ``status.backups`` come only from such summaries, so a Job
that "succeeded" without pgBackRest saying so (a simulated node) reports no backup.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any

from stateward.controllers.kube import Body
from stateward.specs import meta
from stateward.specs.postgres import backup as backup_spec


def backup_result(pod: Body) -> dict[str, Any]:
    """The backup container's termination message as a document ({} when there is none)."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") != backup_spec.CONTAINER_NAME:
            continue
        terminated = (status.get("state") or {}).get("terminated") or {}
        try:
            document = json.loads(terminated.get("message") or "")
        except ValueError:
            return {}
        return document if isinstance(document, dict) else {}
    return {}


def _finished_at(pod: Body) -> str:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        terminated = (status.get("state") or {}).get("terminated") or {}
        if terminated.get("finishedAt"):
            return str(terminated["finishedAt"])
    return ""


@dataclasses.dataclass(frozen=True)
class Outcome:
    """The newest finished backup pod's word: a success or a failure."""

    succeeded: bool
    job: str
    finished_at: str
    summary: Mapping[str, Any]
    """The repository summary on success; ``{"error": ...}`` on failure."""


def outcomes(pods: Iterable[Body]) -> list[Outcome]:
    """Finished backup pods that reported something, oldest first."""
    found: list[Outcome] = []
    for pod in pods:
        labels = pod["metadata"].get("labels") or {}
        if meta.BACKUP_LABEL not in labels:
            continue
        phase = (pod.get("status") or {}).get("phase")
        result = backup_result(pod)
        if phase == "Succeeded" and isinstance(result.get("latest"), dict):
            succeeded = True
        elif phase == "Failed":
            succeeded = False
            if "error" not in result:
                result = {"error": "the backup pod failed without saying why; see its log"}
        else:
            continue
        found.append(
            Outcome(
                succeeded=succeeded,
                job=str(labels.get("batch.kubernetes.io/job-name", pod["metadata"]["name"])),
                finished_at=_finished_at(pod),
                summary=result,
            )
        )
    found.sort(key=lambda o: o.finished_at)
    return found


@dataclasses.dataclass(frozen=True)
class JobReport:
    """What one backup Job's pods said, newest pod first."""

    latest: Mapping[str, Any] | None
    """pgBackRest's newest backup, when a pod reported one completed."""
    errors: tuple[str, ...]
    """Why each failed pod failed, newest first ("see its log" when it did not say)."""


def job_report(pods: Iterable[Body]) -> JobReport:
    """The report of a Job's pods: the backup one of them completed, and why others failed."""
    latest: Mapping[str, Any] | None = None
    errors: list[str] = []
    for pod in sorted(pods, key=_finished_at, reverse=True):
        result = backup_result(pod)
        if latest is None and isinstance(result.get("latest"), dict):
            latest = result["latest"]
        if (pod.get("status") or {}).get("phase") == "Failed" or result.get("error"):
            errors.append(str(result.get("error") or "see its log"))
    return JobReport(latest=latest, errors=tuple(errors))


def backups_status(
    found: list[Outcome], current: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """``status.backups``: the newest successful report, or what status already had when
    that is newer (the Job was cleaned up by its history limit)."""
    successes = [o for o in found if o.succeeded]
    if not successes:
        return dict(current) if current else None
    newest = successes[-1]
    latest = newest.summary.get("latest") or {}
    current_latest = ((current or {}).get("latest") or {}).get("finishedAt") or ""
    if current and current_latest > str(latest.get("finishedAt") or ""):
        return dict(current)
    allowed = {"count", "full", "latest", "recoverableFrom", "archivedWal"}
    status = {k: v for k, v in newest.summary.items() if k in allowed}
    status["job"] = newest.job
    return status
