"""The PostgresCluster's backup phases: the ones that talk to the API server about backups.

The repository paths a spec may name, the children of backups no longer wanted (the
CronJob, the backup Jobs' identity), the repository's credentials Secret, the
``stateward.io/backup`` requests and ``status.backups``. What the backup Jobs reported is
read by ``backups``, which stays pure; these phases create, delete and read objects and say
what they did, as every phase of ``reconcile`` does. They know nothing of the reconciler
that runs them.
"""

from __future__ import annotations

import time
from typing import Any

from lightkube import ApiError

from stateward.api import v1alpha1, validation
from stateward.controllers import conditions as cond
from stateward.controllers.kube import Ref
from stateward.controllers.postgres import backups
from stateward.controllers.postgres.scope import (
    PROGRESS_RECHECK,
    UNSATISFIABLE_RECHECK,
    Scope,
    delete_observed,
    job_pods,
    job_state,
)
from stateward.instance import pgbackrest
from stateward.specs.postgres import backup


async def check_repository_paths(scope: Scope) -> str | None:
    """A repository path outside the namespace's prefix (admission refuses one; this covers
    objects stored before that rule, or while the operator allowed it): nothing more is done
    — no pod gets the path, no backup or restore runs, no final backup is written — until the
    spec changes. Said in ``Degraded`` and once in a Warning Event."""
    problems = validation.repository_path_problems(scope.namespace, scope.body.get("spec") or {})
    if not problems:
        return None
    message = "; ".join(problems)
    await scope.degrade("RepositoryPathOutsideNamespace", message)
    scope.halted = True
    return "waiting for a repository path inside the namespace"


async def remove_backup_cronjob(scope: Scope) -> str | None:
    """Children of backups that are no longer wanted: the CronJob when the schedule is
    cleared, and the backup Jobs' identity (it may exec in the pods) when ``spec.backup``
    is."""
    cluster = scope.cluster
    notes: list[str] = []
    if cluster.spec.backup_schedule is None or cluster.spec.backup is None:
        observed = scope.observed("CronJob", cluster.backup_cronjob_name)
        if observed is not None:
            await scope.kube.delete(Ref.of(observed))
            scope.forget("CronJob", cluster.backup_cronjob_name)
            await scope.event(
                "BackupScheduleRemoved", "backupSchedule was cleared: deleted the CronJob"
            )
            notes.append("deleted the backup CronJob")
    if cluster.spec.backup is None:
        account = cluster.backup_account_name
        for kind in await delete_observed(
            scope, ("RoleBinding", "Role", "ServiceAccount"), account
        ):
            notes.append(f"deleted {kind} {account}")
    return "; ".join(notes) or None


async def check_backup_credentials(scope: Scope) -> str | None:
    """The repository's credentials Secret: PostgreSQL starts without it (the pods mark it
    optional), but WAL archiving and every backup fail, so say so in ``Degraded``."""
    backup_spec = scope.cluster.spec.backup
    key = (scope.namespace, scope.name)
    if backup_spec is None:
        scope.credentials_checked.pop(key, None)
        return None
    # The Secret is the user's, not in the store: read it when the spec changed, while it is
    # missing or incomplete (every UNSATISFIABLE_RECHECK), and otherwise every
    # CREDENTIALS_RECHECK, instead of a GET in every reconcile of every cluster.
    checked = scope.credentials_checked.get(key)
    now = time.monotonic()
    if (
        checked is not None
        and checked[0] == scope.generation
        and now - checked[1] < CREDENTIALS_RECHECK
    ):
        return None
    scope.credentials_checked.pop(key, None)
    s3 = backup_spec.repository.s3
    wanted = [pgbackrest.ACCESS_KEY_KEY, pgbackrest.SECRET_KEY_KEY]
    if s3.ca_key is not None:
        wanted.append(s3.ca_key)
    secret = (scope.namespace, s3.credentials_secret)
    # Many clusters of a namespace name one Secret: a read another cluster made moments ago
    # that found every key this one needs is as good as this cluster's own (a new cluster's
    # first reconcile saved a round trip so). A Secret found lacking is always read again.
    shared = scope.credential_keys.get(secret)
    if shared is not None and now - shared[1] < SHARED_READ_AGE and set(wanted) <= shared[0]:
        scope.credentials_checked[key] = (scope.generation, shared[1])
        return None
    found = await scope.kube.get("v1", "Secret", *secret)
    if found is None:
        scope.credential_keys.pop(secret, None)
        problem = f"Secret {s3.credentials_secret} does not exist in namespace {scope.namespace}"
    else:
        present = frozenset(found.get("data") or {}) | frozenset(found.get("stringData") or {})
        for stale in [
            k for k, (_, at) in scope.credential_keys.items() if now - at >= SHARED_READ_AGE
        ]:
            del scope.credential_keys[stale]  # never used again: the map stays small
        scope.credential_keys[secret] = (present, now)
        missing = [name for name in wanted if name not in present]
        if not missing:
            scope.credentials_checked[key] = (scope.generation, now)
            return None
        problem = f"Secret {s3.credentials_secret} lacks the keys {', '.join(missing)}"
    message = (
        f"spec.backup.repository.s3.credentialsSecret: {problem}; create it with the keys"
        f" {', '.join(wanted)}. Until then WAL archiving and backups fail."
    )
    await scope.degrade(BACKUP_CREDENTIALS_MISSING, message)
    scope.requeue(UNSATISFIABLE_RECHECK)
    return "the backup credentials are missing"


BACKUP_CREDENTIALS_MISSING = "BackupCredentialsMissing"
SHARED_READ_AGE = 30.0
"""Seconds another cluster's read of the same credentials Secret stands for this one's."""
CREDENTIALS_RECHECK = 300.0
"""Seconds a backup credentials Secret found complete is trusted before it is read again."""
LAST_BACKUP = "LastBackupSucceeded"


async def run_backup_request(scope: Scope) -> str | None:
    """A ``stateward.io/backup`` request: one Job per annotation value, followed to its end
    in ``status.onDemandBackup``. Done only when pgBackRest reported the backup."""
    cluster = scope.cluster
    request = (cluster.metadata.get("annotations") or {}).get(v1alpha1.BACKUP_ANNOTATION)
    record = scope.on_demand_backup
    if not request or not isinstance(request, str):
        return None
    if record is not None and record.get("request") == request:
        if record.get("phase") != v1alpha1.SwitchoverPhase.RUNNING.value:
            return None
        return await _follow_backup_request(scope, record)
    if cluster.spec.backup is None:
        message = "no repository to write to: set spec.backup.repository, then request again"
        scope.on_demand_backup = {
            "request": request,
            "phase": v1alpha1.SwitchoverPhase.FAILED.value,
            "startedAt": scope.now,
            "finishedAt": scope.now,
            "message": message,
        }
        await scope.event(
            "BackupRequestRefused", f"Backup request {request!r}: {message}", warning=True
        )
        return "backup request refused: no repository"
    job = backup.on_demand_backup_job(cluster, request, image=scope.backup_image)
    try:
        created = await scope.kube.create(scope.pinned(job))
    except ApiError as error:
        if error.status.code != 409:
            raise
    else:
        scope.store.observe(created)
    name = job["metadata"]["name"]
    scope.on_demand_backup = {
        "request": request,
        "job": name,
        "phase": v1alpha1.SwitchoverPhase.RUNNING.value,
        "startedAt": scope.now,
        "message": f"running in Job {name}",
    }
    await scope.event("BackupRequested", f"Backup requested ({request!r}): running in Job {name}")
    scope.requeue(PROGRESS_RECHECK)
    return f"started requested backup {name}"


async def _follow_backup_request(scope: Scope, record: dict[str, Any]) -> str | None:
    name = str(record.get("job") or "")
    job = scope.observed("Job", name)
    pods = job_pods(scope, name)
    if job is None:
        phase, message = v1alpha1.SwitchoverPhase.FAILED, f"its Job {name} is gone"
    else:
        state = job_state(job)
        report = backups.job_report(pods)
        latest = report.latest
        if state == "Complete" and latest is not None:
            phase = v1alpha1.SwitchoverPhase.SUCCEEDED
            message = f"backup {latest.get('label')} finished at {latest.get('finishedAt')}"
        elif state in ("Complete", "Failed"):
            reason = report.errors[0] if report.errors else None
            phase = v1alpha1.SwitchoverPhase.FAILED
            message = reason or f"Job {name} ended without pgBackRest reporting a backup"
        else:
            scope.requeue(PROGRESS_RECHECK)
            return None
    scope.on_demand_backup = {
        **record,
        "phase": phase.value,
        "finishedAt": scope.now,
        "message": message,
    }
    return f"requested backup {phase.value.lower()}"


async def report_backups(scope: Scope) -> str | None:
    """``status.backups`` and ``LastBackupSucceeded`` from the backup pods' own reports; an
    Event for each backup that finished since the last reconcile."""
    found = backups.outcomes(scope.owned("Pod"))
    scope.backups = backups.backups_status(found, scope.backups)
    if not found:
        return None
    newest = found[-1]
    if newest.succeeded:
        latest = newest.summary.get("latest") or {}
        message = (
            f"{latest.get('type', 'full')} backup {latest.get('label')} finished at"
            f" {latest.get('finishedAt')} (Job {newest.job}); {newest.summary.get('count', 0)}"
            " backups in the repository"
        )
        reason, status = "Succeeded", True
    else:
        message = f"Job {newest.job} failed: {newest.summary.get('error')}"
        reason, status = "Failed", False
    previous = cond.get_condition(scope.conditions, LAST_BACKUP) or {}
    scope.set_condition(LAST_BACKUP, status, reason, message)
    if previous.get("message") == message:
        return None
    await scope.event(f"Backup{reason}", message, warning=not status)
    return f"backup {reason.lower()}: {newest.job}"
