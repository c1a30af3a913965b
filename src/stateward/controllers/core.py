"""The reconciler core that every resource (PostgresCluster, Database) runs on.

A resource's reconciler is an ordered list of phases over a :class:`Scope`: what was
observed of the object and its children (the store, fed by watches), and what the phases
decided (conditions, notes, a requeue). The pieces here are the ones that do not depend on
the resource: the finalizer, converging children by server-side apply (zero writes when
nothing drifted), volume growth, the status patch written once and only when it changed, and
putting a failed reconcile where users look.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from decimal import Decimal
from typing import Any, Final, TypeVar

from lightkube import ApiError

from stateward import rfc3339
from stateward.api import v1alpha1, validation
from stateward.controllers import conditions as cond
from stateward.controllers import diff
from stateward.controllers.kube import Body, Kube, Ref, transient
from stateward.controllers.queue import Outcome
from stateward.controllers.store import ObjectStore
from stateward.specs import meta, pinning

logger = logging.getLogger(__name__)

RECONCILE_FAILED = "ReconcileFailed"
PROGRESS_RECHECK = 5.0


now = rfc3339.now
seconds_between = rfc3339.seconds_between


class SecretCache:
    """Secret data the store does not keep (it slims Secrets to metadata): read with a GET
    only when the Secret's resourceVersion, which the store does keep, changed. Kept in memory
    only, per owning object, and dropped when that object is gone (:meth:`forget`)."""

    def __init__(self) -> None:
        self._data: dict[
            tuple[str, str, str, frozenset[str] | None], tuple[str, dict[str, str]]
        ] = {}
        """(namespace, owner, Secret, the keys kept) -> (resourceVersion, data)."""

    async def read(
        self, scope: Scope, name: str, *, keys: frozenset[str] | None = None
    ) -> dict[str, str] | None:
        """The decoded data of the Secret ``name`` beside ``scope``'s object, or None while it
        does not exist. With ``keys``, only those are kept (a CA certificate read from a
        Secret that also holds a private key keeps no copy of the key); each ``keys`` is
        kept apart."""
        observed = scope.observed("Secret", name)
        if observed is None:
            return None
        version = str(observed["metadata"].get("resourceVersion", ""))
        cached = self._data.get((scope.namespace, scope.name, name, keys))
        if cached is not None and cached[0] == version:
            return cached[1]
        found = await scope.kube.get("v1", "Secret", scope.namespace, name)
        if found is None:
            return None
        return self._keep(scope, name, version, found, keys)

    def remember(
        self, scope: Scope, secret: Body, *, keys: frozenset[str] | None = None
    ) -> dict[str, str]:
        """Keep the data of a Secret this reconcile just wrote (the API server's response
        carries it), as :meth:`read` would after a GET: a Secret the operator made is not
        read back. ``keys`` as :meth:`read` is called with for that Secret."""
        metadata = secret["metadata"]
        version = str(metadata.get("resourceVersion", ""))
        return self._keep(scope, metadata["name"], version, secret, keys)

    def _keep(
        self, scope: Scope, name: str, version: str, secret: Body, keys: frozenset[str] | None
    ) -> dict[str, str]:
        data: dict[str, str] = {}
        for field, value in (secret.get("data") or {}).items():
            if keys is not None and field not in keys:
                continue
            try:
                data[field] = base64.b64decode(value).decode()
            except ValueError:
                continue  # not text: no credential of ours
        self._data[(scope.namespace, scope.name, name, keys)] = (version, data)
        return data

    def forget(self, namespace: str, owner: str) -> None:
        for key in [k for k in self._data if k[:2] == (namespace, owner)]:
            del self._data[key]


IMMUTABLE_STATEFULSET_FIELDS: Final = (
    ".spec.volumeClaimTemplates",
    ".spec.selector",
    ".spec.serviceName",
    ".spec.podManagementPolicy",
)
"""StatefulSet fields the API server refuses to change; a change to any of them is made by
deleting the StatefulSet with orphan propagation (its pods keep running) and recreating it."""
IMMUTABLE_FIELDS: Final = {"StatefulSet": IMMUTABLE_STATEFULSET_FIELDS}
"""Per kind of child, the fields :func:`converge` changes by recreation."""


def hold_scale_down(
    scope: Scope, desired: list[Body], *, wanted: int, primary: str | None, pods: list[Body]
) -> int | None:
    """A StatefulSet scales down by removing its highest ordinals: never the primary, and
    never while the primary is unknown (a failover under way: any running pod above the cut
    may be it; pods that never ran cannot be, so a cluster whose pods do not fit still scales
    down). Either way the desired StatefulSet keeps the ordinals up to that pod, and
    Progressing says why. Returns ``wanted`` when the known primary must move below it first
    (the caller switches over), None otherwise."""
    observed = scope.observed("StatefulSet", scope.name)
    have = int(((observed or {}).get("spec") or {}).get("replicas") or 0)
    if observed is None or wanted >= have:
        return None
    move: int | None = None
    if primary is not None:
        if meta.pod_ordinal(primary) < wanted:
            return None
        keep, move = meta.pod_ordinal(primary) + 1, wanted
        waiting = f"the primary {primary} to move below ordinal {wanted}"
    else:
        running = sorted(
            pod["metadata"]["name"]
            for pod in pods
            if (pod.get("status") or {}).get("phase") == "Running"
            and meta.pod_ordinal(pod["metadata"]["name"]) >= wanted
        )
        if not running:
            return None
        keep = max(meta.pod_ordinal(name) for name in running) + 1
        waiting = f"a known primary ({', '.join(running)} may be it)"
    for child in desired:
        if child["kind"] == "StatefulSet":
            child["spec"]["replicas"] = min(have, keep)
    scope.progressing.append(("Scaling", f"scaling to {wanted} waits for {waiting}"))
    return move


BRING_UP: Final = frozenset({"primaryPod"})
"""Status fields that are progress too while the object is being made (:func:`only_progress`)."""
STATUS_PACE_COMING_UP: Final = 600.0
"""Progress of an object being made is written at most this often: a new cluster takes two
status writes, its first and the one that says Ready, unless something goes wrong
(``Degraded``, written at once) or its bring-up outlasts ten minutes (a restore from a large
backup), the time Kubernetes gives a Deployment to make progress before it calls it stuck
(``progressDeadlineSeconds``). At two minutes, 1000 clusters coming up together on the
benchmark's machine (up to 8 minutes each) wrote 3.1 status patches each, 5 at most."""
PROGRESS_FIELDS: Final = frozenset({"readyReplicas", "replicaPods", "instances"})
"""Status fields that follow the pods (how many are ready, each member's state and lag) —
and the conditions' messages, which count them. A change of these alone is progress."""
STATUS_PACE: Final = 10.0
"""Progress is written at most this often per object: one patch per pod change while a
cluster comes up, and per Patroni heartbeat under writes (lag), told users nothing they
acted on. Everything else — phase, primary, a condition's status or reason, a failover,
a switchover, backups — is written at once, with the progress that came with it."""


class StatusPacer:
    """When each object's status was last written (in memory: after an operator restart the
    first change is written at once)."""

    def __init__(
        self, *, pace: float = STATUS_PACE, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.pace, self.clock = pace, clock
        self._written: dict[tuple[str, str], float] = {}

    def wait_left(self, namespace: str, name: str, pace: float | None = None) -> float:
        """Seconds until progress may be written again (0: now); ``pace`` instead of this
        pacer's own."""
        last = self._written.get((namespace, name))
        every = self.pace if pace is None else pace
        return 0.0 if last is None else max(0.0, last + every - self.clock())

    def wrote(self, namespace: str, name: str) -> None:
        self._written[(namespace, name)] = self.clock()

    def forget(self, namespace: str, name: str) -> None:
        self._written.pop((namespace, name), None)


def only_progress(current: Body, desired: Body, *, coming_up: bool = False) -> bool:
    """Whether ``desired`` differs from ``current`` in :data:`PROGRESS_FIELDS`, condition
    messages, and the reason of a ``Progressing`` that stays True alone (a condition's time
    moves only with its status). What is under way changing from one step to the next
    (Scaling, InstancesStarting, ...) is progress: a new cluster took a status write for
    each step it passed through on its way to Ready.

    ``coming_up``: the object is being made and stays so (its phase says it). Then the
    primary it elected and every condition but ``Degraded`` are progress too: its first
    status and the one that says it is ready are what users act on, and a problem."""

    def decisive(status: Body) -> Body:
        kept = {
            k: v
            for k, v in status.items()
            if k not in PROGRESS_FIELDS and v is not None and not (coming_up and k in BRING_UP)
        }
        kept["conditions"] = sorted(
            (str(c.get("type")), str(c.get("status")), _decisive_reason(c))
            for c in status.get("conditions") or []
            if not coming_up or c.get("type") == "Degraded"
        )
        return kept

    return decisive(current) == decisive(desired)


def _decisive_reason(condition: Body) -> str:
    if (condition.get("type"), condition.get("status")) == ("Progressing", "True"):
        return ""
    return str(condition.get("reason"))


def controlled_by_another(body: Body | None, uid: str | None) -> bool:
    """Whether ``body`` has a controller that is not the object ``uid`` — a child of a
    previous object of the same name, which garbage collection is about to delete."""
    if body is None or not uid:
        return False
    references = (body.get("metadata") or {}).get("ownerReferences") or []
    return any(ref.get("controller") and ref.get("uid") != uid for ref in references)


@dataclasses.dataclass(kw_only=True)
class Scope:
    """One reconcile's view of one object: its body, its observed children, and what the
    phases decided. Resources extend it with their own model and records."""

    body: Body
    kube: Kube
    store: ObjectStore
    now: str
    conditions: list[dict[str, Any]]
    notes: list[str] = dataclasses.field(default_factory=list)
    requeue_after: float | None = None
    degraded: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    progressing: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    secrets: SecretCache = dataclasses.field(default_factory=SecretCache)
    """Shared by one reconciler's scopes, so a Secret is read once per change."""
    status_pacer: StatusPacer = dataclasses.field(default_factory=StatusPacer)
    """Shared by one reconciler's scopes: when each object's status was last written."""
    operator_namespace: str = meta.OPERATOR_NAMESPACE
    """Where the operator runs: its namespace may reach the database pods (NetworkPolicy)."""
    image_pins: pinning.Pins = dataclasses.field(default_factory=dict)
    """The digests images run by (``--pin-image``): see :meth:`pinned`."""
    deferred: list[asyncio.Task[Any]] = dataclasses.field(default_factory=list)
    """Writes under way that no later phase reads (:meth:`defer`)."""

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.body["metadata"].get("namespace", ""))

    @property
    def generation(self) -> int:
        return int(self.body["metadata"].get("generation") or 0)

    def owned(self, kind: str) -> list[Body]:
        return self.store.owned_by(self.namespace, self.name, kind)

    def observed(self, kind: str, name: str) -> Body | None:
        return self.store.get(kind, self.namespace, name)

    def pinned(self, body: Body) -> Body:
        """``body`` with its containers' images pinned by digest, as everything the
        operator makes runs them (``specs.pinning``)."""
        return pinning.pin_images(body, self.image_pins)

    def forget(self, kind: str, name: str) -> None:
        """A child this reconcile deleted: gone from the store for later phases."""
        self.store.forget(kind, self.namespace, name)

    def observe(self, body: Body) -> None:
        """A child this reconcile changed: the store holds the new body for later phases."""
        self.store.observe(body)

    def defer(self, write: Awaitable[Any]) -> None:
        """Start ``write`` and go on: a write whose result no later phase reads (the
        finalizer, a serving certificate) overlaps the next phases' round trips instead of
        adding its own. :func:`converge` waits for every deferred write before it makes a
        child (no StatefulSet before the finalizer that guards its data, no pod before its
        certificate), and the reconcile before its status (:meth:`settle`)."""
        self.deferred.append(asyncio.ensure_future(write))

    async def settle(self) -> None:
        """Wait for every deferred write; when one failed, raise the first failure, once all
        have ended (each that succeeded has updated the store)."""
        pending, self.deferred = self.deferred, []
        results = await asyncio.gather(*pending, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def abandon(self) -> None:
        """Wait for every deferred write after a phase failed; their own failures are left
        to the retry, which observes afresh."""
        pending, self.deferred = self.deferred, []
        for result in await asyncio.gather(*pending, return_exceptions=True):
            if isinstance(result, Exception):
                logger.debug("a deferred write failed too: %s", result)

    def requeue(self, seconds: float) -> None:
        if self.requeue_after is None or seconds < self.requeue_after:
            self.requeue_after = seconds

    def set_condition(self, type: str, status: bool | None, reason: str, message: str) -> None:
        self.conditions = cond.set_condition(
            self.conditions,
            type=type,
            status=status,
            reason=reason,
            message=message,
            generation=self.generation,
            now=self.now,
        )

    async def event(self, reason: str, message: str, *, warning: bool = False) -> None:
        await self.kube.event(self.body, reason=reason, message=message, warning=warning)

    async def degrade(self, reason: str, message: str) -> None:
        """Say ``message`` in ``Degraded`` (this reconcile's status) and, once, in a Warning
        Event: not again while the condition the object carries already says it (the
        condition joins every problem's message, so each is announced once however many
        there are, and again only when its message changes)."""
        if not any(r == reason and m == message for r, m in self.degraded):
            previous = cond.get_condition(self.conditions, "Degraded") or {}
            said = previous.get("status") == "True" and message in previous.get("message", "")
            if not said:
                await self.event(reason, message, warning=True)
        self.degraded.append((reason, message))

    def summarize(self, settled: str) -> None:
        """Progressing and Degraded from what the phases noted: the first reason, every
        message; ``settled`` says what a resource with nothing in progress looks like."""
        if self.progressing:
            reason = self.progressing[0][0]
            message = "; ".join(m for _, m in self.progressing)
            self.set_condition("Progressing", True, reason, message)
        else:
            self.set_condition("Progressing", False, "Stable", settled)
        if self.degraded:
            reason = self.degraded[0][0]
            self.set_condition("Degraded", True, reason, " ".join(m for _, m in self.degraded))
        else:
            self.set_condition("Degraded", False, "AsExpected", "nothing is wrong")


S = TypeVar("S", bound=Scope)
Phase = Callable[[S], Awaitable[str | None]]
"""One step of a reconcile: returns a sentence saying what it did or why it waits."""


async def report_failure(
    scope: Scope, error: BaseException, write_status: Callable[[], Awaitable[None]]
) -> None:
    """Put a failed reconcile where the user looks: ``Degraded/ReconcileFailed`` and a
    Warning Event (once per distinct message: the queue's backoff retries would otherwise
    repeat it). The next successful reconcile recomputes Degraded and so clears it."""
    if is_conflict(error):
        return
    message = failure_message(error)
    previous = cond.get_condition(scope.conditions, "Degraded") or {}
    scope.degraded.insert(0, (RECONCILE_FAILED, message))
    try:
        await write_status()
        if previous.get("reason") != RECONCILE_FAILED or previous.get("message") != message:
            await scope.event(RECONCILE_FAILED, message, warning=True)
    except Exception as failure:
        if transient(failure):
            logger.warning("could not report the failed reconcile in status: %s", failure)
        else:
            logger.exception("could not report the failed reconcile in status")


# --- phases every resource shares ---------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Credential:
    """A Secret of generated passwords the operator makes once: ``build`` makes it with fresh
    ones. ``held_by_data``: the data holds these passwords, so while data volumes exist a
    missing copy is never generated again (that would lock everyone out)."""

    name: str
    build: Callable[[], Body]
    held_by_data: bool = True


@dataclasses.dataclass
class Credentials:
    """What :func:`ensure_credentials` did: the Secrets it made; why it waits (None: it does
    not); the Secrets that are missing while data holds their passwords (Degraded says so)."""

    made: list[str]
    waiting: str | None = None
    unrecoverable: list[str] = dataclasses.field(default_factory=list)


async def ensure_credentials(
    scope: Scope,
    owner_uid: str | None,
    wanted: Iterable[Credential],
    claims: list[Body],
    *,
    kind: str,
) -> Credentials:
    """Make the generated Secrets that do not exist yet, the same way for every resource.

    ``claims`` are the owner's data volumes; ``kind`` names the owner in messages. Two cases
    wait, making nothing, because a password generated then would not open the data: Secrets
    still controlled by a deleted object of the same name (garbage collection is about to
    take them), and volumes of such an object on their way out while ours do not exist yet
    (asked of the API server, not only remembered: a deletion the watch missed would wait
    forever)."""
    wanted = list(wanted)
    stale = [
        c.name for c in wanted if controlled_by_another(scope.observed("Secret", c.name), owner_uid)
    ]
    if stale:
        return Credentials(
            [], f"waiting for the previous {kind}'s {', '.join(stale)} to be garbage-collected"
        )
    live = [c for c in claims if not c["metadata"].get("deletionTimestamp")]
    going = sorted(c["metadata"]["name"] for c in claims if c["metadata"].get("deletionTimestamp"))
    missing = [c for c in wanted if c.held_by_data and scope.observed("Secret", c.name) is None]
    if missing and going and not live:
        for name in list(going):
            if await scope.kube.get("v1", "PersistentVolumeClaim", scope.namespace, name) is None:
                scope.forget("PersistentVolumeClaim", name)
                going.remove(name)
    if missing and going and not live:
        # A deleted object's volumes, going with it: no data of ours. Taken for ours, they
        # refused new passwords, and the volumes made meanwhile then did hold data that no
        # password opened (found by a clean-clone run of the restore story).
        message = f"waiting for the previous {kind}'s volumes {', '.join(going)} to be deleted"
        scope.progressing.append(("PreviousVolumesGoing", message))
        return Credentials([], message)
    result = Credentials([])
    making: list[Credential] = []
    for credential in wanted:
        if scope.observed("Secret", credential.name) is not None:
            continue
        if credential.held_by_data and live:
            await scope.degrade(
                "SecretMissing",
                f"Secret {credential.name} is missing but the data volumes exist; restore the"
                " Secret from your backup of it. Stateward does not generate new passwords for"
                " existing data.",
            )
            result.unrecoverable.append(credential.name)
            continue
        making.append(credential)
    # Independent of each other: made together, one round trip instead of one each. What
    # was made is kept even when another create failed (the store must not miss a write).
    outcomes = await asyncio.gather(
        *(scope.kube.create(c.build()) for c in making), return_exceptions=True
    )
    failures: list[BaseException] = []
    for credential, created in zip(making, outcomes, strict=True):
        if isinstance(created, ApiError) and created.status.code == 409:
            continue  # made a moment ago by another reconcile: the store sees it shortly
        if isinstance(created, BaseException):
            failures.append(created)
            continue
        scope.observe(created)
        result.made.append(credential.name)
    if failures:
        raise failures[0]
    if result.made:
        await scope.event("SecretCreated", f"Generated credentials in {', '.join(result.made)}")
    return result


async def ensure_finalizer(scope: Scope, finalizer: str) -> str | None:
    """Add ``finalizer``, deferred (:meth:`Scope.defer`): it guards data, so it only has to
    be in place before the first child is made, and a new object's first writes (its CA,
    its Secrets) go out meanwhile."""
    finalizers = list(scope.body["metadata"].get("finalizers") or [])
    if finalizer in finalizers:
        return None

    async def add() -> None:
        # resourceVersion makes this an optimistic write: a concurrent change to the list
        # fails with a conflict and is retried from fresh observations, not overwritten.
        patched = await scope.kube.patch(
            Ref.of(scope.body),
            {
                "metadata": {
                    "finalizers": [*finalizers, finalizer],
                    "resourceVersion": scope.body["metadata"]["resourceVersion"],
                }
            },
        )
        scope.store.observe(patched)
        scope.body = patched

    scope.defer(add())
    return "added the finalizer"


async def remove_finalizer(scope: Scope, finalizer: str) -> None:
    """Drop ``finalizer``, only from the body this reconcile saw (a test of the
    resourceVersion): a change made meanwhile is seen by the next reconcile first."""
    finalizers = [f for f in scope.body["metadata"].get("finalizers") or [] if f != finalizer]
    await scope.kube.patch(
        Ref.of(scope.body),
        [
            {
                "op": "test",
                "path": "/metadata/resourceVersion",
                "value": scope.body["metadata"]["resourceVersion"],
            },
            {"op": "replace", "path": "/metadata/finalizers", "value": finalizers},
        ],
        json_patch=True,
    )


async def converge(scope: Scope, desired: Iterable[Body]) -> str | None:
    """Apply every desired child whose observed state does not contain it, or that was last
    applied from another desired object (a field we stopped setting is pruned so).

    A change to a field the API server refuses to change (:data:`IMMUTABLE_FIELDS`) is made
    by deleting the object with orphan propagation (a StatefulSet's pods keep running) and
    applying it anew. The applies go out concurrently; one Event names
    everything created and one everything repaired.
    """
    await scope.settle()  # the finalizer and the certificates come before any child
    created: list[str] = []
    updated: list[str] = []
    pending: list[Body] = []
    for unpinned in desired:
        built = scope.pinned(unpinned)
        kind, name = built["kind"], built["metadata"]["name"]
        fixed = IMMUTABLE_FIELDS.get(kind, ())
        # The whole desired body's digest: an object version found to contain it once still
        # does (the store's memo spares decoding and comparing it again).
        whole = diff.applied_hash(built)
        if scope.store.contained(kind, scope.namespace, name, whole):
            continue
        # A removal from the immutable fields could never be applied; those change by
        # recreation, which containment detects.
        child = diff.stamped(built, exclude=fixed, known=None if fixed else whole)
        observed = scope.observed(kind, name)
        if observed is None:
            created.append(f"{kind} {name}")
            pending.append(child)
            continue
        drift = diff.drift(observed, child)
        if not drift:
            scope.store.remember_contained(observed, whole)
            continue
        if any(path.startswith(field) for path in drift for field in fixed):
            await scope.kube.delete(Ref.of(observed), orphan=True)
            scope.forget(kind, name)
            await scope.event(
                f"{kind}Recreated",
                f"Recreating {kind} {name} to change immutable fields"
                f" ({', '.join(drift[:5])}); its pods keep running",
            )
        updated.append(f"{kind} {name} ({', '.join(drift[:5])})")
        pending.append(child)
    # Keep what succeeded even when one apply fails: the store must not forget a write that
    # happened, or the next reconcile would see drift that is not there.
    applying: dict[tuple[str, str], asyncio.Task[Body]] = {}
    for child in pending:
        if child["kind"] != "RoleBinding":
            key = (child["kind"], child["metadata"]["name"])
            applying[key] = asyncio.ensure_future(scope.kube.apply(child))
    for child in pending:
        if child["kind"] == "RoleBinding":
            key = (child["kind"], child["metadata"]["name"])
            applying[key] = asyncio.ensure_future(_apply_binding(scope, child, applying))
    results: list[Body | BaseException] = await asyncio.gather(
        *applying.values(), return_exceptions=True
    )
    failures = [r for r in results if isinstance(r, BaseException)]
    for applied in results:
        if not isinstance(applied, BaseException):
            scope.store.observe(applied)
    if failures:
        raise failures[0]
    if created:
        await scope.event("Created", f"Created {', '.join(created)}")
    if updated:
        await scope.event("Updated", f"Repaired or updated {'; '.join(updated)}")
    notes = [f"created {', '.join(created)}"] if created else []
    notes += [f"updated {'; '.join(updated)}"] if updated else []
    return "; ".join(notes) or None


async def _apply_binding(
    scope: Scope, binding: Body, applying: dict[tuple[str, str], asyncio.Task[Body]]
) -> Body:
    """Apply a RoleBinding once the Role it binds, when that is being applied too, has been:
    the API server lets a user without ``bind`` create a RoleBinding only after checking that
    it holds every right of the bound Role, so the Role must exist first. Each binding waits
    for its own Role only, not for the slowest child."""
    ref = binding.get("roleRef") or {}
    role = applying.get(("Role", str(ref.get("name")))) if ref.get("kind") == "Role" else None
    if role is not None:
        await asyncio.wait([role])  # its failure is reported by the caller, not twice
    return await scope.kube.apply(binding)


def quantity(text: str) -> Decimal:
    value = validation.parse_quantity(text)
    if value is None:  # admission refuses such sizes; an old stored object may still hold one
        raise ValueError(f"not a quantity: {text!r}")
    return value


async def expand_volumes(scope: Scope, claims: Iterable[Body], size: str) -> str | None:
    """Grow every claim below ``size`` in place (the StorageClass must allow expansion)."""
    wanted = quantity(size)
    expanded: list[str] = []
    for claim in claims:
        requested = claim["spec"]["resources"]["requests"]["storage"]
        capacity = ((claim.get("status") or {}).get("capacity") or {}).get("storage")
        if quantity(requested) < wanted:
            patched = await scope.kube.patch(
                Ref.of(claim), {"spec": {"resources": {"requests": {"storage": size}}}}
            )
            scope.store.observe(patched)
            expanded.append(claim["metadata"]["name"])
        elif capacity is not None and quantity(capacity) < wanted:
            scope.progressing.append(
                ("VolumeResizing", f"PVC {claim['metadata']['name']} is growing to {requested}")
            )
            scope.requeue(PROGRESS_RECHECK)
    if expanded:
        await scope.event("VolumeExpansion", f"Expanding {', '.join(expanded)} to {size}")
        scope.progressing.append(("VolumeResizing", f"expanding {', '.join(expanded)}"))
        scope.requeue(PROGRESS_RECHECK)
        return f"expanding {', '.join(expanded)}"
    return None


# --- status --------------------------------------------------------------------------------


async def patch_status(scope: Scope, status: dict[str, Any], *, coming_up: bool = False) -> None:
    """Make ``status`` the object's status with one patch, and none when it already is. A
    change that is only progress waits out :data:`STATUS_PACE` since the last write (the
    reconcile is requeued for then, and writes what it observes then); while the object is
    ``coming_up`` (being made, and still), :data:`STATUS_PACE_COMING_UP`."""
    status = {k: v for k, v in status.items() if v is not None}
    current = dict(scope.body.get("status") or {})
    if status == {k: v for k, v in current.items() if k in status} and set(current) <= set(status):
        return
    if only_progress(current, status, coming_up=coming_up):
        pace = STATUS_PACE_COMING_UP if coming_up else None
        wait = scope.status_pacer.wait_left(scope.namespace, scope.name, pace)
        if wait > 0:
            scope.requeue(wait)
            return
    patch = {"status": replacing_patch(current, status)}
    await scope.kube.settle_events(scope.body)  # what a status says was told in an Event first
    patched = await scope.kube.patch(Ref.of(scope.body), patch, status=True)
    scope.store.observe(patched)
    scope.status_pacer.wrote(scope.namespace, scope.name)


def replacing_patch(current: Body, desired: Body) -> Body:
    """A JSON merge patch that makes ``current`` equal to ``desired``: a merge patch merges
    nested objects, so every key ``desired`` lacks is nulled, at every depth (a new failover
    record must not keep the last one's cause). Lists are replaced whole anyway."""
    patch: Body = {k: None for k in current if k not in desired}
    for key, value in desired.items():
        before = current.get(key)
        if isinstance(value, dict) and isinstance(before, dict):
            patch[key] = replacing_patch(before, value)
        else:
            patch[key] = value
    return patch


def failure_message(error: BaseException) -> str:
    """What a user may read about a failed reconcile: the API server's own words for API
    errors (they name objects, fields and quotas, never secret values), only the exception's
    type otherwise (its text could carry anything)."""
    if isinstance(error, ApiError):
        status = error.status
        return f"the API server refused a write: {status.code} {status.reason}: {status.message}"
    return f"{type(error).__name__} while reconciling; the operator log has the details"


NAMESPACE_TERMINATING_RETRY = 5.0
"""A reconcile refused by a terminating namespace tries again this much later: its object's
finalizer may still have work (the namespace waits for it), without the backoff's ERROR."""


def namespace_terminating(error: BaseException) -> bool:
    """A write the API server refused because the namespace is being deleted: the normal end
    of everything in it, not a failure worth an ERROR line or a Warning Event."""
    if not isinstance(error, ApiError) or error.status.code != 403:
        return False
    return "because it is being terminated" in str(getattr(error.status, "message", "") or "")


def object_gone(error: BaseException, plural: str, name: str) -> bool:
    """A write about the reconciled object itself found it gone (its finalizer removed, the
    garbage collector quicker than the reconcile): nothing is left to do or to report."""
    if not isinstance(error, ApiError) or error.status.code != 404:
        return False
    message = str(getattr(error.status, "message", "") or "")
    return f'{plural}.{v1alpha1.GROUP} "{name}" not found' in message


def expected_end(error: BaseException, plural: str, namespace: str, name: str) -> Outcome | None:
    """The outcome of a reconcile that failed only because its namespace or its object is
    going away — one INFO line, no Warning, no backoff — or None for a real failure."""
    if namespace_terminating(error):
        logger.info("%s/%s: its namespace is being deleted", namespace, name)
        return Outcome(requeue_after=NAMESPACE_TERMINATING_RETRY)
    if object_gone(error, plural, name):
        logger.info("%s/%s: gone", namespace, name)
        return Outcome()
    return None


def is_conflict(error: BaseException) -> bool:
    """An optimistic write lost a race: the retry, from fresh observations, fixes it."""
    return isinstance(error, ApiError) and error.status.code == 409
