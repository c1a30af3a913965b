"""The PostgresCluster reconciler: an ordered checklist of phases over one cluster.

Every run starts from what is observed now (the store, fed by watches) and moves the world
one safe step toward the spec. Each phase returns a short sentence saying what it did or why
it waited, in the manner of Patroni's HA loop; the sentences are logged and tested. A phase
writes only when the observed state differs from the desired one, so a run over a converged
cluster makes no write at all. Status is computed from observations and written once at the
end, and only if it changed.

This module holds the checklist and the phases that converge the cluster's own objects
(finalizer, TLS, credentials, children, volumes, the roll of its pods). The backup phases
are in ``backup_phases``, deletion in ``deletion``, the instances' diagnosis and the status
in ``status``; they import nothing from here, so the checklist stays the one place that
says in which order everything runs.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any, Final

import pydantic

from stateward.api import v1alpha1, validation
from stateward.api.v1alpha1 import PostgresCluster
from stateward.controllers import certificates, core
from stateward.controllers.kube import Body, Kube, Ref
from stateward.controllers.postgres import upgrades
from stateward.controllers.postgres.backup_phases import (
    check_backup_credentials,
    check_repository_paths,
    remove_backup_cronjob,
    report_backups,
    run_backup_request,
)
from stateward.controllers.postgres.dataplane import DataPlane, start_switchover
from stateward.controllers.postgres.deletion import FINALIZER_REMOVED, finalize
from stateward.controllers.postgres.scope import (
    ROLL_RECHECK,
    UNSATISFIABLE_RECHECK,
    PatroniConfigs,
    Scope,
    data_volumes,
    delete_observed,
    instance_pods,
    pod_role,
)
from stateward.controllers.postgres.status import check_instances, unscheduled, write_status
from stateward.controllers.queue import Outcome
from stateward.controllers.store import ObjectStore
from stateward.specs import meta, passwords, pinning
from stateward.specs import postgres as postgres_specs
from stateward.specs.postgres import pooler as pooler_spec
from stateward.specs.postgres import secrets

logger = logging.getLogger(__name__)

KIND = v1alpha1.KIND
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
        self.credential_keys: dict[tuple[str, str], tuple[frozenset[str], float]] = {}
        """Per backup credentials Secret (namespace, name): the names of its keys (never a
        value) when last read, and when (monotonic); clusters that share it share the read."""
        self.credentials_checked: dict[tuple[str, str], tuple[int, float]] = {}
        """Per cluster: the generation whose backup credentials were last found complete,
        and when (monotonic). Freed with the cluster."""
        self.paused_poolers: dict[tuple[str, str], list[str]] = {}
        """Per cluster: the pooler pods paused for a switchover
        (``controllers.postgres.poolers``)."""
        self.patroni_configs = PatroniConfigs()

    def forget(self, namespace: str, name: str) -> None:
        """Free what is kept in memory for a cluster that is gone (its credentials among it):
        at its DELETED event, not at a reconcile that may never come."""
        self.data_plane.forget((namespace, name))
        self.secret_cache.forget(namespace, name)
        self.status_pacer.forget(namespace, name)
        self.credentials_checked.pop((namespace, name), None)
        self.paused_poolers.pop((namespace, name), None)
        self.patroni_configs.forget(namespace, name)

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
            credential_keys=self.credential_keys,
            paused_poolers=self.paused_poolers,
            patroni_configs=self.patroni_configs,
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
            await scope.settle()
        except Exception as error:
            await scope.abandon()
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


async def ensure_finalizer(scope: Scope) -> str | None:
    return await core.ensure_finalizer(scope, v1alpha1.FINALIZER)


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
        data_volumes(scope),
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
        patroni_config=scope.patroni_configs.of(cluster),
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


async def remove_pooler(scope: Scope) -> str | None:
    """The pooler's objects once ``spec.pooler`` is cleared."""
    cluster = scope.cluster
    if cluster.spec.pooler is not None:
        return None
    removed = await delete_observed(scope, pooler_spec.KINDS, cluster.pooler_name)
    if not removed:
        return None
    await scope.event("PoolerRemoved", f"spec.pooler was cleared: deleted {cluster.pooler_name}")
    return f"deleted the pooler's {', '.join(removed)}"


async def expand_volumes(scope: Scope) -> str | None:
    return await core.expand_volumes(scope, data_volumes(scope), scope.cluster.spec.storage_size)


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
    never_scheduled = sorted((p for p in outdated if unscheduled(p)), key=_name)
    if never_scheduled:
        # Nothing runs in a pod never placed, and the new revision may be what lets it be
        # placed (a placement the nodes could not satisfy): replaced at once, not after
        # every instance is ready — it never would be.
        for pod in never_scheduled:
            await scope.kube.delete(Ref.of(pod))
            scope.forget("Pod", _name(pod))
        names = ", ".join(_name(p) for p in never_scheduled)
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


EXISTING_ANTI_AFFINITY: Final = "didn't satisfy existing pods anti-affinity rules"
"""The scheduler's words for a node refused by the anti-affinity of the pods already on it."""


def _kept_out_by_older(pod: Body, revision: str) -> bool:
    """A pod of the current revision that never ran because the instances of the older one
    keep it out (their required anti-affinity, after ``spec.placement`` was relaxed): it
    does not hold the roll, which is what makes room for it."""
    condition = unscheduled(pod)
    return (
        condition is not None
        and _labels(pod).get(REVISION_LABEL) == revision
        and EXISTING_ANTI_AFFINITY in str(condition.get("message") or "")
    )


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
