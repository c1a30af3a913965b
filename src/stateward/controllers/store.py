"""What the operator last observed, fed by watch events; reconciles read from here.

Each entry is the newest body seen for one object (by resourceVersion order of arrival, and a
write's response counts as an observation). Objects are indexed by the cluster that owns them
through the ``stateward.io/cluster`` label, so a reconcile finds its children without a list
call. Bodies are slimmed to what reconciles read (see ``_slim``); Secret values are never
kept.

Each body is kept as compact JSON text and decoded on every read: at a thousand clusters
(22,000 objects) the bodies took about 120 MiB as Python dicts and take 24 MiB as text, and
the decoding (tens of microseconds a body) costs a reconcile little. Every read also returns
a copy of its own, so no caller can change what the store holds.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable
from typing import Any

CLUSTER_LABEL = "stateward.io/cluster"
Body = dict[str, Any]
Key = tuple[str, str, str]  # (kind, namespace, name)


def _key(body: Body) -> Key:
    metadata = body["metadata"]
    return body["kind"], metadata.get("namespace", ""), metadata["name"]


TOMBSTONE_SECONDS = 600.0
"""How long a deleted object's uid is remembered: far longer than any watch event can be late
(a watch restarted from an older resourceVersion replays within seconds)."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Entry:
    """One stored object: what the store itself compares and indexes by, and the packed body."""

    uid: str | None
    version: str | None
    owner: str | None
    packed: str


def _pack(body: Body) -> _Entry:
    metadata = body["metadata"]
    return _Entry(
        uid=metadata.get("uid"),
        version=metadata.get("resourceVersion"),
        owner=(metadata.get("labels") or {}).get(CLUSTER_LABEL),
        packed=json.dumps(_slim(body), separators=(",", ":")),
    )


def _unpack(entry: _Entry) -> Body:
    body: Body = json.loads(entry.packed)
    return body


class ObjectStore:
    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._objects: dict[Key, _Entry] = {}
        self._by_cluster: defaultdict[tuple[str, str], set[Key]] = defaultdict(set)
        self._clock = clock
        self._tombstones: OrderedDict[str, float] = OrderedDict()
        """uid -> when its DELETED event came, oldest first."""
        self._contains: dict[Key, tuple[str, str]] = {}
        """key -> (resourceVersion, digest of a desired body) found contained in that version
        (:meth:`contained`)."""

    def observe(self, body: Body) -> None:
        """Record a body seen in a watch event or returned by a write. A body of an object
        whose deletion was seen is a late event: it would bring the object back."""
        uid = body["metadata"].get("uid")
        if uid and uid in self._tombstones:
            return
        key = _key(body)
        previous = self._objects.get(key)
        if previous is not None and (_older(body, previous) or _same(body, previous)):
            return
        self._unindex(key)
        self._contains.pop(key, None)
        entry = self._objects[key] = _pack(body)
        if entry.owner:
            self._by_cluster[(key[1], entry.owner)].add(key)

    def deleted(self, body: Body) -> None:
        """A DELETED watch event: the object is gone, and stays gone whatever arrives late
        about it (a new object of the same name has another uid)."""
        metadata = body["metadata"]
        previous = self._objects.get(_key(body))
        if previous is None or previous.uid == metadata.get("uid"):
            self.forget(body["kind"], metadata.get("namespace", ""), metadata["name"])
        uid = metadata.get("uid")
        if uid:
            now = self._clock()
            self._tombstones[uid] = now
            self._tombstones.move_to_end(uid)
            while self._tombstones and next(iter(self._tombstones.values())) < now - (
                TOMBSTONE_SECONDS
            ):
                self._tombstones.popitem(last=False)

    def forget(self, kind: str, namespace: str, name: str) -> None:
        """Drop an object from the store (one this operator just deleted: events about it,
        such as its termination, still count until its DELETED event)."""
        key = (kind, namespace, name)
        self._unindex(key)
        self._objects.pop(key, None)
        self._contains.pop(key, None)

    def contained(self, kind: str, namespace: str, name: str, digest: str) -> bool:
        """Whether the stored version of the object was found to contain the desired body
        whose digest is ``digest`` (:meth:`remember_contained`): containment depends on
        nothing else, so it need not be decoded and compared again until either changes.
        (Most reconciles of a cluster change none of its children.)"""
        key = (kind, namespace, name)
        entry = self._objects.get(key)
        return (
            entry is not None
            and entry.version is not None
            and self._contains.get(key) == (entry.version, digest)
        )

    def remember_contained(self, body: Body, digest: str) -> None:
        """``body``, the stored version of its object, contains the desired body of ``digest``."""
        key = _key(body)
        entry = self._objects.get(key)
        version = body["metadata"].get("resourceVersion")
        if entry is not None and version is not None and entry.version == version:
            self._contains[key] = (version, digest)

    def _unindex(self, key: Key) -> None:
        previous = self._objects.get(key)
        if previous is not None and previous.owner:
            self._by_cluster[(key[1], previous.owner)].discard(key)

    def get(self, kind: str, namespace: str, name: str) -> Body | None:
        """A copy of the newest body seen, or None."""
        entry = self._objects.get((kind, namespace, name))
        return None if entry is None else _unpack(entry)

    def holds(self, body: Body) -> bool:
        """Whether this very version of the object is stored already, without decoding
        anything: the watch's echo of a write whose response was observed (most events
        while clusters are being created) brings nothing new."""
        entry = self._objects.get(_key(body))
        return entry is not None and _same(body, entry)

    def has(self, kind: str, namespace: str, name: str) -> bool:
        """Whether a body is stored, without decoding it (the watch path asks this for every
        child event)."""
        return (kind, namespace, name) in self._objects

    def version(self, kind: str, namespace: str, name: str) -> str | None:
        """The stored body's resourceVersion, without decoding it (None: none stored, or
        it had none): a reader that keeps what it derived from a body knows when it is stale."""
        entry = self._objects.get((kind, namespace, name))
        return None if entry is None else entry.version

    def owned_by(self, namespace: str, cluster: str, kind: str) -> list[Body]:
        keys = sorted(k for k in self._by_cluster.get((namespace, cluster), ()) if k[0] == kind)
        return [_unpack(self._objects[k]) for k in keys]

    def names(self, kind: str) -> list[tuple[str, str]]:
        return sorted((ns, name) for (k, ns, name) in self._objects if k == kind)

    def __len__(self) -> int:
        return len(self._objects)


def _slim(body: Body) -> Body:
    """A copy of ``body`` without what no reconcile reads.

    At a thousand clusters the store holds tens of thousands of bodies, so this is most of
    the operator's memory: managedFields go everywhere; Pods keep metadata, their node,
    phase, IP, conditions and a summary of each container's state; Secrets keep no data at
    all (the reconciler only asks whether a Secret exists, and secret values then never sit
    in the operator's memory).
    """
    # No copies: the result is serialized at once (``_pack``) and never kept.
    metadata = {k: v for k, v in body["metadata"].items() if k != "managedFields"}
    kind = body.get("kind")
    if kind == "Pod":
        status = body.get("status") or {}
        return {
            "apiVersion": body.get("apiVersion"),
            "kind": kind,
            "metadata": metadata,
            # The node: an out-of-service node proves its primary cannot write (takeover).
            "spec": {"nodeName": (body.get("spec") or {}).get("nodeName")},
            "status": {
                "phase": status.get("phase"),
                "podIP": status.get("podIP"),
                "containerStatuses": [
                    _slim_container(c) for c in status.get("containerStatuses") or []
                ],
                "conditions": status.get("conditions") or [],
            },
        }
    if kind == "Secret":
        return {
            "apiVersion": body.get("apiVersion"),
            "kind": kind,
            "metadata": metadata,
            "type": body.get("type"),
        }
    slim = {k: v for k, v in body.items() if k != "metadata"}
    slim["metadata"] = metadata
    return slim


def _older(candidate: Body, current: _Entry) -> bool:
    """True when ``candidate`` is an older version than ``current`` of the same object.

    Kubernetes made resourceVersions comparable in v1.35 (KEP-5504): a well-formed one is a
    decimal integer without leading zeros, and for two of the same resource the longer is
    newer, then the lexicographically greater. Anything else is compared for equality only,
    so the later arrival wins, as an informer would take it.
    """
    if candidate["metadata"].get("uid") != current.uid:
        return False
    left = candidate["metadata"].get("resourceVersion")
    right = current.version
    if not (_comparable(left) and _comparable(right)):
        return False
    assert isinstance(left, str) and isinstance(right, str)
    return (len(left), left) < (len(right), right)


def _same(candidate: Body, current: _Entry) -> bool:
    """True when ``candidate`` is the stored version itself (same uid, same resourceVersion):
    the API server gives every change a new resourceVersion, so the body is the same too."""
    metadata = candidate["metadata"]
    version = metadata.get("resourceVersion")
    return version is not None and version == current.version and metadata.get("uid") == current.uid


def _comparable(version: object) -> bool:
    return (
        isinstance(version, str)
        and version.isascii()
        and version.isdigit()
        and not version.startswith("0")
    )


_TERMINATED_KEYS = ("reason", "exitCode", "finishedAt")


def _slim_container(status: Body) -> Body:
    """Whether a container runs, why it waits (image pull, config, crash loop: reported for
    pods that never start), and how it last ended (a container that terminated after its
    leader lock's last renewal proves its primary cannot write)."""
    state = status.get("state") or {}
    kept: Body = {"name": status.get("name"), "restartCount": status.get("restartCount", 0)}
    if "waiting" in state:
        kept["state"] = {"waiting": state["waiting"]}
    elif "terminated" in state:
        ended = state["terminated"] or {}
        # The message too: a backup pod's report of what pgBackRest did (at most 4 KiB).
        keys = (*_TERMINATED_KEYS, "message")
        kept["state"] = {"terminated": {k: ended[k] for k in keys if k in ended}}
    elif "running" in state:
        kept["state"] = {"running": {}}
    last = (status.get("lastState") or {}).get("terminated")
    if last:
        kept["lastState"] = {"terminated": {k: last[k] for k in _TERMINATED_KEYS if k in last}}
    return kept
