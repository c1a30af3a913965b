"""The PostgresCluster reconciler: an ordered checklist of phases over one cluster.

Every run starts from what is observed now (the store, fed by watches) and moves the world
one safe step toward the spec. Each phase returns a short sentence saying what it did or why
it waited, in the manner of Patroni's HA loop; the sentences are logged and tested. A phase
writes only when the observed state differs from the desired one, so a run over a converged
cluster makes no write at all. Status is computed from observations and written once at the
end, and only if it changed.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, Final

import pydantic
from lightkube import ApiError

from stateward import rfc3339
from stateward.api import v1alpha1, validation
from stateward.api.v1alpha1 import PostgresCluster
from stateward.controllers import certificates, core
from stateward.controllers import conditions as cond
from stateward.controllers.kube import Body, Kube, Ref
from stateward.controllers.postgres import backups, upgrades
from stateward.controllers.postgres.dataplane import DataPlane, start_switchover
from stateward.controllers.postgres.members import QUORUM_STANDBY, SYNC_STANDBY, instances
from stateward.controllers.postgres.scope import (
    Scope,
    delete_patroni_state,
    instance_pods,
    job_pods,
    job_state,
    pod_role,
)
from stateward.controllers.queue import Outcome
from stateward.controllers.store import ObjectStore
from stateward.instance import pgbackrest
from stateward.specs import meta, passwords, pinning
from stateward.specs import postgres as postgres_specs
from stateward.specs.postgres import backup, secrets
from stateward.specs.postgres import config as config_spec
from stateward.specs.postgres import pooler as pooler_spec

logger = logging.getLogger(__name__)

KIND = v1alpha1.KIND
ROLL_RECHECK = 2.0
PROGRESS_RECHECK = 5.0
UNSATISFIABLE_RECHECK = 30.0
FINAL_BACKUP_MAX_DELAY = 300.0
REVISION_LABEL = "controller-revision-hash"


class Reconciler:
    def __init__(
        self,
        kube: Kube,
        store: ObjectStore,
        *,
        foreign_repository_paths: bool = False,
        operator_namespace: str = meta.OPERATOR_NAMESPACE,
        image_pins: pinning.Pins | None = None,
        backup_image: str | None = None,
    ) -> None:
        self.kube = kube
        self.store = store
        self.operator_namespace = operator_namespace
        self.image_pins = dict(image_pins or {})
        self.backup_image = backup_image
        """The operator's own image, which backup Jobs run (None: unknown)."""
        self.foreign_repository_paths = foreign_repository_paths
        """The operator's administrator lets repository paths leave their namespace."""
        self.data_plane = DataPlane()
        self.secret_cache = core.SecretCache()
        self.status_pacer = core.StatusPacer()
        self.credentials_checked: dict[tuple[str, str], tuple[int, float]] = {}
        """Per cluster: the generation whose backup credentials were last found complete,
        and when (monotonic). Freed with the cluster."""
        self.paused_poolers: dict[tuple[str, str], list[str]] = {}
        """Per cluster: the pooler pods paused for a switchover
        (``controllers.postgres.poolers``)."""

    def forget(self, namespace: str, name: str) -> None:
        """Free what is kept in memory for a cluster that is gone (its credentials among it):
        at its DELETED event, not at a reconcile that may never come."""
        self.data_plane.forget((namespace, name))
        self.secret_cache.forget(namespace, name)
        self.status_pacer.forget(namespace, name)
        self.credentials_checked.pop((namespace, name), None)
        self.paused_poolers.pop((namespace, name), None)

    async def reconcile(self, key: tuple[str, str]) -> Outcome:
        namespace, name = key
        body = self.store.get(KIND, namespace, name)
        if body is None:
            self.forget(namespace, name)
            return Outcome()
        try:
            cluster = PostgresCluster.model_validate(body)
        except pydantic.ValidationError as error:
            # Admission refuses invalid specs; this only happens to objects stored before a
            # rule existed. Say so on the object and wait for a new spec.
            logger.warning("%s/%s has an invalid spec: %s", namespace, name, error)
            return Outcome()
        scope = Scope(
            cluster=cluster,
            body=body,
            kube=self.kube,
            store=self.store,
            secrets=self.secret_cache,
            status_pacer=self.status_pacer,
            operator_namespace=self.operator_namespace,
            image_pins=self.image_pins,
            backup_image=self.backup_image,
            credentials_checked=self.credentials_checked,
            paused_poolers=self.paused_poolers,
            now=core.now(),
            conditions=[dict(c) for c in (body.get("status") or {}).get("conditions") or []],
            final_backup_attempts=(body.get("status") or {}).get("finalBackupAttempts"),
            switchover=(body.get("status") or {}).get("switchover"),
            last_failover=(body.get("status") or {}).get("lastFailover"),
            rolling_restart=(body.get("status") or {}).get("rollingRestart"),
            backups=(body.get("status") or {}).get("backups"),
            on_demand_backup=(body.get("status") or {}).get("onDemandBackup"),
            upgrade=(body.get("status") or {}).get("upgrade"),
            version=(body.get("status") or {}).get("version"),
        )
        deleting = bool(body["metadata"].get("deletionTimestamp"))
        paths: list[core.Phase[Scope]] = (
            [] if self.foreign_repository_paths else [check_repository_paths]
        )
        phases: list[core.Phase[Scope]] = (
            [*paths, finalize]
            if deleting
            else [
                *paths,
                ensure_finalizer,
                ensure_tls,
                ensure_secrets,
                check_storage_class,
                check_fencing,
                upgrades.run_upgrade,
                apply_children,
                remove_backup_cronjob,
                remove_pooler,
                check_backup_credentials,
                expand_volumes,
                upgrades.gate,
                self.data_plane.follow_leader_lock,
                self.data_plane.report_failover,
                self.data_plane.apply_configuration,
                self.data_plane.observe_sync,
                self.data_plane.run_switchover,
                roll_pods,
                self.data_plane.restart_pending,
                check_instances,
                run_backup_request,
                report_backups,
            ]
        )
        try:
            for phase in phases:
                note = await phase(scope)
                if note:
                    scope.notes.append(note)
                if scope.halted:
                    break
        except Exception as error:
            ended = core.expected_end(error, v1alpha1.PLURAL, namespace, name)
            if ended is not None:
                return ended
            await _report_failure(scope, error, deleting=deleting)
            raise
        if deleting and FINALIZER_REMOVED in scope.notes:
            logger.info("%s/%s: %s", namespace, name, "; ".join(scope.notes))
            return Outcome()
        await write_status(scope, deleting=deleting)
        if scope.notes:
            logger.info("%s/%s: %s", namespace, name, "; ".join(scope.notes))
        return Outcome(requeue_after=scope.requeue_after)


RECONCILE_FAILED = core.RECONCILE_FAILED
failure_message = core.failure_message
replacing_patch = core.replacing_patch


async def _report_failure(scope: Scope, error: BaseException, *, deleting: bool) -> None:
    await core.report_failure(scope, error, lambda: write_status(scope, deleting=deleting))


# --- phases ----------------------------------------------------------------------------------


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


async def ensure_finalizer(scope: Scope) -> str | None:
    return await core.ensure_finalizer(scope, v1alpha1.FINALIZER)


def _data_volumes(scope: Scope) -> list[Body]:
    return [
        claim
        for claim in scope.owned("PersistentVolumeClaim")
        if (claim["metadata"].get("labels") or {}).get(meta.BACKUP_REPOSITORY_LABEL) != "true"
    ]


async def ensure_tls(scope: Scope) -> str | None:
    return await certificates.ensure(scope, scope.cluster)


async def ensure_secrets(scope: Scope) -> str | None:
    cluster = scope.cluster
    ca_cert = await certificates.ca_cert(scope, cluster)
    if ca_cert is None:
        # No CA yet (the user's, spec.tls.caSecretName, not there yet): nothing else is made
        # either. Instances made now would leave data volumes that the passwords generated
        # afterwards would not open.
        scope.requeue(ROLL_RECHECK)
        scope.halted = True
        return f"waiting for {cluster.ca_secret_name}"

    def app_secret(cluster: PostgresCluster, *, password: str) -> Body:
        return secrets.app_secret(cluster, password=password, ca_cert=ca_cert.encode())

    def fresh(build: Callable[..., Body]) -> Callable[[], Body]:
        return lambda: build(cluster, password=passwords.generate_password())

    outcome = await core.ensure_credentials(
        scope,
        cluster.uid,
        (
            core.Credential(cluster.superuser_secret_name, fresh(secrets.superuser_secret)),
            core.Credential(cluster.replication_secret_name, fresh(secrets.replication_secret)),
            core.Credential(cluster.app_secret_name, fresh(app_secret)),
            # No data depends on it: a cluster made before it existed gets one (its pods then
            # roll onto it), and so does a cluster whose copy was deleted.
            core.Credential(
                cluster.restapi_secret_name, fresh(secrets.restapi_secret), held_by_data=False
            ),
        ),
        _data_volumes(scope),
        kind="cluster",
    )
    if outcome.waiting is not None:
        scope.requeue(ROLL_RECHECK)
        scope.halted = True
        return outcome.waiting
    await certificates.refresh_ca_copy(scope, cluster, cluster.app_secret_name, ca_cert)
    return f"created {', '.join(outcome.made)}" if outcome.made else None


async def check_storage_class(scope: Scope) -> str | None:
    name = scope.cluster.spec.storage_class_name
    if name is None or scope.observed("StatefulSet", scope.cluster.name) is not None:
        return None
    found = await scope.kube.get("storage.k8s.io/v1", "StorageClass", "", name)
    if found is not None:
        return None
    message = (
        f"StorageClass {name!r} (spec.storageClassName) does not exist; create it or recreate"
        " the cluster with an existing class. Checking again every"
        f" {UNSATISFIABLE_RECHECK:.0f}s."
    )
    await scope.degrade("StorageClassNotFound", message)
    scope.requeue(UNSATISFIABLE_RECHECK)
    return "waiting for the storage class"


async def check_fencing(scope: Scope) -> str | None:
    """The fencing request: refused in ``Degraded`` while unreadable (the fencing ConfigMap
    applied last stays as it is), and each change of it told in an Event."""
    cluster = scope.cluster
    try:
        wanted = validation.fenced_instances(cluster.metadata.get("annotations"))
    except ValueError as error:
        message = f"{error}; the instances fenced before stay fenced until it is fixed"
        await scope.degrade("FencingInvalid", message)
        return "the fencing annotation is invalid"
    scope.fenced = wanted
    observed = scope.observed("ConfigMap", cluster.fencing_config_map_name)
    if observed is None:
        return None  # a new cluster, or one made before fencing existed
    try:
        listed = json.loads((observed.get("data") or {}).get("instances") or "[]")
    except ValueError:
        listed = []
    before = {n for n in listed if isinstance(n, str)} if isinstance(listed, list) else set()
    added, removed = sorted(set(wanted) - before), sorted(before - set(wanted))
    if added:
        await scope.event(
            "InstancesFenced",
            f"Fencing {', '.join(added)}: PostgreSQL stops cleanly (a primary hands over to a"
            " synchronous standby first); the pod and its volume stay",
        )
    if removed:
        await scope.event("InstancesUnfenced", f"Unfencing {', '.join(removed)}")
    return None


async def apply_children(scope: Scope) -> str | None:
    """Apply every child whose observed state does not contain the desired one, or that was
    last applied from another desired object (a field we stopped setting is pruned so).

    The applies are independent of each other, so they go out concurrently; one Event names
    everything created and one everything repaired, instead of one Event per object.
    """
    if any(reason == "StorageClassNotFound" for reason, _ in scope.degraded):
        return None
    cluster = _children_cluster(scope)
    desired = postgres_specs.children(
        cluster,
        patroni_config=config_spec.patroni_config(cluster),
        operator_namespace=scope.operator_namespace,
        backup_image=scope.backup_image,
    )
    if cluster.spec.replicas > 0:  # an upgrade stopping the last instance holds nothing
        _hold_scale_down(scope, desired, cluster.spec.replicas)
    return await core.converge(scope, desired)


def _children_cluster(scope: Scope) -> PostgresCluster:
    """The cluster the children are built for: the spec, but for the version and the
    instances a running major upgrade asks for (``controllers.postgres.upgrades``)."""
    update: dict[str, Any] = {}
    if scope.children_version is not None:
        update["version"] = scope.children_version
    if scope.children_replicas is not None:
        update["replicas"] = scope.children_replicas
    if not update:
        return scope.cluster
    spec = scope.cluster.spec.model_copy(update=update)
    return scope.cluster.model_copy(update={"spec": spec})


def _hold_scale_down(scope: Scope, desired: list[Body], wanted: int) -> None:
    leader = next((x for x in scope.members if x.is_primary), None)
    scope.scale_down_to = core.hold_scale_down(
        scope,
        desired,
        wanted=wanted,
        primary=None if leader is None else leader.name,
        pods=instance_pods(scope),
    )


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
        for kind in await _delete_observed(
            scope, ("RoleBinding", "Role", "ServiceAccount"), account
        ):
            notes.append(f"deleted {kind} {account}")
    return "; ".join(notes) or None


async def _delete_observed(scope: Scope, kinds: Iterable[str], name: str) -> list[str]:
    """Delete the children called ``name`` of each of ``kinds`` that the store holds, and
    forget them; the kinds it deleted."""
    deleted = []
    for kind in kinds:
        observed = scope.observed(kind, name)
        if observed is not None:
            await scope.kube.delete(Ref.of(observed))
            scope.forget(kind, name)
            deleted.append(kind)
    return deleted


async def remove_pooler(scope: Scope) -> str | None:
    """The pooler's objects once ``spec.pooler`` is cleared."""
    cluster = scope.cluster
    if cluster.spec.pooler is not None:
        return None
    removed = await _delete_observed(scope, pooler_spec.KINDS, cluster.pooler_name)
    if not removed:
        return None
    await scope.event("PoolerRemoved", f"spec.pooler was cleared: deleted {cluster.pooler_name}")
    return f"deleted the pooler's {', '.join(removed)}"


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
    found = await scope.kube.get("v1", "Secret", scope.namespace, s3.credentials_secret)
    wanted = [pgbackrest.ACCESS_KEY_KEY, pgbackrest.SECRET_KEY_KEY]
    if s3.ca_key is not None:
        wanted.append(s3.ca_key)
    if found is None:
        problem = f"Secret {s3.credentials_secret} does not exist in namespace {scope.namespace}"
    else:
        present = set(found.get("data") or {}) | set(found.get("stringData") or {})
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


async def expand_volumes(scope: Scope) -> str | None:
    return await core.expand_volumes(scope, _data_volumes(scope), scope.cluster.spec.storage_size)


async def roll_pods(scope: Scope) -> str | None:
    """Replace outdated pods one at a time: replicas first, the primary last.

    The StatefulSet uses OnDelete, so a template change touches no pod until this phase
    deletes it. A pod is replaced only while every instance is ready, so at most one
    instance is ever down for an update.
    """
    statefulset = scope.observed("StatefulSet", scope.cluster.name)
    if statefulset is None:
        return None
    status = statefulset.get("status") or {}
    revision = status.get("updateRevision")
    if not revision or status.get("observedGeneration") != statefulset["metadata"].get(
        "generation"
    ):
        return None
    pods = instance_pods(scope)
    outdated = [p for p in pods if p["metadata"].get("labels", {}).get(REVISION_LABEL) != revision]
    if not outdated:
        return None
    scope.progressing.append(
        ("RollingUpdate", f"{len(outdated)} of {len(pods)} instances run an older revision")
    )
    scope.requeue(ROLL_RECHECK)
    unscheduled = sorted((p for p in outdated if _unscheduled(p)), key=_name)
    if unscheduled:
        # Nothing runs in a pod never placed, and the new revision may be what lets it be
        # placed (a placement the nodes could not satisfy): replaced at once, not after
        # every instance is ready — it never would be.
        for pod in unscheduled:
            await scope.kube.delete(Ref.of(pod))
            scope.forget("Pod", _name(pod))
        names = ", ".join(_name(p) for p in unscheduled)
        return f"replaced {names} (never scheduled) on revision {revision}"
    before_tls = [p for p in outdated if _labels(p).get(meta.TLS_LABEL) != meta.TLS_GENERATION]
    if before_tls:
        return await _restart_onto_tls(scope, before_tls, revision)
    everyone_ready = len(pods) == scope.cluster.spec.replicas and all(
        meta.pod_ready(p) or _kept_out_by_older(p, revision) for p in pods
    )
    if not everyone_ready:
        return "rolling update waits for every instance to be ready"
    if scope.switchover is not None and scope.switchover.get("phase") == "Running":
        return "rolling update waits for the switchover"
    outdated.sort(key=lambda p: (pod_role(p) == meta.PRIMARY_ROLE, p["metadata"]["name"]))
    victim = outdated[0]
    if pod_role(victim) == meta.PRIMARY_ROLE and any(x.streaming for x in scope.members):
        # Every replica runs the new revision: hand over to the best of them, and the old
        # primary is replaced as a replica in a later pass.
        return await start_switchover(scope, "RollingUpdate")
    name = victim["metadata"]["name"]
    await scope.kube.delete(Ref.of(victim))
    scope.forget("Pod", name)
    role = pod_role(victim) or "unknown role"
    await scope.event("RollingUpdate", f"Restarting {name} ({role}) on revision {revision}")
    return f"restarted {name} ({role}) for the rolling update"


def _labels(pod: Body) -> dict[str, str]:
    return dict(pod["metadata"].get("labels") or {})


def _name(pod: Body) -> str:
    return str(pod["metadata"]["name"])


async def _restart_onto_tls(scope: Scope, pods: list[Body], revision: str) -> str:
    """Members made before TLS (a cluster of an earlier version) restart together, not one
    by one: a replica with TLS refuses a primary without it, and the old primary's Patroni
    cannot verify the new members, so it refuses the switchover a roll needs — a roll would
    stall with every new replica cut off. Each member stops cleanly (a primary first waits
    for its replicas to receive its last WAL), and the one with the most WAL takes the lock
    when they are back: a short pause in writes, no data at risk. Done without waiting for
    readiness, so a roll an earlier operator started and stalled finishes too."""
    names = sorted(p["metadata"]["name"] for p in pods)
    for pod in pods:
        await scope.kube.delete(Ref.of(pod))
        scope.forget("Pod", pod["metadata"]["name"])
    await scope.event(
        "RestartingOntoTLS",
        f"Restarting {', '.join(names)} together on revision {revision}: members with and"
        " without TLS cannot work together, so this cluster of an earlier version is not"
        " rolled one by one; writes pause until a primary is back",
    )
    return f"restarted {', '.join(names)} together onto TLS"


# --- deletion --------------------------------------------------------------------------------

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
        for claim in _data_volumes(scope):
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


WAITING_PROBLEMS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "CrashLoopBackOff",
    }
)
"""Container waiting reasons that do not resolve by waiting a little longer."""


def pod_problem(pod: Body) -> str | None:
    """Why a pod is not running, when the reason is one a user must act on: it cannot be
    scheduled (resources, affinity, a volume), or its image cannot be pulled, or its
    container cannot be created or keeps crashing."""
    status = pod.get("status") or {}
    if (condition := _unscheduled(pod)) is not None:
        reason = condition.get("reason") or "Unschedulable"
        return f"pod {pod['metadata']['name']} {reason}: {condition.get('message', '')}"
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in WAITING_PROBLEMS:
            return (
                f"pod {pod['metadata']['name']} {waiting['reason']}:"
                f" {waiting.get('message') or 'no message'}"
            )
    return None


def _unscheduled(pod: Body) -> Body | None:
    """The pod's PodScheduled condition while the scheduler cannot place it."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return dict(condition)
    return None


def _kept_apart(pod: Body) -> bool:
    """Whether the scheduler could not place the pod because of the instances' pod
    anti-affinity (its message counts the nodes that "didn't match pod anti-affinity rules")."""
    condition = _unscheduled(pod)
    return condition is not None and "anti-affinity" in str(condition.get("message") or "")


EXISTING_ANTI_AFFINITY: Final = "didn't satisfy existing pods anti-affinity rules"
"""The scheduler's words for a node refused by the anti-affinity of the pods already on it."""


def _kept_out_by_older(pod: Body, revision: str) -> bool:
    """A pod of the current revision that never ran because the instances of the older one
    keep it out (their required anti-affinity, after ``spec.placement`` was relaxed): it
    does not hold the roll, which is what makes room for it."""
    condition = _unscheduled(pod)
    return (
        condition is not None
        and _labels(pod).get(REVISION_LABEL) == revision
        and EXISTING_ANTI_AFFINITY in str(condition.get("message") or "")
    )


def _not_enough_nodes(cluster: v1alpha1.PostgresCluster, pods: list[Body]) -> str:
    placement = cluster.spec.placement
    names = ", ".join(sorted(p["metadata"]["name"] for p in pods))
    said = str((_unscheduled(pods[0]) or {}).get("message") or "").strip()
    return (
        f"{names} cannot be placed: spec.placement.antiAffinity is Required, so each of the"
        f" {cluster.spec.replicas} instances needs a {placement.topology_key} of its own and"
        f" the scheduler found none left ({said}). Add nodes, lower spec.replicas, or set"
        " spec.placement.antiAffinity: Preferred to let instances share a node (one node"
        " failing may then take the primary and its standby together)"
    )


IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName"})


async def check_instances(scope: Scope) -> str | None:
    """Instances that cannot run, and why, in ``Degraded``: an image the nodes do not have
    (``ImageUnavailable``, naming the image and how to get it), a pod that cannot be
    scheduled, a container that cannot be created or keeps crashing (``InstancesNotRunning``)."""
    problems = [(pod, p) for pod in instance_pods(scope) if (p := pod_problem(pod))]
    if not problems:
        return None
    pulls = [
        pod
        for pod, _ in problems
        if any(
            ((c.get("state") or {}).get("waiting") or {}).get("reason") in IMAGE_PULL_REASONS
            for c in (pod.get("status") or {}).get("containerStatuses") or []
        )
    ]
    if pulls:
        image = scope.cluster.image
        reason = "ImageUnavailable"
        where = (
            f"image {image} cannot be pulled by {', '.join(p['metadata']['name'] for p in pulls)}"
        )
        message = (
            f"{where} (spec.image): push it to a registry the nodes can reach, or fix spec.image"
            if scope.cluster.spec.image
            else f"{where}: on Stateward's local cluster `stateward local build` builds the images"
            " of PostgreSQL 15 and 17; elsewhere push the image to a registry the nodes can"
            " reach, or set spec.image"
        )
    elif (unplaced := [pod for pod, _ in problems if _kept_apart(pod)]) and (
        scope.cluster.spec.placement.anti_affinity == v1alpha1.AntiAffinity.REQUIRED
    ):
        reason = "NotEnoughNodes"
        message = _not_enough_nodes(scope.cluster, unplaced)
    else:
        reason = "InstancesNotRunning"
        message = "; ".join(problem for _, problem in problems)
    await scope.degrade(reason, message)
    scope.requeue(UNSATISFIABLE_RECHECK)  # pod changes arrive by watch; this is a backstop
    return f"instances cannot run: {reason}"


# --- status ----------------------------------------------------------------------------------


def _count_progress(scope: Scope, statefulset: Body | None, ready: int) -> None:
    spec = scope.cluster.spec
    sts_status = (statefulset or {}).get("status") or {}
    if statefulset is not None and int(sts_status.get("replicas") or 0) != spec.replicas:
        scope.progressing.append(
            ("Scaling", f"{sts_status.get('replicas', 0)} of {spec.replicas} instances exist")
        )
    if ready < spec.replicas:
        scope.progressing.append(
            ("InstancesStarting", f"{ready} of {spec.replicas} instances ready")
        )
        scope.requeue(PROGRESS_RECHECK)


def _ready_condition(scope: Scope, ready: int, primaries: list[str], replicas: list[str]) -> bool:
    """Ready means every instance is ready and has taken its role: one primary accepting
    writes, the rest replicas that stream from it (Patroni labels a member once it runs as
    one or the other, and records whether it streams)."""
    wanted = scope.cluster.spec.replicas
    behind = sorted(
        x.name
        for x in scope.members
        if x.label_role == meta.REPLICA_ROLE and x.replication_state not in (None, "streaming")
    )
    fenced = sorted(x.name for x in scope.members if _is_fenced(scope, x.name))
    is_ready = (
        ready == wanted
        and len(primaries) == 1
        and len(replicas) == wanted - 1
        and not behind
        and not fenced
    )
    if fenced:
        scope.set_condition(
            "Ready",
            False,
            "InstancesFenced",
            f"fenced: {', '.join(fenced)} ({v1alpha1.FENCED_INSTANCES_ANNOTATION});"
            f" `kubectl stateward unfence {scope.cluster.name} POD` brings one back",
        )
    elif is_ready:
        scope.set_condition(
            "Ready", True, "AllInstancesReady", f"{ready}/{wanted} ready, primary {primaries[0]}"
        )
    elif not primaries:
        scope.set_condition(
            "Ready", False, "NoPrimary", f"{ready}/{wanted} ready, no primary elected yet"
        )
    elif behind:
        scope.set_condition(
            "Ready", False, "ReplicasNotStreaming", f"not streaming yet: {', '.join(behind)}"
        )
        scope.requeue(PROGRESS_RECHECK)
    elif ready == wanted:
        scope.set_condition(
            "Ready",
            False,
            "RolesPending",
            f"{ready}/{wanted} ready, {len(replicas)} of {wanted - 1} replicas"
            " have joined as replicas",
        )
        scope.requeue(PROGRESS_RECHECK)
    else:
        scope.set_condition("Ready", False, "InstancesNotReady", f"{ready}/{wanted} ready")
    return is_ready


def _backup_condition(scope: Scope, cronjob: Body | None) -> None:
    schedule = scope.cluster.spec.backup_schedule
    if schedule is None:
        scope.set_condition(
            "BackupScheduled", False, "NotConfigured", "spec.backupSchedule is not set"
        )
    elif cronjob is None:
        scope.set_condition(
            "BackupScheduled", False, "Pending", "the backup CronJob is not created yet"
        )
    else:
        scope.set_condition(
            "BackupScheduled", True, "Scheduled", f"backups run on {schedule!r} (UTC)"
        )


def _phase(scope: Scope, *, deleting: bool, is_ready: bool) -> v1alpha1.Phase:
    previous = (scope.body.get("status") or {}).get("phase")
    if deleting:
        return v1alpha1.Phase.DELETING
    if scope.degraded:
        return v1alpha1.Phase.FAILING
    if is_ready and not scope.progressing:
        return v1alpha1.Phase.READY
    if previous in (v1alpha1.Phase.READY.value, v1alpha1.Phase.UPDATING.value):
        return v1alpha1.Phase.UPDATING
    return v1alpha1.Phase.CREATING


async def write_status(scope: Scope, *, deleting: bool) -> None:
    """Compute the status from observations (one small function per part) and patch it once,
    only if it changed."""
    cluster = scope.cluster
    statefulset = scope.observed("StatefulSet", cluster.name)
    ready = int(((statefulset or {}).get("status") or {}).get("readyReplicas") or 0)
    pods = instance_pods(scope)
    primaries = sorted(p["metadata"]["name"] for p in pods if pod_role(p) == meta.PRIMARY_ROLE)
    replicas = sorted(p["metadata"]["name"] for p in pods if pod_role(p) == meta.REPLICA_ROLE)
    _count_progress(scope, statefulset, ready)
    is_ready = _ready_condition(scope, ready, primaries, replicas)
    scope.summarize("the cluster matches its spec")
    cronjob = scope.observed("CronJob", cluster.backup_cronjob_name)
    _backup_condition(scope, cronjob)

    current = dict(scope.body.get("status") or {})
    instances = members_status(scope)
    status: dict[str, Any] = {
        "phase": _phase(scope, deleting=deleting, is_ready=is_ready).value,
        "primaryPod": primaries[0] if len(primaries) == 1 else None,
        "replicaPods": replicas,
        "readyReplicas": ready,
        "conditions": scope.conditions,
        "lastBackupTime": ((scope.backups or {}).get("latest") or {}).get("finishedAt")
        or current.get("lastBackupTime"),
        "backups": scope.backups,
        "onDemandBackup": scope.on_demand_backup,
        "observedGeneration": cluster.generation,
        "finalBackupAttempts": scope.final_backup_attempts,
        "pendingRestart": sorted(x.name for x in scope.members if x.pending_restart) or None,
        "instances": instances or None,
        "switchover": scope.switchover,
        "lastFailover": scope.last_failover,
        "rollingRestart": scope.rolling_restart,
        "pooler": pooler_status(scope),
        "version": upgrades.status_version(scope),
        "upgrade": scope.upgrade,
    }
    await core.patch_status(scope, status)


def pooler_status(scope: Scope) -> dict[str, Any] | None:
    """``status.pooler``: where to connect and how many PgBouncer pods serve, as the
    Deployment reports them."""
    cluster = scope.cluster
    wanted = cluster.spec.pooler
    if wanted is None:
        return None
    deployment = scope.observed("Deployment", cluster.pooler_name)
    ready = int(((deployment or {}).get("status") or {}).get("readyReplicas") or 0)
    return {
        "host": cluster.pooler_host,
        "instances": wanted.instances,
        "readyInstances": ready,
        "poolMode": wanted.pool_mode.value,
    }


def members_status(scope: Scope) -> list[dict[str, Any]]:
    """``status.instances``, only for pods Patroni has a record of (simulated nodes run no
    Patroni, and an instance the operator knows nothing about is not reported as anything)."""
    known = [x for x in scope.members if x.state is not None]
    quorum = scope.cluster.spec.synchronous.method == v1alpha1.SynchronousMethod.QUORUM
    result = instances(known, scope.sync, sync_role=QUORUM_STANDBY if quorum else SYNC_STANDBY)
    for entry in result:
        if _is_fenced(scope, entry["name"]):
            entry["fenced"] = True
            if not next(x.ready for x in known if x.name == entry["name"]):
                entry["state"] = "fenced"
    return result


def _is_fenced(scope: Scope, pod: str) -> bool:
    return validation.FENCE_ALL in scope.fenced or pod in scope.fenced
