"""Phases that act on the running databases through Patroni: its cluster-wide configuration,
switchovers, restarts and failovers.

The operator never runs SQL. It asks Patroni, over its REST API on the pods' addresses, to do
what Patroni does safely (``PATCH /config``, ``POST /switchover``, ``POST /failover``,
``POST /restart``), and observes the outcome in the pods' labels and member records. A
switchover in progress lives in ``status.switchover``, so a restarted operator continues it
instead of starting another. The DCS objects it ever writes are a dead primary's leader
lock, released only on proof that the holder cannot accept writes, and, just before that,
the failover record naming the synchronous standby to promote (``takeover``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from lightkube import ApiError

from stateward import rfc3339
from stateward.api import v1alpha1
from stateward.controllers.kube import Body, PatroniError, Ref
from stateward.controllers.postgres import members as m
from stateward.controllers.postgres import poolers, takeover
from stateward.controllers.postgres.scope import Scope, instance_pods, pod_role
from stateward.instance import patroni
from stateward.specs import meta
from stateward.specs.postgres import config as config_spec
from stateward.specs.postgres.statefulset import CONTAINER_NAME

RECHECK = 2.0
SWITCHOVER_TIMEOUT = 120.0
"""A switchover not observed complete by then is reported failed (Patroni gives up sooner)."""
RETRY_AFTER = 15.0
"""A failed automatic switchover (rolling update, scale-down) is retried after this long."""
SYNC_CONFIRM = 10.0
"""Patroni's loop: a synchronous-standby record read after the members changed is read again
this long after, once Patroni has had a loop to choose anew."""
SYNC_MAX_AGE = 60.0
"""The longest a settled synchronous-standby record is believed without a read."""

logger = logging.getLogger(__name__)

RUNNING = v1alpha1.SwitchoverPhase.RUNNING.value
SUCCEEDED = v1alpha1.SwitchoverPhase.SUCCEEDED.value
FAILED = v1alpha1.SwitchoverPhase.FAILED.value
REQUESTED = "Requested"


def _text(value: Any) -> str:
    """A parameter value as PostgreSQL's configuration text (Patroni may hold numbers)."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def configuration_patch(cluster: v1alpha1.PostgresCluster, dcs: dict[str, Any]) -> dict[str, Any]:
    """What ``PATCH /config`` must send to bring Patroni's dynamic configuration ``dcs`` to
    the spec's: changed PostgreSQL parameters (None removes one) and synchronous settings.
    Empty when nothing differs."""
    patch: dict[str, Any] = {}
    for key, want in config_spec.ha_settings(cluster).items():
        if dcs.get(key, config_spec.HA_DEFAULTS[key]) != want:
            patch[key] = want
    desired = config_spec.parameters(cluster)
    current = {
        k: _text(v) for k, v in ((dcs.get("postgresql") or {}).get("parameters") or {}).items()
    }
    changed = sorted(k for k in desired.keys() | current.keys() if desired.get(k) != current.get(k))
    if changed:
        patch["postgresql"] = {"parameters": {k: desired.get(k) for k in changed}}
    return patch


def _describe(patch: dict[str, Any]) -> str:
    names = sorted(k for k in patch if k != "postgresql")
    names += sorted((patch.get("postgresql") or {}).get("parameters") or {})
    return ", ".join(names)


@dataclasses.dataclass
class Lost:
    """A primary seen failing: since when (monotonic), how, and whether its lock was released.

    ``inferred``: the cause is the operator's inference (it went silent), which what the API
    shows later (its container terminated) replaces; ``restarts``: its instance container's
    restart count when first seen, so a container that died and restarted between two
    reconciles is still named as the cause."""

    pod: str
    since: float
    cause: str
    released: bool = False
    inferred: bool = False
    restarts: int = 0


@dataclasses.dataclass(frozen=True)
class Unrenewed:
    """A silent primary's leader lock: the resourceVersion read, and since when (the
    operator's monotonic clock) every read found that same version."""

    version: str
    since: float


@dataclasses.dataclass(frozen=True)
class SyncSeen:
    """Patroni's synchronous standbys as last read, and what the members looked like then.

    ``members``: the primary's uid and the streaming replicas; ``versions``: the instance
    pods' resourceVersions (a member can restart between two reconciles and look the same
    after it, while Patroni chose another standby meanwhile); ``settled``: two reads a
    Patroni loop apart agreed with the members unchanged in between.
    """

    members: str
    versions: str
    found: frozenset[str]
    read_at: float
    settled: bool


class DataPlane:
    """The data-plane phases, with the little memory they keep between reconciles (only to
    save requests; every decision is re-derived from observations)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._applied: dict[tuple[str, str], tuple[str, str]] = {}
        self._sync_seen: dict[tuple[str, str], SyncSeen] = {}
        self._primaries: dict[tuple[str, str], str] = {}
        self._lost: dict[tuple[str, str], Lost] = {}
        self._unrenewed: dict[tuple[str, str], Unrenewed] = {}

    def forget(self, key: tuple[str, str]) -> None:
        self._applied.pop(key, None)
        self._sync_seen.pop(key, None)
        self._primaries.pop(key, None)
        self._lost.pop(key, None)
        self._unrenewed.pop(key, None)

    # --- dynamic configuration -----------------------------------------------------------

    async def apply_configuration(self, scope: Scope) -> str | None:
        """Bring Patroni's cluster-wide configuration (PostgreSQL parameters, synchronous
        replication) to the spec's through ``PATCH /config`` on the primary: no pod restarts
        (parameters that need one show up in ``status.pendingRestart``).

        The observation is Patroni's own ``NAME-config`` ConfigMap, read only when the desired
        configuration or the primary changed since it was last found applied, so a cluster at
        rest costs no request at all. A new process checks every cluster once.
        """
        cluster = scope.cluster
        leader = m.primary(scope.members)
        if leader is None:
            return None  # nothing runs yet, or a failover is under way
        desired = {
            "parameters": config_spec.parameters(cluster),
            **config_spec.ha_settings(cluster),
        }
        memo = (json.dumps(desired, sort_keys=True), leader.uid)
        key = (cluster.namespace, cluster.name)
        if self._applied.get(key) == memo:
            return None
        state = await scope.kube.get("v1", "ConfigMap", scope.namespace, f"{cluster.name}-config")
        if state is None:
            # No Patroni state although a primary is labelled: nothing runs Patroni here (a
            # simulated node). Patroni writes its configuration before it labels a primary.
            self._applied[key] = memo
            return None
        try:
            dcs = json.loads(((state["metadata"].get("annotations") or {}).get("config")) or "{}")
        except ValueError:
            dcs = {}
        patch = configuration_patch(cluster, dcs if isinstance(dcs, dict) else {})
        if not patch:
            self._applied[key] = memo
            return None
        if not leader.address:
            scope.requeue(RECHECK)
            return "waiting for the primary's address to apply the configuration"
        auth = await scope.restapi_auth()
        if auth is None:
            scope.requeue(RECHECK)
            return f"waiting for Secret {cluster.restapi_secret_name} to apply the configuration"
        await scope.kube.patch_patroni_config(
            leader.address, patroni.RESTAPI_PORT, patch, auth=auth
        )
        await scope.event("ConfigurationApplied", f"Applied through Patroni: {_describe(patch)}")
        if patch.keys() & config_spec.SYNCHRONOUS_DEFAULTS.keys():
            # Patroni chooses its standbys anew (quorum commit names every replica): the
            # record last read is out of date.
            self._sync_seen.pop(key, None)
        # Patroni writes its ConfigMap asynchronously: check again shortly.
        scope.requeue(RECHECK * 2)
        return f"applied {_describe(patch)}"

    # --- synchronous standbys ------------------------------------------------------------

    async def observe_sync(self, scope: Scope) -> str | None:
        """Which replicas are synchronous standbys, from Patroni's ``NAME-sync`` ConfigMap.

        Patroni's record is not watched, so it is read (while some standby streams: none is
        synchronous otherwise) when the members changed since the last read (their roles, or
        any instance pod at all), read once more a Patroni loop later (Patroni chooses anew
        within a loop of a change), and at least every :data:`SYNC_MAX_AGE` seconds. A
        cluster at rest costs no request between those.
        """
        cluster = scope.cluster
        key = (cluster.namespace, cluster.name)
        streaming = sorted(x.name for x in scope.members if x.streaming)
        leader = m.primary(scope.members)
        if not config_spec.synchronous_settings(cluster)["synchronous_mode"] or leader is None:
            self._sync_seen.pop(key, None)
            return None
        if not streaming:
            # No standby streams, so none is synchronous whatever the record says (a new
            # cluster's bring-up read it at every pod change, to learn nothing).
            self._sync_seen.pop(key, None)
            scope.sync = frozenset()
            return None
        members = json.dumps([leader.uid, streaming])
        versions = json.dumps(
            sorted(str(p["metadata"].get("resourceVersion")) for p in instance_pods(scope))
        )
        seen = self._sync_seen.get(key)
        now = self._clock()
        if seen is not None and seen.members == members:
            age = now - seen.read_at
            if seen.settled and seen.versions == versions and age < SYNC_MAX_AGE:
                scope.sync = seen.found
                return None
            if not seen.settled and age < SYNC_CONFIRM:
                scope.sync = seen.found
                scope.requeue(SYNC_CONFIRM - age)
                return None
        found = await read_sync(scope)
        scope.sync = found if found is not None else frozenset()
        expected = min(cluster.spec.synchronous.number, len(streaming))
        complete = found is None or len(found & set(streaming)) >= expected
        # Settled: no Patroni record at all (nothing runs Patroni: a simulated node), or this
        # read agrees with the last and confirms that one (which followed a change), or
        # nothing at all changed since (a read only because it was old).
        settled = found is None or (
            complete
            and seen is not None
            and seen.members == members
            and seen.found == scope.sync
            and (not seen.settled or seen.versions == versions)
        )
        self._sync_seen[key] = SyncSeen(members, versions, scope.sync, now, settled)
        if not settled:
            scope.requeue(SYNC_CONFIRM if complete else RECHECK * 2)
        return None

    # --- failover ------------------------------------------------------------------------

    async def follow_leader_lock(self, scope: Scope) -> str | None:
        """Keep the primary's identity and its failover fast, from Patroni's leader lock.

        * Two pods labelled primary: the old one's Patroni could not relabel itself (its node
          died, hung or lost its network) after another member took the lock. The Services
          select on the label, so the stale one loses it now, not when its node comes back.
        * A primary proven unable to accept writes (``takeover``): its leader lock is
          released, and Patroni promotes a synchronous standby within a loop instead of
          after the lock's ttl.
        * A primary gone silent (hung, or cut off) whose pod still looks healthy: see
          :meth:`_silent_primary`.

        Costs nothing while the primary pod looks healthy and its synchronous standbys
        stream; while it does not, the lock (and the node) are read every few seconds until
        the primary is back or replaced. Also remembers when and how the primary was first
        seen failing, for the failover report.
        """
        key = (scope.cluster.namespace, scope.cluster.name)
        pods = instance_pods(scope, including_deleting=True)  # a dying primary keeps its label
        labelled = [p for p in pods if pod_role(p) == meta.PRIMARY_ROLE]
        if len(labelled) > 1:
            return await self._unlabel_stale(scope, labelled)
        lock: Body | None = None
        if labelled:
            pod: Body | None = labelled[0]
        elif any(
            takeover.suspect(p, CONTAINER_NAME) and takeover.started(p, CONTAINER_NAME)
            for p in pods
        ):
            # No pod labelled primary, and one that has run is unwell: a restarted Patroni
            # relabels its pod a replica while it starts read-only, so only the lock still
            # tells whose it is. (Read only then: a cluster without a primary whose pods are
            # healthy or have not started yet is bootstrapping; at a hundred clusters coming
            # up, reading the lock for every pod still pending was 1,000 GETs a minute.)
            lock = await _read_lock(scope)
            holder = _holder(lock)
            pod = next((p for p in pods if p["metadata"]["name"] == holder), None)
        else:
            pod = _named_primary(scope, pods)
        if pod is None:
            return None
        if not takeover.suspect(pod, CONTAINER_NAME):
            return await self._silent_primary(scope, pod)
        self._unrenewed.pop(key, None)
        name = pod["metadata"]["name"]
        node_name = (pod.get("spec") or {}).get("nodeName")
        node = await scope.kube.get("v1", "Node", "", node_name) if node_name else None
        lost = self._lost.get(key)
        if lost is None or lost.pod != name:
            lost = Lost(name, self._clock(), takeover.failure_cause(pod, node, CONTAINER_NAME))
            self._lost[key] = lost
        elif lost.inferred and (seen := takeover.concrete_cause(pod, node, CONTAINER_NAME)):
            lost.cause, lost.inferred = seen, False  # it did not only go silent: it died
        scope.requeue(RECHECK)
        if lost.released:
            return None
        if lock is None:
            lock = await _read_lock(scope)
        if lock is None:
            return None
        found = takeover.proof(
            pod, node, lock["metadata"].get("annotations") or {}, container=CONTAINER_NAME
        )
        if found is None:
            return None
        candidate = await _handover_candidate(scope, name)
        message = (
            f"Primary {name} cannot accept writes: {found.message}. Released its leader lock"
            f" so Patroni promotes {candidate or 'a synchronous standby'} now, not after the"
            f" {patroni.TTL} s ttl"
        )
        return await _release(scope, lock, lost, found, message, candidate)

    async def _silent_primary(self, scope: Scope, pod: Body) -> str | None:
        """A primary whose pod looks healthy while a synchronous standby reports that its WAL
        receiver lost it: a hung or partitioned primary, which the kubelet cannot report
        either. Under ``Priority`` synchronous replication its lock is released once it has
        gone unrenewed for :data:`takeover.SILENT_SECONDS` and Patroni's ``NAME-sync``
        record, read afresh, still lists that standby (``takeover`` has the argument). Costs
        nothing while every synchronous standby streams."""
        key = (scope.cluster.namespace, scope.cluster.name)
        name = pod["metadata"]["name"]
        lost = self._lost.get(key)
        if lost is not None and lost.pod == name and lost.released:
            scope.requeue(RECHECK)  # released: Patroni promotes the standby
            return None
        seen = self._sync_seen.get(key)
        witness = (
            takeover.stream_witness(scope.members, name, seen.found)
            if seen is not None and _priority_unplanned(scope)
            else None
        )
        # The witness's pod is read before the lock: its last write then precedes the lock's
        # read, so the lock as read went unrenewed at least from its last write to that one.
        reporter = lock = None
        if witness is not None:
            reporter = await scope.kube.get("v1", "Pod", scope.cluster.namespace, witness.name)
            lock = await _read_lock(scope)
        if witness is None or lock is None or _holder(lock) != name:
            self._unrenewed.pop(key, None)
            if lost is not None and lost.pod == name:
                self._lost.pop(key)  # the same pod is healthy again (or restarted in place)
            return None
        now = self._clock()
        if lost is None or lost.pod != name:
            cause = f"it went silent: its synchronous standby {witness.name} lost its WAL stream"
            restarts = takeover.restart_count(pod, CONTAINER_NAME)
            self._lost[key] = lost = Lost(name, now, cause, inferred=True, restarts=restarts)
        version = str(lock["metadata"].get("resourceVersion"))
        unrenewed = self._unrenewed.get(key)
        if unrenewed is None or unrenewed.version != version:
            self._unrenewed[key] = unrenewed = Unrenewed(version, now)
        waited = now - unrenewed.since
        age = takeover.unrenewed_for(lock["metadata"].get("annotations") or {}, scope.now)
        served = takeover.served_unrenewed(lock, reporter)
        remaining = takeover.silent_wait(waited, age, served)
        if remaining > 0:
            scope.requeue(max(remaining, 0.2))
            return None
        synchronous = await read_sync(scope)
        if synchronous is None or witness.name not in synchronous:
            self._unrenewed.pop(key, None)  # Patroni chose anew: its primary is alive
            return None
        self._unrenewed.pop(key, None)
        scope.requeue(RECHECK)
        found = takeover.silent_proof(witness.name, max(waited, age, served or 0.0))
        message = (
            f"Primary {name} went silent: {found.message}. Released its leader lock so"
            f" Patroni promotes {witness.name} now, not after the {patroni.TTL} s ttl"
        )
        return await _release(scope, lock, lost, found, message, witness.name)

    async def _unlabel_stale(self, scope: Scope, labelled: list[Body]) -> str | None:
        lock = await _read_lock(scope)
        holder = _holder(lock)
        if not holder or holder not in {p["metadata"]["name"] for p in labelled}:
            scope.requeue(RECHECK)  # a leader race is under way: look again shortly
            return None
        stale = [p for p in labelled if p["metadata"]["name"] != holder]
        for pod in stale:
            patched = await scope.kube.patch(
                Ref.of(pod), {"metadata": {"labels": {meta.ROLE_LABEL: None}}}
            )
            scope.observe(patched)
        names = ", ".join(p["metadata"]["name"] for p in stale)
        await scope.event(
            "StalePrimaryUnlabelled",
            f"{holder} holds the leader lock: removed the primary label from {names}, whose"
            " Patroni cannot update it, so the Services stop sending clients there",
        )
        return f"unlabelled the stale primary {names}"

    async def report_failover(self, scope: Scope) -> str | None:
        """A change of primary nobody planned is Patroni's failover: say so in an Event and
        ``status.lastFailover``, with how the primary was lost and how long the promotion
        took when the operator saw it fail. (A switchover in progress from the same primary
        is planned.)

        The last primary seen is remembered per cluster: while a primary's pod is gone, the
        status names no primary at all, so the status alone cannot tell the change. A new
        process starts from the status."""
        key = (scope.cluster.namespace, scope.cluster.name)
        leader = m.primary(scope.members)
        if leader is None:
            return None
        previous = self._primaries.get(key) or (scope.body.get("status") or {}).get("primaryPod")
        self._primaries[key] = leader.name
        lost = self._lost.get(key)
        if lost is not None and lost.pod != leader.name:
            self._lost.pop(key)
        if previous is None or leader.name == previous:
            return None
        current = scope.switchover or {}
        if current.get("fromPod") == previous and current.get("phase") == RUNNING:
            return None
        record: dict[str, Any] = {
            "fromPod": previous,
            "toPod": leader.name,
            "detectedAt": scope.now,
        }
        how = ""
        if lost is not None and lost.pod == previous:
            seconds = round(self._clock() - lost.since, 1)
            if lost.inferred and (old := scope.observed("Pod", previous)) is not None:
                # A container that died and restarted between two reconciles looked only
                # silent: its restart count tells.
                died = takeover.concrete_cause(old, None, CONTAINER_NAME, lost.restarts)
                lost.cause = died or lost.cause
            record["cause"] = lost.cause
            record["seconds"] = seconds
            record["lockReleased"] = lost.released
            how = f" ({lost.cause})"
            after = f" {seconds} s after it was seen failing"
        else:
            after = ""
        seen = self._sync_seen.get(key)
        synced = seen is not None and leader.name in seen.found
        guarantee = (
            "; it was a synchronous standby, so every acknowledged commit is on it"
            if synced
            else ""
        )
        scope.last_failover = record
        await scope.event(
            "Failover",
            f"Primary {previous} was lost{how}; Patroni promoted {leader.name}{after}{guarantee}",
            warning=True,
        )
        return f"failover from {previous} to {leader.name}"

    # --- switchover ----------------------------------------------------------------------

    async def run_switchover(self, scope: Scope) -> str | None:
        """Follow a running switchover to its end, then serve a user's request (the
        ``stateward.io/switchover`` annotation) or a scale-down that would remove the
        primary."""
        current = scope.switchover
        running = current is not None and current.get("phase") == RUNNING
        left = await poolers.resume_left_behind(scope, running)
        if running:
            assert current is not None
            return await self._follow(scope, current)
        if left:
            return left
        requested = (scope.body["metadata"].get("annotations") or {}).get(
            v1alpha1.SWITCHOVER_ANNOTATION
        )
        if requested is not None:
            return await self._requested(scope, requested.strip())
        if scope.scale_down_to is not None:
            return await start_switchover(scope, "ScaleDown", below_ordinal=scope.scale_down_to)
        return None

    async def _follow(self, scope: Scope, current: dict[str, Any]) -> str | None:
        leader = m.primary(scope.members)
        source, target = current["fromPod"], current["target"]
        if leader is not None and leader.name != source and leader.ready:
            paused = current.get("poolerPaused") or []
            if paused and not await poolers.resume_once_served(scope, leader.address or "", paused):
                scope.progressing.append(
                    ("Switchover", f"{leader.name} is the primary; resuming the pooler")
                )
                return "waiting for the primary Service before resuming the pooler"
            current = _unpaused(current)
            scope.switchover = {
                **current,
                "phase": SUCCEEDED,
                "finishedAt": scope.now,
                "target": leader.name if target == "any" else target,
                "message": f"{leader.name} is the primary",
            }
            await scope.event("SwitchedOver", f"Switched over from {source} to {leader.name}")
            await _consume_request(scope, current)
            return f"switched over from {source} to {leader.name}"
        if rfc3339.seconds_since(current["startedAt"]) > SWITCHOVER_TIMEOUT:
            message = (
                f"{source} is still the primary {SWITCHOVER_TIMEOUT:.0f}s after the switchover"
                " started; Patroni's log on the pods says why"
                if leader is not None and leader.name == source
                else f"no primary became ready within {SWITCHOVER_TIMEOUT:.0f}s"
            )
            if current.get("poolerPaused"):
                await poolers.resume(scope, current["poolerPaused"])
            await _fail(scope, _unpaused(current), message)
            return "switchover failed"
        scope.progressing.append(
            ("Switchover", f"switching over from {source} to {target} ({current['reason']})")
        )
        # A paused pooler holds the applications' queries: look again soon.
        scope.requeue(poolers.RETRY if current.get("poolerPaused") else RECHECK)
        return "waiting for the switchover"

    async def _requested(self, scope: Scope, target: str) -> str | None:
        leader = m.primary(scope.members)
        names = sorted(x.name for x in scope.members)
        annotation = v1alpha1.SWITCHOVER_ANNOTATION
        if leader is not None and target == leader.name:
            scope.switchover = _record(scope, SUCCEEDED, leader.name, target, REQUESTED)
            scope.switchover["message"] = f"{target} already is the primary"
            scope.switchover["finishedAt"] = scope.now
            await scope.event("SwitchoverSkipped", f"{target} already is the primary")
            await _consume_request(scope, scope.switchover)
            return "switchover request: already the primary"
        if target != "any" and target not in names:
            message = (
                f"annotation {annotation}={target!r} names no instance of this cluster; use one"
                f" of {', '.join(names) or 'its pods'} or 'any'"
            )
            await _fail(
                scope,
                _record(scope, RUNNING, leader.name if leader else "", target, REQUESTED),
                message,
            )
            return "switchover request refused"
        return await start_switchover(scope, REQUESTED, target=None if target == "any" else target)

    # --- restarts ------------------------------------------------------------------------

    async def restart_pending(self, scope: Scope) -> str | None:
        """Roll a restart through the cluster when a parameter waits for one: every instance
        once, replicas first (one at a time), then a switchover so the old primary restarts
        as a replica. A lone primary restarts in place (there is no one to hand over to).

        Patroni's pending flag only starts it: Patroni can drop the flag of a member that
        still runs the old value (a later reload that changes nothing clears it), so the roll
        itself is tracked in ``status.rollingRestart`` — the configuration it is for and the
        instances already restarted — and a restarted operator continues it.
        """
        running = scope.switchover is not None and scope.switchover.get("phase") == RUNNING
        if running:
            return None
        wanted = _configuration_key(scope.cluster)
        roll = scope.rolling_restart
        if roll is None or roll.get("configuration") != wanted:
            if not any(x.pending_restart for x in scope.members):
                return None
            roll = {"configuration": wanted, "phase": RUNNING, "restarted": [],
                    "startedAt": scope.now}  # fmt: skip
            scope.rolling_restart = roll
            await scope.event(
                "RollingRestart", "A parameter needs a restart: restarting every instance,"
                " replicas first, then the primary after a switchover",
            )  # fmt: skip
        if roll.get("phase") != RUNNING:
            return None
        everyone = scope.members
        if len(everyone) != scope.cluster.spec.replicas or not all(x.ready for x in everyone):
            scope.requeue(RECHECK)
            return "rolling restart waits for every instance to be ready"
        done = set(roll.get("restarted") or [])
        left = sorted((x for x in everyone if x.name not in done), key=lambda x: x.ordinal)
        if not left:
            scope.rolling_restart = {**roll, "phase": SUCCEEDED, "finishedAt": scope.now}
            await scope.event("RollingRestartDone", "Every instance runs the new parameters")
            return "rolling restart done"
        victim = next((x for x in left if not x.is_primary), left[0])
        if victim.is_primary and any(x.streaming for x in everyone):
            return await start_switchover(scope, "Restart")
        auth = await scope.restapi_auth()
        if not victim.address or auth is None:
            return None
        try:
            code, text = await scope.kube.post_patroni(
                victim.address, patroni.RESTAPI_PORT, "/restart", {}, auth=auth, wait=120
            )
        except PatroniError as error:
            # No answer in time: whether it restarted is unknown. Not counted as done — the
            # member still flags its pending restart if it did not, and a second restart of
            # one member is harmless — and the reconcile goes on instead of failing.
            code, text = 0, f"Patroni did not answer the restart of {victim.name} ({error})"
        else:
            text = f"Patroni refused to restart {victim.name}: {text}"
        scope.requeue(RECHECK)
        if code == 0 or code >= 400:
            await scope.event("RestartFailed", text, warning=True)
            scope.requeue(RECHECK * 5)
            return f"restart of {victim.name} refused"
        scope.rolling_restart = {**roll, "restarted": sorted(done | {victim.name})}
        # Patroni may have chosen another synchronous standby while the member was down.
        self._sync_seen.pop((scope.cluster.namespace, scope.cluster.name), None)
        role = "primary, in place: no replica to switch over to" if victim.is_primary else "replica"
        await scope.event(
            "InstanceRestarted", f"Restarted {victim.name} ({role}) to apply pending parameters"
        )
        return f"restarted {victim.name} for pending parameters"


def _configuration_key(cluster: v1alpha1.PostgresCluster) -> str:
    """Which parameter set a rolling restart is for (short, stable across processes)."""
    text = json.dumps(config_spec.parameters(cluster), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _record(scope: Scope, phase: str, source: str, target: str, reason: str) -> dict[str, Any]:
    return {
        "phase": phase,
        "fromPod": source,
        "target": target,
        "reason": reason,
        "startedAt": scope.now,
    }


def _unpaused(record: dict[str, Any]) -> dict[str, Any]:
    """A switchover record without ``poolerPaused``: once the pooler is resumed."""
    return {k: v for k, v in record.items() if k != "poolerPaused"}


async def _fail(scope: Scope, record: dict[str, Any], message: str) -> None:
    scope.switchover = {**record, "phase": FAILED, "finishedAt": scope.now, "message": message}
    await scope.event("SwitchoverFailed", message, warning=True)
    await _consume_request(scope, record)


async def _consume_request(scope: Scope, record: dict[str, Any]) -> None:
    """A user's request is answered (in status and an Event): remove its annotation, so the
    next one is a new request."""
    if record.get("reason") != REQUESTED:
        return
    annotations = scope.body["metadata"].get("annotations") or {}
    if v1alpha1.SWITCHOVER_ANNOTATION not in annotations:
        return
    patched = await scope.kube.patch(
        Ref.of(scope.body),
        {"metadata": {"annotations": {v1alpha1.SWITCHOVER_ANNOTATION: None}}},
    )
    scope.store.observe(patched)
    scope.body = {**patched, "status": scope.body.get("status")}


async def start_switchover(
    scope: Scope,
    reason: str,
    *,
    target: str | None = None,
    below_ordinal: int | None = None,
) -> str | None:
    """Ask Patroni on the primary to hand over to ``target`` (or the best candidate), and
    record the switchover as running. Safe to call again: Patroni refuses a second one while
    the first runs, and the status record keeps later reconciles from asking."""
    leader = m.primary(scope.members)
    if leader is None or not leader.address:
        scope.requeue(RECHECK)
        return "switchover waits for a primary"
    last = scope.switchover or {}
    if (
        reason != REQUESTED
        and last.get("phase") == FAILED
        and last.get("reason") == reason
        and rfc3339.seconds_since(last.get("finishedAt") or last["startedAt"]) < RETRY_AFTER
    ):
        scope.requeue(RETRY_AFTER)
        return f"switchover for {reason} failed recently; retrying shortly"
    synchronous = bool(config_spec.synchronous_settings(scope.cluster)["synchronous_mode"])
    if synchronous:
        # Patroni promotes only the standby its record names, which may have changed since
        # it was last read (a member restarting within one reconcile): ask it as it is now.
        found = await read_sync(scope)
        scope.sync = scope.sync if found is None else found
    if target is not None:
        chosen = next((x for x in scope.members if x.name == target), None)
        problem = None
        if chosen is None or not (chosen.streaming and chosen.ready):
            problem = f"{target} is not a ready, streaming replica"
        elif synchronous and scope.sync and target not in scope.sync:
            problem = (
                f"{target} is not a synchronous standby (those are"
                f" {', '.join(sorted(scope.sync))}): promoting it could lose acknowledged"
                " commits; ask for one of those or 'any'"
            )
        if problem is not None:
            await _fail(scope, _record(scope, RUNNING, leader.name, target, reason), problem)
            return "switchover refused"
        candidate: tuple[str, bool] | None = (target, True)
    else:
        candidate = m.switchover_candidate(
            scope.members, scope.sync, synchronous=synchronous, below_ordinal=below_ordinal
        )
    if candidate is None:
        message = "no ready, streaming replica to switch over to" + (
            " (only synchronous standbys qualify)" if synchronous else ""
        )
        if reason == REQUESTED:
            await _fail(scope, _record(scope, RUNNING, leader.name, "any", reason), message)
            return "switchover refused"
        scope.progressing.append(("Switchover", f"{reason} waits: {message}"))
        scope.requeue(RECHECK * 2)
        return f"switchover for {reason} waits: {message}"
    name, as_switchover = candidate
    path, body = (
        ("/switchover", {"leader": leader.name, "candidate": name})
        if as_switchover
        else ("/failover", {"candidate": name})
    )
    record = _record(scope, RUNNING, leader.name, name, reason)
    auth = await scope.restapi_auth()
    if auth is None:
        scope.requeue(RECHECK)
        return f"switchover waits for Secret {scope.cluster.restapi_secret_name}"
    # The pooler holds its clients' queries while the primary steps down (resumed by
    # _follow once the new primary serves, whatever happens in between).
    paused = await poolers.pause(scope)
    try:
        code, text = await scope.kube.post_patroni(
            leader.address, patroni.RESTAPI_PORT, path, body, auth=auth
        )
    except PatroniError:
        code, text = 0, ""  # it may be under way: observe (the timeout reports a failure)
    if code >= 400:
        if paused:
            await poolers.resume(scope, paused)
        await _fail(scope, record, f"Patroni refused the switchover to {name}: {text}")
        return "switchover refused"
    # Patroni answers once the new primary holds the lock: resume as soon as the primary
    # Service leads to it, not at a later reconcile (those resume what this leaves paused).
    address = next((x.address for x in scope.members if x.name == name), None)
    if paused and address and await poolers.resume_when_served(scope, address, paused):
        paused = []
    if paused:
        record["poolerPaused"] = paused
    scope.switchover = record
    await scope.event(
        "SwitchoverStarted", f"Switching over from {leader.name} to {name} ({reason})"
    )
    scope.progressing.append(("Switchover", f"switching over from {leader.name} to {name}"))
    scope.requeue(RECHECK)
    return f"switchover from {leader.name} to {name} ({reason})"


def _named_primary(scope: Scope, pods: list[Body]) -> Body | None:
    """The pod status names as the primary, when no pod is labelled one."""
    named = (scope.body.get("status") or {}).get("primaryPod")
    return next((p for p in pods if p["metadata"]["name"] == named), None)


async def read_sync(scope: Scope) -> frozenset[str] | None:
    """Patroni's synchronous standbys, read fresh; None when Patroni has no record yet."""
    state = await scope.kube.get("v1", "ConfigMap", scope.namespace, f"{scope.cluster.name}-sync")
    if state is None:
        return None
    return m.sync_standbys(state.get("metadata", {}).get("annotations"))


def _priority_unplanned(scope: Scope) -> bool:
    """Whether a synchronous standby Patroni lists is known to hold every acknowledged commit
    and nothing planned is moving the primary: ``Priority`` synchronous replication (under
    quorum commit a candidate must first learn from the other voters that it is the most
    advanced; without synchronous replication, from every member) and no switchover running
    (a planned hand-over stops the stream on purpose, and owns Patroni's failover record)."""
    if (scope.switchover or {}).get("phase") == RUNNING:
        return False
    return config_spec.synchronous_settings(scope.cluster)["synchronous_mode"] is True


async def _handover_candidate(scope: Scope, primary: str) -> str | None:
    """The synchronous standby to name in Patroni's failover record when ``primary``'s lock
    is released, when one is known to hold every acknowledged commit."""
    if not _priority_unplanned(scope):
        return None
    return takeover.handover_candidate(scope.members, primary, await read_sync(scope))


async def _hand_over(scope: Scope, lock: Body, primary: str, candidate: str) -> bool:
    """Write Patroni's failover record from ``primary`` to ``candidate``; False when it could
    not be written (the release goes on: Patroni's leader race then decides, 2 s slower).
    Patroni keeps the record once it made it, so it is patched, and created only if absent."""
    name = scope.cluster.failover_config_map_name
    try:
        try:
            ref = Ref("v1", "ConfigMap", scope.namespace, name)
            await scope.kube.patch(ref, takeover.handover_patch(primary, candidate))
        except ApiError as missing:
            if missing.status.code != 404:
                raise
            await scope.kube.create(takeover.handover(lock, name, primary, candidate))
    except ApiError as error:
        logger.warning("could not name %s in %s (%s): %s", candidate, name, error.status.code,
                       error.status.message)  # fmt: skip
        return False
    return True


async def _withdraw_handover(scope: Scope) -> None:
    """Empty the failover record again after a release that did not happen, so that a
    primary that renewed its lock meanwhile does not take it for a request to hand over."""
    ref = Ref("v1", "ConfigMap", scope.namespace, scope.cluster.failover_config_map_name)
    try:
        await scope.kube.patch(ref, takeover.WITHDRAW_HANDOVER)
    except ApiError as error:
        logger.warning("could not empty %s (%s)", ref.name, error.status.code)


async def _release(
    scope: Scope,
    lock: Body,
    lost: Lost,
    found: takeover.Proof,
    message: str,
    candidate: str | None = None,
) -> str:
    """Release ``lost``'s leader lock on ``found``, unless its holder renewed it since it was
    read (the write is conditioned on that version), and say so in an Event. ``candidate``,
    a synchronous standby, is named in Patroni's failover record first, so that it takes the
    lock in its first loop without waiting on the dead primary's REST API."""
    handed = candidate is not None and await _hand_over(scope, lock, lost.pod, candidate)
    try:
        await scope.kube.patch(Ref.of(lock), takeover.release_patch(lock))
    except ApiError as error:
        if handed:
            await _withdraw_handover(scope)
        if error.status.code == 409:
            return f"the leader lock of {lost.pod} was renewed meanwhile: not released"
        raise
    lost.released = True
    await scope.event("LeaderLockReleased", message, warning=True)
    return f"released the leader lock of {lost.pod} ({found.reason})"


async def _read_lock(scope: Scope) -> Body | None:
    """Patroni's leader lock, read fresh (it is not a watched child)."""
    return await scope.kube.get(
        "v1", "ConfigMap", scope.namespace, scope.cluster.leader_config_map_name
    )


def _holder(lock: Body | None) -> str | None:
    """The member holding the lock, by its annotations; None when nobody does."""
    annotations = (lock or {}).get("metadata", {}).get("annotations") or {}
    return annotations.get(takeover.LEADER_ANNOTATION)
