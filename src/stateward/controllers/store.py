"""What the operator last observed, fed by watch events; reconciles read from here.

Each entry is the newest body seen for one object (by resourceVersion order of arrival, and a
write's response counts as an observation). Objects are indexed by the cluster that owns them
through the ``stateward.io/cluster`` label, so a reconcile finds its children without a list
call. The store holds bodies of every kind the operator watches, Secrets included: secret
values are never logged from here.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from typing import Any

CLUSTER_LABEL = "stateward.io/cluster"
Body = dict[str, Any]
Key = tuple[str, str, str]  # (kind, namespace, name)


def _key(body: Body) -> Key:
    metadata = body["metadata"]
    return body["kind"], metadata.get("namespace", ""), metadata["name"]


class ObjectStore:
    def __init__(self) -> None:
        self._objects: dict[Key, Body] = {}
        self._by_cluster: defaultdict[tuple[str, str], set[Key]] = defaultdict(set)

    def observe(self, body: Body) -> None:
        """Record a body seen in a watch event or returned by a write."""
        key = _key(body)
        previous = self._objects.get(key)
        if previous is not None and _older(body, previous):
            return
        self._unindex(key)
        stored = copy.deepcopy(body)
        # managedFields are often the largest part of a body and no reconcile reads them.
        stored["metadata"].pop("managedFields", None)
        self._objects[key] = stored
        owner = (body["metadata"].get("labels") or {}).get(CLUSTER_LABEL)
        if owner:
            self._by_cluster[(key[1], owner)].add(key)

    def forget(self, kind: str, namespace: str, name: str) -> None:
        key = (kind, namespace, name)
        self._unindex(key)
        self._objects.pop(key, None)

    def _unindex(self, key: Key) -> None:
        previous = self._objects.get(key)
        if previous is None:
            return
        owner = (previous["metadata"].get("labels") or {}).get(CLUSTER_LABEL)
        if owner:
            self._by_cluster[(key[1], owner)].discard(key)

    def get(self, kind: str, namespace: str, name: str) -> Body | None:
        return self._objects.get((kind, namespace, name))

    def owned_by(self, namespace: str, cluster: str, kind: str) -> list[Body]:
        keys = sorted(k for k in self._by_cluster.get((namespace, cluster), ()) if k[0] == kind)
        return [self._objects[k] for k in keys]

    def names(self, kind: str) -> list[tuple[str, str]]:
        return sorted((ns, name) for (k, ns, name) in self._objects if k == kind)

    def __len__(self) -> int:
        return len(self._objects)


def _older(candidate: Body, current: Body) -> bool:
    """True when ``candidate`` is an older version than ``current`` of the same object."""
    if candidate["metadata"].get("uid") != current["metadata"].get("uid"):
        return False
    try:
        return int(candidate["metadata"]["resourceVersion"]) < int(
            current["metadata"]["resourceVersion"]
        )
    except (KeyError, ValueError):
        return False
