"""In-place major upgrades: ``spec.version`` names a newer major than the data's.

A checklist over ``status.upgrade``, one step per reconcile as the observed state allows
(every step is decided again from what is observed, so an operator restart anywhere picks
up where it was):

* **Stopping**: once every instance is ready, the cluster scales to one instance (the
  scale-down machinery first switches the primary over to ordinal 0), then to none: the
  primary shuts down cleanly, last, with no one left to fail over to.
* **Upgrading**: with no instance pod left, the Job ``NAME-upgrade`` runs
  ``stateward-instance upgrade`` (``pg_upgrade --check``, then ``--link``) on the first
  instance's volume in the new major's image. A refusal (nothing changed) brings the
  cluster back on the old major, ``Degraded`` saying why; a failure after the link step
  leaves it stopped for a human.
* **Starting**: Patroni's state of the old cluster (a different system identifier) and the
  other instances' volumes (old-major files) are deleted, then the first instance starts on
  the upgraded data alone and takes the leader lock.
* **Cloning**: the other instances start on empty volumes and clone the new primary.
* **Succeeded**: ``status.version`` is the new version.

A ``spec.version`` below the data's major is refused by admission (a CEL rule on
``status.version``); should one get through, it is not acted on (``Degraded``).
"""

from __future__ import annotations

import logging
from typing import Any, Final

from lightkube import ApiError

from stateward.api import v1alpha1
from stateward.api.v1alpha1 import UpgradePhase
from stateward.controllers.kube import Ref
from stateward.controllers.postgres.scope import (
    Scope,
    delete_patroni_state,
    instance_pods,
    job_pods,
    job_state,
)
from stateward.specs import meta, pinning
from stateward.specs.postgres import upgrade as upgrade_spec

logger = logging.getLogger(__name__)

RECHECK: Final = 2.0
"""While a step waits for pods to stop or start."""
RUNNING: Final = frozenset(
    {UpgradePhase.STOPPING, UpgradePhase.UPGRADING, UpgradePhase.STARTING, UpgradePhase.CLONING}
)
DATA_UPGRADED: Final = frozenset(
    {UpgradePhase.STARTING, UpgradePhase.CLONING, UpgradePhase.SUCCEEDED}
)
REFUSED: Final = "UpgradeRefused"
FAILED: Final = "UpgradeFailed"
DOWNGRADE: Final = "DowngradeRefused"


def major(version: str) -> int:
    return int(version.split(".")[0])


def data_version(scope: Scope) -> str:
    """The version the data files are of: the upgrade's target once its Job succeeded, its
    source before; else what status recorded; else the version of the default image the
    StatefulSet runs (a cluster an older operator made); else (a new cluster) the spec's."""
    record = scope.upgrade
    if record is not None and record.get("phase") in RUNNING | {UpgradePhase.REFUSED}:
        upgraded = record["phase"] in DATA_UPGRADED
        return str(record["to"] if upgraded else record["from"])
    return scope.version or _running_image_version(scope) or scope.cluster.spec.version


def _running_image_version(scope: Scope) -> str | None:
    statefulset = scope.observed("StatefulSet", scope.cluster.name)
    containers = (((statefulset or {}).get("spec") or {}).get("template") or {}).get("spec", {})
    for container in containers.get("containers") or []:
        image = pinning.without_digest(str(container.get("image") or ""))
        repository, _, tag = image.rpartition(":")
        if repository == v1alpha1.DEFAULT_IMAGE_REPOSITORY and tag[:1].isdigit():
            return tag
    return None


def status_version(scope: Scope) -> str:
    """``status.version``: the data's version; the spec's once reached (a minor update
    included), and not while an upgrade runs or was refused."""
    running, wanted = data_version(scope), scope.cluster.spec.version
    record = scope.upgrade
    settled = record is None or record.get("phase") not in RUNNING | {UpgradePhase.REFUSED}
    return wanted if settled and major(wanted) == major(running) else running


async def gate(scope: Scope) -> str | None:
    """After the children are applied: while an upgrade has every instance down (or is
    taking the last one down), the phases that follow Patroni and the pods do not run."""
    if scope.hold_data_plane:
        scope.halted = True
    return None


def refusal(cluster: v1alpha1.PostgresCluster, running: str) -> str | None:
    """Why the spec's version cannot be reached from ``running`` in place, if it cannot."""
    wanted = cluster.spec.version
    if major(wanted) < major(running):
        return (
            f"spec.version {wanted} is older than the data files, which are PostgreSQL"
            f" {major(running)}: a downgrade is not possible in place; set spec.version"
            f' back to "{running}", or restore a backup into a new cluster of version {wanted}'
        )
    if cluster.spec.image is None and major(running) not in v1alpha1.UPGRADES.get(
        major(wanted), ()
    ):
        sources = ", ".join(map(str, v1alpha1.UPGRADES.get(major(wanted), ()))) or "no major"
        return (
            f"PostgreSQL {major(running)} cannot be upgraded to {major(wanted)} in place: the"
            f" {major(wanted)} image upgrades from {sources}; set spec.version back to"
            f' "{running}"'
        )
    return None


def _record(scope: Scope, phase: UpgradePhase, message: str) -> None:
    assert scope.upgrade is not None
    scope.upgrade = {**scope.upgrade, "phase": phase.value, "message": message}
    if phase not in RUNNING:
        scope.upgrade["finishedAt"] = scope.now


async def run_upgrade(scope: Scope) -> str | None:
    """Decide the upgrade's step (before the children are applied: it sets the version and
    the instances they are built for)."""
    cluster = scope.cluster
    running = data_version(scope)
    record = scope.upgrade
    if record is not None and record.get("phase") == UpgradePhase.REFUSED:
        if major(cluster.spec.version) == major(record["from"]):
            scope.upgrade = None  # the spec went back: the refusal is answered
        elif record.get("to") == cluster.spec.version:
            scope.children_version = record["from"]
            await scope.degrade(REFUSED, f"{record['message']}")
            return None
        else:
            scope.upgrade = None  # another target: try that one
    if record is not None and record.get("phase") in RUNNING:
        return await _step(scope, record)
    if major(cluster.spec.version) == major(running):
        return None
    problem = refusal(cluster, running)
    if problem is not None:
        scope.children_version = running
        downgrade = major(cluster.spec.version) < major(running)
        await scope.degrade(DOWNGRADE if downgrade else REFUSED, problem)
        return None
    scope.children_version = running
    if not _healthy(scope):
        waiting = f"the upgrade to {cluster.spec.version} waits for every instance to be ready"
        scope.progressing.append(("Upgrading", waiting))
        scope.requeue(RECHECK * 5)
        return "the upgrade waits for a healthy cluster"
    scope.upgrade = {
        "phase": UpgradePhase.STOPPING.value,
        "from": running,
        "to": cluster.spec.version,
        "startedAt": scope.now,
        "message": "stopping the instances, the primary last",
    }
    await scope.event(
        "UpgradeStarted",
        f"Upgrading PostgreSQL {running} to {cluster.spec.version}: stopping the instances",
    )
    return await _step(scope, scope.upgrade)


def _healthy(scope: Scope) -> bool:
    members = scope.members
    ready = [x for x in members if x.ready]
    return len(ready) == scope.cluster.spec.replicas and any(x.is_primary for x in ready)


async def _step(scope: Scope, record: dict[str, Any]) -> str | None:
    phase = UpgradePhase(record["phase"])
    scope.progressing.append(
        ("Upgrading", f"upgrading PostgreSQL {record['from']} to {record['to']}: {phase.value}")
    )
    scope.requeue(RECHECK)
    if phase == UpgradePhase.STOPPING:
        return await _stopping(scope, record)
    if phase == UpgradePhase.UPGRADING:
        return await _upgrading(scope, record)
    if phase == UpgradePhase.STARTING:
        return _starting(scope, record)
    return await _cloning(scope, record)


async def _stopping(scope: Scope, record: dict[str, Any]) -> str | None:
    if major(scope.cluster.spec.version) == major(record["from"]):
        scope.upgrade = None  # the spec went back before anything changed
        await scope.event("UpgradeCancelled", f"spec.version is {record['from']} again")
        return "upgrade cancelled"
    scope.children_version = record["from"]
    pods = instance_pods(scope, including_deleting=True)
    if any(meta.pod_ordinal(p["metadata"]["name"]) != 0 for p in pods):
        scope.children_replicas = 1  # the scale-down moves the primary to ordinal 0 first
        return "upgrade: stopping the replicas"
    if pods:
        scope.children_replicas = 0
        scope.hold_data_plane = True  # the primary is going down: no data-plane step now
        return "upgrade: stopping the primary"
    _record(scope, UpgradePhase.UPGRADING, "every instance stopped; pg_upgrade runs")
    return await _upgrading(scope, scope.upgrade or record)


async def _upgrading(scope: Scope, record: dict[str, Any]) -> str | None:
    cluster = scope.cluster
    scope.children_version, scope.children_replicas = record["from"], 0
    scope.hold_data_plane = True
    job = scope.observed("Job", cluster.upgrade_job_name)
    if job is None:
        target = cluster.model_copy(
            update={"spec": cluster.spec.model_copy(update={"version": record["to"]})}
        )
        body = upgrade_spec.upgrade_job(
            cluster,
            old_major=major(record["from"]),
            new_major=major(record["to"]),
            image=target.image,
        )
        try:
            created = await scope.kube.create(scope.pinned(body))
        except ApiError as error:
            if error.status.code != 409:
                raise
        else:
            scope.observe(created)
        return "upgrade: started pg_upgrade"
    state = job_state(job)
    if state == "Running":
        return "upgrade: pg_upgrade running"
    outcome = _outcome(scope) or f"Job {cluster.upgrade_job_name} {state.lower()}"
    if state == "Complete":
        await _forget_old_cluster(scope)
        # The first instance starts at the next reconcile, once this one's status says
        # Starting: were it to start now and the status write fail, the next reconcile
        # would forget the old cluster again, under a Patroni already running.
        _record(scope, UpgradePhase.STARTING, f"{outcome}; the first instance starts on it")
        await scope.event("DataUpgraded", outcome)
        return "upgrade: data upgraded"
    await _delete_job(scope)
    if outcome.startswith("refused"):
        message = (
            f"The upgrade to {record['to']} was refused and nothing changed: {outcome}. The"
            f" cluster runs on {record['from']} again; fix this and set spec.version back to"
            f' "{record["from"]}" and then to "{record["to"]}" to try again'
        )
        _record(scope, UpgradePhase.REFUSED, message)
        scope.children_version, scope.children_replicas = record["from"], None
        scope.hold_data_plane = False
        await scope.degrade(REFUSED, message)
        return "upgrade refused"
    message = (
        f"The upgrade to {record['to']} failed after pg_upgrade linked the data: {outcome}."
        " The instances stay stopped; restore a backup into a new cluster, or repair the"
        f" volume {upgrade_spec.data_claim_name(cluster)} by hand"
    )
    _record(scope, UpgradePhase.FAILED, message)
    await scope.degrade(FAILED, message)
    return "upgrade failed"


def _outcome(scope: Scope) -> str | None:
    """The last line ``stateward-instance upgrade`` wrote, from its pods' termination."""
    pods = job_pods(scope, scope.cluster.upgrade_job_name, including_deleting=True)
    pods.sort(key=lambda p: p["metadata"].get("creationTimestamp") or "")
    for pod in reversed(pods):
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            message = ((status.get("state") or {}).get("terminated") or {}).get("message")
            if message:
                return str(message).strip()
    return None


async def _delete_job(scope: Scope) -> None:
    job = scope.observed("Job", scope.cluster.upgrade_job_name)
    if job is not None:
        await scope.kube.delete(Ref.of(job))
        scope.forget("Job", scope.cluster.upgrade_job_name)


async def _forget_old_cluster(scope: Scope) -> None:
    """Before the first instance starts on the upgraded data: Patroni's state of the old
    cluster (its system identifier, timeline history and leader lock) and the other
    instances' volumes, whose old-major files could not start. Done once, while no instance
    pod exists (the StatefulSet has none until the next reconcile asks for one)."""
    cluster = scope.cluster
    await delete_patroni_state(scope)
    for claim in scope.owned("PersistentVolumeClaim"):
        name = claim["metadata"]["name"]
        if name.startswith(f"{upgrade_spec.DATA_VOLUME}-{cluster.name}-") and name != (
            upgrade_spec.data_claim_name(cluster, 0)
        ):
            await scope.kube.delete(Ref.of(claim))
            scope.forget("PersistentVolumeClaim", name)


def _starting(scope: Scope, record: dict[str, Any]) -> str | None:
    scope.children_version, scope.children_replicas = record["to"], 1
    first = next((x for x in scope.members if x.ordinal == 0), None)
    if first is None or not (first.ready and first.is_primary):
        return "upgrade: the first instance starts on the upgraded data"
    _record(scope, UpgradePhase.CLONING, "the other instances clone the upgraded primary")
    scope.children_replicas = None
    return "upgrade: the first instance leads; cloning the others"


async def _cloning(scope: Scope, record: dict[str, Any]) -> str | None:
    scope.children_version = record["to"]
    if not _healthy(scope):
        return "upgrade: cloning the other instances"
    _record(scope, UpgradePhase.SUCCEEDED, f"PostgreSQL {record['to']}, every instance ready")
    scope.version = record["to"]
    await _delete_job(scope)
    await scope.event("Upgraded", f"Upgraded PostgreSQL {record['from']} to {record['to']}")
    return f"upgraded to PostgreSQL {record['to']}"
