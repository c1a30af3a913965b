"""The Database reconciler: the same core as PostgresCluster's (``controllers.core``), with
phases per engine.

* ``postgres``: the Database owns a PostgresCluster of its name (``specs.database``) and
  reports that cluster's state as its own; the PostgresCluster reconciler runs the data plane.
* ``mysql`` and ``mariadb``: the Database owns the servers' StatefulSet, Services,
  configuration and credentials (``specs.mariadb.servers``), and drives replication over SQL
  (``controllers.mariadb``: its phases, its failover decision and its SQL client).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import pydantic

from stateward.api import v1alpha1
from stateward.api.v1alpha1 import Database, DatabasePhase, Engine
from stateward.controllers import core
from stateward.controllers.dbscope import Scope, Stop, data_volumes
from stateward.controllers.kube import Kube, Ref
from stateward.controllers.mariadb import reconcile as mariadb
from stateward.controllers.mariadb import sql
from stateward.controllers.queue import Outcome
from stateward.controllers.store import ObjectStore
from stateward.specs import database as database_spec
from stateward.specs import meta, pinning

logger = logging.getLogger(__name__)

FINALIZER = v1alpha1.FINALIZER
DELETE_RECHECK = 2.0
UNSATISFIABLE_RECHECK = 30.0


class DatabaseReconciler:
    def __init__(
        self,
        kube: Kube,
        store: ObjectStore,
        *,
        clock: Callable[[], float] = time.monotonic,
        leadership: Callable[[], float] = sql.always_leader,
        operator_namespace: str = meta.OPERATOR_NAMESPACE,
        image_pins: pinning.Pins | None = None,
    ) -> None:
        self.kube = kube
        self.store = store
        self.operator_namespace = operator_namespace
        self.image_pins = dict(image_pins or {})
        self.secret_cache = core.SecretCache()
        self.status_pacer = core.StatusPacer()
        self.servers = mariadb.Servers(clock=clock, leadership=leadership)
        """MySQL and MariaDB: what their phases keep between reconciles."""

    def forget(self, namespace: str, name: str) -> None:
        """Free what is kept in memory for a Database that is gone (its credentials)."""
        self.secret_cache.forget(namespace, name)
        self.status_pacer.forget(namespace, name)
        self.servers.forget(namespace, name)

    async def reconcile(self, key: tuple[str, str]) -> Outcome:
        namespace, name = key
        body = self.store.get(v1alpha1.DATABASE_KIND, namespace, name)
        if body is None:
            self.forget(namespace, name)
            return Outcome()
        try:
            database = Database.model_validate(body)
        except pydantic.ValidationError as error:
            logger.warning("%s/%s has an invalid spec: %s", namespace, name, error)
            return Outcome()
        status = body.get("status") or {}
        key = (namespace, name)
        scope = Scope(
            database=database,
            body=body,
            kube=self.kube,
            secrets=self.secret_cache,
            status_pacer=self.status_pacer,
            operator_namespace=self.operator_namespace,
            image_pins=self.image_pins,
            store=self.store,
            now=core.now(),
            conditions=[dict(c) for c in status.get("conditions") or []],
            # MariaDB/MySQL: the operator decides the primary (a postgres Database's is
            # Patroni's, read from its PostgresCluster).
            primary=(None if database.spec.engine is Engine.POSTGRES else self.servers.primary(key))
            or status.get("primaryPod"),
            last_failover=status.get("lastFailover"),
            diverged=[dict(v) for v in status.get("divergedVolumes") or []],
        )
        deleting = bool(body["metadata"].get("deletionTimestamp"))
        try:
            for phase in self._phases(database.spec.engine, deleting=deleting):
                note = await phase(scope)
                if note:
                    scope.notes.append(note)
                if note == FINALIZER_REMOVED:
                    logger.info("%s/%s: %s", namespace, name, "; ".join(scope.notes))
                    return Outcome()
            await scope.settle()
        except Stop as stop:
            await scope.abandon()  # a failed one is made again by the next reconcile
            scope.notes.append(str(stop))
            scope.requeue(UNSATISFIABLE_RECHECK)
        except Exception as error:
            await scope.abandon()
            self._remember_primary(key, scope)
            ended = core.expected_end(error, v1alpha1.DATABASE_PLURAL, namespace, name)
            if ended is not None:
                return ended
            await core.report_failure(scope, error, lambda: write_status(scope, deleting=deleting))
            raise
        self._remember_primary(key, scope)
        await write_status(scope, deleting=deleting)
        if scope.notes:
            logger.info("%s/%s: %s", namespace, name, "; ".join(scope.notes))
        return Outcome(requeue_after=scope.requeue_after)

    def _remember_primary(self, key: tuple[str, str], scope: Scope) -> None:
        if scope.database.spec.engine is not Engine.POSTGRES:
            self.servers.remember_primary(key, scope)

    def _phases(self, engine: Engine, *, deleting: bool) -> list[core.Phase[Scope]]:
        if deleting:
            return [finalize]
        if engine is Engine.POSTGRES:
            return [ensure_finalizer, check_name, apply_postgres_cluster]
        return [ensure_finalizer, check_name, *self.servers.phases(engine)]


FINALIZER_REMOVED = "removed the finalizer"


# --- phases ------------------------------------------------------------------------------------


async def ensure_finalizer(scope: Scope) -> str | None:
    return await core.ensure_finalizer(scope, FINALIZER)


def _main_child(scope: Scope) -> tuple[str, str, str]:
    """The child that holds the data: its apiVersion, kind and name."""
    if scope.database.spec.engine is Engine.POSTGRES:
        return v1alpha1.API_VERSION, v1alpha1.KIND, scope.name
    return "apps/v1", "StatefulSet", scope.name


async def check_name(scope: Scope) -> str | None:
    """The Database's children take its name; one that exists and belongs to another owner
    (a PostgresCluster a user created, say) is never taken over."""
    api_version, kind, name = _main_child(scope)
    observed = scope.observed(kind, name)
    if observed is None:
        # Not seen yet is not absent: a PostgresCluster created just before this Database
        # may not have come through its watch yet, and the next phase's apply would take it
        # over (an apply creates or updates). So ask the API server, once per reconcile
        # until the child is seen. (A child created by someone else in the milliseconds
        # between this read and the apply is the one window left.)
        observed = await scope.kube.get(api_version, kind, scope.namespace, name)
        if observed is None:
            return None
        scope.observe({**observed, "apiVersion": api_version, "kind": kind})
    owners = [r for r in observed["metadata"].get("ownerReferences") or [] if r.get("controller")]
    if any(r.get("uid") == scope.database.uid for r in owners):
        return None
    message = (
        f"a {kind} named {name} already exists and does not belong to this Database;"
        " rename the Database (or the other object)"
    )
    await scope.degrade("NameTaken", message)
    raise Stop(message)


async def apply_postgres_cluster(scope: Scope) -> str | None:
    return await core.converge(scope, [database_spec.postgres_cluster(scope.database)])


async def finalize(scope: Scope) -> str | None:
    """Delete what holds the data — the PostgresCluster (its own finalizer deletes its
    volumes), or the StatefulSet and then its volumes — and let the Database go only when
    nothing of it is left."""
    if FINALIZER not in (scope.body["metadata"].get("finalizers") or []):
        return None
    _, kind, name = _main_child(scope)
    child = scope.observed(kind, name)
    owned = child is not None and any(
        r.get("uid") == scope.database.uid for r in child["metadata"].get("ownerReferences") or []
    )
    if owned and child is not None:
        if not child["metadata"].get("deletionTimestamp"):
            await scope.kube.delete(Ref.of(child))
            await scope.event("Deleting", f"Deleting {kind} {name}")
        scope.requeue(DELETE_RECHECK)
        return f"waiting for {kind} {name} to go"
    claims = data_volumes(scope)
    for claim in claims:
        if not claim["metadata"].get("deletionTimestamp"):
            await scope.kube.delete(Ref.of(claim))
    if claims:
        scope.requeue(DELETE_RECHECK)
        return f"waiting for the volumes {', '.join(c['metadata']['name'] for c in claims)}"
    await core.remove_finalizer(scope, FINALIZER)
    return FINALIZER_REMOVED


# --- status ------------------------------------------------------------------------------------


async def write_status(scope: Scope, *, deleting: bool) -> None:
    if scope.database.spec.engine is Engine.POSTGRES:
        status = _postgres_status(scope, deleting=deleting)
    else:
        status = mariadb.servers_status(scope, deleting=deleting)
    await core.patch_status(scope, status)


def _postgres_status(scope: Scope, *, deleting: bool) -> dict[str, Any]:
    """The PostgresCluster's state as the Database's: its phase mapped, its Ready, Progressing
    and Degraded conditions taken over (a Degraded of our own comes first)."""
    cluster = scope.observed(v1alpha1.KIND, scope.name) or {}
    mine = (cluster.get("metadata") or {}).get("ownerReferences") or []
    if not any(r.get("uid") == scope.database.uid for r in mine):
        cluster = {}
    status = cluster.get("status") or {}
    theirs = {c["type"]: c for c in status.get("conditions") or []}
    for kind in ("Ready", "Progressing", "Degraded"):
        condition = theirs.get(kind)
        if kind == "Degraded" and scope.degraded:
            continue
        if condition is not None:
            scope.set_condition(
                kind,
                {"True": True, "False": False}.get(condition.get("status", "")),
                condition.get("reason", "Unknown"),
                condition.get("message", ""),
            )
    if scope.degraded:
        reason, message = scope.degraded[0]
        scope.set_condition("Degraded", True, reason, message)
    if not theirs.get("Ready"):
        scope.set_condition("Ready", False, "Creating", f"PostgresCluster {scope.name} is starting")
    phase = DatabasePhase.DELETING if deleting else database_spec.phase_of(status.get("phase"))
    if scope.degraded and phase is DatabasePhase.PENDING:
        phase = DatabasePhase.FAILED
    return {
        "phase": phase.value,
        "readyReplicas": int(status.get("readyReplicas") or 0),
        "primaryPod": status.get("primaryPod"),
        "conditions": scope.conditions,
        "observedGeneration": scope.generation,
    }
