"""The data plane as Patroni reports it: member records, roles, lag and switchover candidates.

Patroni writes each member's record into its pod's ``status`` annotation (the same record its
``/cluster`` endpoint serves: state, role, timeline, WAL position) and the synchronous
standbys into the ``NAME-sync`` ConfigMap. The operator already watches the pods, so it reads
the data plane from there, computing lag exactly as Patroni's ``/cluster`` does (the primary's
WAL position minus the member's), without a request to any pod. Everything here is pure.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

from stateward.specs import meta

Body = dict[str, Any]

PRIMARY = "primary"
SYNC_STANDBY = "sync_standby"
QUORUM_STANDBY = "quorum_standby"
REPLICA = "replica"
STREAMING = "streaming"


@dataclasses.dataclass(frozen=True)
class Member:
    """One instance pod and Patroni's record of it."""

    name: str
    uid: str
    ordinal: int
    label_role: str | None
    ready: bool
    address: str | None
    state: str | None
    timeline: int | None
    wal_position: int | None
    replication_state: str | None
    pending_restart: bool

    @property
    def is_primary(self) -> bool:
        return self.label_role == meta.PRIMARY_ROLE

    @property
    def streaming(self) -> bool:
        """A replica receiving WAL from the primary right now."""
        return self.label_role == meta.REPLICA_ROLE and self.replication_state == STREAMING


def _ordinal(name: str) -> int:
    found = re.search(r"-([0-9]+)$", name)
    return int(found.group(1)) if found else -1


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def member(pod: Body) -> Member:
    metadata = pod["metadata"]
    raw = (metadata.get("annotations") or {}).get("status")
    try:
        record = json.loads(raw) if raw else {}
    except ValueError:
        record = {}
    if not isinstance(record, dict):
        record = {}
    status = pod.get("status") or {}
    return Member(
        name=metadata["name"],
        uid=str(metadata.get("uid", "")),
        ordinal=_ordinal(metadata["name"]),
        label_role=(metadata.get("labels") or {}).get(meta.ROLE_LABEL),
        ready=meta.pod_ready(pod),
        address=status.get("podIP"),
        state=record.get("state") if isinstance(record.get("state"), str) else None,
        timeline=_int(record.get("timeline")),
        wal_position=_int(record.get("xlog_location")),
        replication_state=(
            record.get("replication_state")
            if isinstance(record.get("replication_state"), str)
            else None
        ),
        pending_restart=bool(record.get("pending_restart")),
    )


def sync_standbys(annotations: Mapping[str, str] | None) -> frozenset[str]:
    """The synchronous standbys named in Patroni's ``NAME-sync`` ConfigMap annotations."""
    names = (annotations or {}).get("sync_standby") or ""
    return frozenset(n.strip() for n in names.split(",") if n.strip())


def primary(members: Iterable[Member]) -> Member | None:
    found = [m for m in members if m.is_primary]
    return found[0] if len(found) == 1 else None


def instances(
    members: Iterable[Member], sync: frozenset[str], *, sync_role: str = SYNC_STANDBY
) -> list[dict[str, Any]]:
    """``status.instances``: one entry per pod, by name, in Patroni's vocabulary (the
    replicas in ``sync`` get ``sync_role``: ``quorum_standby`` under quorum commit)."""
    members = sorted(members, key=lambda m: (m.ordinal, m.name))
    leader = primary(members)
    result = []
    for m in members:
        if m.is_primary:
            role: str | None = PRIMARY
        elif m.label_role == meta.REPLICA_ROLE:
            role = sync_role if m.name in sync else REPLICA
        else:
            role = None
        entry: dict[str, Any] = {
            "name": m.name,
            "role": role,
            "state": (m.replication_state if not m.is_primary else None) or m.state,
            "timeline": m.timeline,
            "pendingRestart": True if m.pending_restart else None,
        }
        if (
            not m.is_primary
            and leader is not None
            and leader.wal_position is not None
            and m.wal_position is not None
        ):
            entry["lagBytes"] = max(0, leader.wal_position - m.wal_position)
        result.append({k: v for k, v in entry.items() if v is not None})
    return result


def switchover_candidate(
    members: Iterable[Member],
    sync: frozenset[str],
    *,
    synchronous: bool,
    below_ordinal: int | None = None,
) -> tuple[str, bool] | None:
    """The replica to promote in a planned switchover, and whether it is a synchronous standby.

    The most up-to-date ready, streaming replica: a synchronous standby when synchronous
    replication is on (only those hold every acknowledged commit, and Patroni refuses a
    switchover to any other). ``below_ordinal`` restricts the choice to pods a scale-down
    keeps; if no synchronous standby is among them the best streaming replica there is
    returned with False, for a graceful failover (the old primary shuts down cleanly and
    sends every WAL record to its streaming replicas first).
    """
    eligible = [
        m
        for m in members
        if m.streaming and m.ready and (below_ordinal is None or m.ordinal < below_ordinal)
    ]
    if not eligible:
        return None

    def freshest(candidates: list[Member]) -> Member:
        return max(candidates, key=lambda m: (m.wal_position or 0, -m.ordinal))

    if synchronous:
        synced = [m for m in eligible if m.name in sync]
        if synced:
            return freshest(synced).name, True
        if below_ordinal is None:
            return None
        return freshest(eligible).name, False
    return freshest(eligible).name, True


PROGRESS_FIELDS: Final = frozenset({"xlog_location", "receive_lsn", "replay_lsn", "lag"})
"""Fields of a member's ``status`` annotation that move with every write: WAL positions."""
PROGRESS_ANNOTATIONS: Final = frozenset({"renewTime", "optime", "slots", "retain_slots"})
"""Annotations of the leader ConfigMap that move every HA loop or with every write: the
lock's renewal and WAL positions. (Who holds the lock, ``leader``, is not among them.)"""


UNREAD_ANNOTATIONS: Final = frozenset({"PersistentVolumeClaim"})
"""Kinds whose annotations no reconcile reads. A claim's are the scheduler's, the volume
controller's and the provisioner's bookkeeping (``volume.kubernetes.io/selected-node``,
``pv.kubernetes.io/bind-completed`` ...): two or three updates per claim while it binds, each
of which reconciled its cluster."""
UNREAD_STATUS: Final = frozenset({"PodDisruptionBudget"})
"""Kinds whose status no reconcile reads. A budget's status moves with every pod's
readiness (five updates per cluster while it comes up); the operator only applies its spec."""
READ_ONLY: Final[Mapping[str, Mapping[str, tuple[str, ...]]]] = {
    "PersistentVolumeClaim": {"spec": ("resources",), "status": ("capacity",)},
}
"""Kinds of which reconciles read only these fields besides the metadata. Of a claim: the
size requested and the capacity it has (growing a volume, ``core.expand_volumes``); its
binding — ``spec.volumeName``, ``status.phase``, access modes — made three more updates per
claim while a cluster came up, each of which reconciled it (at 100 x 3, 1,300 events of the
4,000 that woke a reconcile before every cluster was Ready). The store still keeps the
newest body, volume name included, for whatever reconcile runs next."""


def _meaningful(body: Mapping[str, Any]) -> dict[str, Any]:
    kind = body.get("kind")
    metadata = {
        k: v for k, v in body["metadata"].items() if k not in ("resourceVersion", "managedFields")
    }
    annotations = {
        k: v
        for k, v in (metadata.get("annotations") or {}).items()
        if k not in PROGRESS_ANNOTATIONS and kind not in UNREAD_ANNOTATIONS
    }
    raw = annotations.get("status")
    if isinstance(raw, str):
        try:
            record = json.loads(raw)
        except ValueError:
            record = None
        if isinstance(record, dict):
            annotations["status"] = {k: v for k, v in record.items() if k not in PROGRESS_FIELDS}
    metadata["annotations"] = annotations
    meaningful = {**body, "metadata": metadata}
    if kind in UNREAD_STATUS:
        meaningful.pop("status", None)
    read = READ_ONLY.get(str(kind))
    if read is not None:
        for section in set(meaningful) - {"apiVersion", "kind", "metadata"}:
            whole = meaningful.pop(section)
            if section in read and isinstance(whole, Mapping):
                meaningful[section] = {k: whole.get(k) for k in read[section]}
    return meaningful


def progress_only(previous: Mapping[str, Any], current: Mapping[str, Any]) -> bool:
    """Whether two versions of a child differ only in what moves with every write or every
    Patroni loop (WAL positions, the lock's renewal), or in what no reconcile reads (a
    claim's annotations, a budget's status): no reason to reconcile. A cluster under writes
    otherwise reconciled every two seconds; what does matter — a role, a state, the
    timeline, the lock's holder, readiness, a claim's size or capacity — still
    triggers one, and the store keeps the newest body for whatever reconcile runs next."""
    return _meaningful(previous) == _meaningful(current)
