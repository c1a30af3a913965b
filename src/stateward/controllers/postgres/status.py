"""The PostgresCluster's status, and the diagnosis of instances that cannot run.

``write_status`` computes the status from observations (one small function per part) at
the end of every reconcile and patches it once, only if it changed. ``check_instances``,
the phase that says in ``Degraded`` why an instance cannot run, reads the pods with the
same diagnostics (``pod_problem``) that the final backup uses for its Job's pods. Nothing
here knows of the reconciler that calls it.
"""

from __future__ import annotations

from typing import Any, Final

from stateward import rfc3339
from stateward.api import v1alpha1, validation
from stateward.controllers import core
from stateward.controllers.kube import Body
from stateward.controllers.postgres import upgrades
from stateward.controllers.postgres.members import QUORUM_STANDBY, SYNC_STANDBY, instances
from stateward.controllers.postgres.scope import (
    PROGRESS_RECHECK,
    STARTING_RECHECK,
    UNSATISFIABLE_RECHECK,
    Scope,
    instance_pods,
    pod_role,
)
from stateward.specs import meta

# --- pod diagnostics -------------------------------------------------------------------------

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


VOLUME_BINDING_GRACE: Final = 600.0
"""Seconds a pod may wait for its volume claims to be bound before that is a problem. The
scheduler says "pod has unbound immediate PersistentVolumeClaims" while a provisioner makes
a new volume, which is how every new instance starts: reported at once, every new cluster
showed phase Failing and a Warning Event for its first seconds. Ten minutes, the time the
scheduler itself waits for a volume to bind before it calls the attempt failed (the
VolumeBinding plugin's ``bindTimeoutSeconds``): a provisioner busy with a burst of claims is
slow, not broken (the benchmark's took 70 s for 300 claims and minutes for 1000). A
StorageClass that does not exist is reported at once (``StorageClassNotFound``)."""


VOLUME_BINDING_MESSAGES: Final = (
    "unbound immediate PersistentVolumeClaims",
    # The claim's volume named before the scheduler's cache has the volume: a moment later.
    "bound to non-existent persistentvolume",
)
"""What the scheduler says while a pod's claims are being bound."""


def volume_wait_left(pod: Body, now: str) -> float | None:
    """Seconds left of :data:`VOLUME_BINDING_GRACE` while the scheduler waits only for the
    pod's claims to be bound; None when it waits for something else, or too long already."""
    condition = unscheduled(pod)
    message = str((condition or {}).get("message") or "")
    if condition is None or not any(said in message for said in VOLUME_BINDING_MESSAGES):
        return None
    try:
        waited = rfc3339.seconds_between(str(condition.get("lastTransitionTime")), now)
    except ValueError:
        return None
    left = VOLUME_BINDING_GRACE - waited
    return left if left > 0 else None


def pod_problem(pod: Body) -> str | None:
    """Why a pod is not running, when the reason is one a user must act on: it cannot be
    scheduled (resources, affinity, a volume), or its image cannot be pulled, or its
    container cannot be created or keeps crashing."""
    status = pod.get("status") or {}
    if (condition := unscheduled(pod)) is not None:
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


def unscheduled(pod: Body) -> Body | None:
    """The pod's PodScheduled condition while the scheduler cannot place it."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return dict(condition)
    return None


def _kept_apart(pod: Body) -> bool:
    """Whether the scheduler could not place the pod because of the instances' pod
    anti-affinity (its message counts the nodes that "didn't match pod anti-affinity rules")."""
    condition = unscheduled(pod)
    return condition is not None and "anti-affinity" in str(condition.get("message") or "")


def _not_enough_nodes(cluster: v1alpha1.PostgresCluster, pods: list[Body]) -> str:
    placement = cluster.spec.placement
    names = ", ".join(sorted(p["metadata"]["name"] for p in pods))
    said = str((unscheduled(pods[0]) or {}).get("message") or "").strip()
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
    pods = instance_pods(scope)
    binding = {
        pod["metadata"]["name"]: left for pod in pods if (left := volume_wait_left(pod, scope.now))
    }
    if binding:
        # Starting, as far as the reason goes: a new reason would be one more status write
        # for every new cluster; the message says what it waits for. Not a problem until
        # the grace (VOLUME_BINDING_GRACE) is over.
        message = f"{', '.join(binding)} waiting for volumes to bind"
        scope.progressing.append(("InstancesStarting", message))
        scope.requeue(min(binding.values()) + 1)
    problems = [
        (pod, p)
        for pod in pods
        if pod["metadata"]["name"] not in binding and (p := pod_problem(pod))
    ]
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
        scope.requeue(STARTING_RECHECK)


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
    creating = v1alpha1.Phase.CREATING.value
    coming_up = status["phase"] == creating and current.get("phase") in (None, creating)
    await core.patch_status(scope, status, coming_up=coming_up)


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
