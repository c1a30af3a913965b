"""The PostgresCluster's deletion: the finalizer's phase, and the final backup it waits for.

A cluster being deleted runs only ``finalize`` (after the repository paths are checked):
the final backup, when the spec asks for one, is taken to success first, with a growing
delay between attempts; then the instances stop, their volumes go if the deletion policy
says so, Patroni's state goes, and the finalizer is removed. Kept apart from the phases
that converge a living cluster, and knowing nothing of the reconciler that runs it.
"""

from __future__ import annotations

from lightkube import ApiError

from stateward import rfc3339
from stateward.api import v1alpha1
from stateward.controllers import conditions as cond
from stateward.controllers import core
from stateward.controllers.kube import Body, Ref
from stateward.controllers.postgres import backups
from stateward.controllers.postgres.scope import (
    PROGRESS_RECHECK,
    ROLL_RECHECK,
    Scope,
    data_volumes,
    delete_patroni_state,
    job_pods,
    job_state,
)
from stateward.controllers.postgres.status import pod_problem
from stateward.specs import meta
from stateward.specs.postgres import backup

FINAL_BACKUP_MAX_DELAY = 300.0
"""The longest wait, in seconds, between two attempts of the final backup."""
FINALIZER_REMOVED = "removed the finalizer"


async def finalize(scope: Scope) -> str | None:
    if v1alpha1.FINALIZER not in (scope.body["metadata"].get("finalizers") or []):
        return None
    cluster = scope.cluster
    if cluster.spec.takes_final_backup:
        waiting = await _final_backup(scope)
        if waiting:
            return waiting
    # The instances stop before their volumes and Patroni's state go: a Patroni still
    # running (its pod terminating) writes its leader and config ConfigMaps again, and a
    # cluster made next under this name found them — an initialized cluster led by a member
    # of its own name — and never bootstrapped (found by the restore story).
    statefulset = scope.observed("StatefulSet", cluster.name)
    if statefulset is not None and not statefulset["metadata"].get("deletionTimestamp"):
        await scope.kube.delete(Ref.of(statefulset))
    # Not past a pod's deadline, though: one on a lost node never finishes terminating, and
    # its Patroni, cut off, writes nothing.
    running = sorted(
        pod["metadata"]["name"]
        for pod in scope.owned("Pod")
        if (pod["metadata"].get("labels") or {}).get(meta.COMPONENT_LABEL)
        == meta.INSTANCE_COMPONENT
        and not _overdue(pod)
    )
    if running:
        scope.requeue(ROLL_RECHECK)
        return f"waiting for the instances {', '.join(running)} to stop"
    removed: list[str] = []
    if cluster.spec.deletion_policy.persistent_volume_claims == v1alpha1.PVCPolicy.DELETE:
        for claim in data_volumes(scope):
            if not claim["metadata"].get("deletionTimestamp"):
                await scope.kube.delete(Ref.of(claim))
                removed.append(claim["metadata"]["name"])
        if removed:
            await scope.event("VolumesDeleted", f"Deleted data volumes {', '.join(removed)}")
    await delete_patroni_state(scope)
    await core.remove_finalizer(scope, v1alpha1.FINALIZER)
    return FINALIZER_REMOVED


STOP_OVERDUE = 30.0
"""Seconds past its deletion deadline after which a terminating pod is taken as lost."""


def _overdue(pod: Body) -> bool:
    deadline = pod["metadata"].get("deletionTimestamp")
    return bool(deadline) and rfc3339.seconds_since(deadline) > STOP_OVERDUE


async def _final_backup(scope: Scope) -> str | None:
    """Run the final backup Job to success; None once it has succeeded."""
    cluster = scope.cluster
    job = scope.observed("Job", cluster.final_backup_job_name)
    state = job_state(job) if job is not None else None
    previous = cond.get_condition(scope.conditions, "FinalBackup")
    # The count lives in status.finalBackupAttempts, a machine field, so a restarted operator
    # continues the same backoff whatever the condition's message says.
    attempts = scope.final_backup_attempts or 0
    delay = min(FINAL_BACKUP_MAX_DELAY, 5.0 * 2 ** max(attempts - 1, 0))
    pods = job_pods(scope, cluster.final_backup_job_name)
    report = backups.job_report(pods)
    reported = report.latest is not None
    unreported = state == "Complete" and not reported
    if unreported:
        # A Job whose pod ended well without pgBackRest's report took no backup we know of
        # (a simulated node completes any pod): deleting the data on its word could lose it.
        state = "Failed"
    if state == "Complete":
        if previous is None or previous.get("reason") != "Succeeded":
            scope.set_condition("FinalBackup", True, "Succeeded", f"attempt {attempts} succeeded")
            await scope.event(
                "FinalBackupSucceeded",
                f"Final backup Job {cluster.final_backup_job_name} succeeded",
            )
        return None
    if job is not None and state == "Failed":
        reason = report.errors[0] if report.errors else None
        if unreported:
            reason = "its pod completed but pgBackRest reported no backup"
        message = (
            f"attempt {attempts} failed{f': {reason}' if reason else ''}; retrying in"
            f" {delay:.0f}s. The cluster stays until a final backup succeeds; set"
            " spec.deletionPolicy.finalBackup=false to delete it without one."
        )
        scope.set_condition("FinalBackup", False, "Failed", message)
        await scope.event("FinalBackupFailed", f"Final backup {message}", warning=True)
        await scope.kube.delete(Ref.of(job))
        scope.forget("Job", cluster.final_backup_job_name)
        scope.requeue(delay)
        return f"final backup attempt {attempts} failed"
    if job is None:
        if previous is not None and previous.get("reason") == "Failed":
            wait = delay - rfc3339.seconds_since(previous["lastTransitionTime"])
            if wait > 0:
                scope.requeue(wait)
                return f"final backup retry in {wait:.0f}s"
        try:
            final = backup.final_backup_job(cluster, image=scope.backup_image)
            created = await scope.kube.create(scope.pinned(final))
        except ApiError as error:
            if error.status.code == 403 and "being terminated" in (error.status.message or ""):
                # The namespace is going: nothing new can start in it, and the namespace
                # controller deletes the pods and volumes whatever this finalizer does, so
                # holding it would only keep the namespace Terminating forever.
                await scope.event(
                    "FinalBackupImpossible",
                    f"namespace {scope.namespace} is being deleted with the cluster's pods and"
                    " volumes, so no final backup could be taken; the backups already in the"
                    " repository stay",
                    warning=True,
                )
                return None
            if error.status.code != 409:
                raise
        else:
            scope.store.observe(created)
        attempts += 1
        scope.final_backup_attempts = attempts
        scope.set_condition(
            "FinalBackup",
            None,
            "Running",
            f"attempt {attempts} running in Job {cluster.final_backup_job_name};"
            " deletion waits for it",
        )
        await scope.event(
            "FinalBackupStarted",
            f"Final backup attempt {attempts} started (Job {cluster.final_backup_job_name})",
        )
        scope.requeue(PROGRESS_RECHECK)
        return f"started final backup attempt {attempts}"
    scope.requeue(PROGRESS_RECHECK)
    failed = report.errors
    problem = next((p for pod in pods if (p := pod_problem(pod))), None)
    if failed:
        # The Job retries its pod (backoffLimit) before it fails: say at once why, and how
        # to go without the backup, instead of after every retry has failed too.
        reason, event = "PodFailed", "FinalBackupPodFailed"
        message = (
            f"attempt {attempts}: a backup pod failed ({failed[0]}); Job"
            f" {cluster.final_backup_job_name} retries it"
        )
    elif problem is not None:
        reason, event = "PodNotRunning", "FinalBackupStuck"
        message = (
            f"attempt {attempts} in Job {cluster.final_backup_job_name} cannot run: {problem}."
            f" It fails after {backup.FINAL_DEADLINE_SECONDS}s and is retried"
        )
    else:
        return "waiting for the final backup"
    message += "; to delete without a final backup, set spec.deletionPolicy.finalBackup=false"
    if (previous or {}).get("message") != message:
        await scope.event(event, f"Final backup {message}", warning=True)
    scope.set_condition("FinalBackup", None, reason, message)
    return f"final backup: {reason}"
