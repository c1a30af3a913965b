"""When the operator may release a dead primary's leader lock, and what it saw fail.

Patroni promotes a replica only once the primary's leader lock (the ``NAME-leader``
ConfigMap) has gone unrenewed for ``ttl`` seconds (20 at the least), so a primary that dies
without releasing it costs at least that long in writes. The operator shortens the wait only
on *proof* that the lock holder can no longer accept writes, never on mere silence (a silent
primary may be partitioned and still running; only Patroni's ttl, which it also obeys itself
by demoting, is safe then):

* **the node is out of service**: ``node.kubernetes.io/out-of-service`` is Kubernetes'
  non-graceful node shutdown signal, set by an administrator or a fencing agent once the
  node is known to be off (Kubernetes itself then force-detaches its volumes);
* **the instance container terminated after the lock's last renewal**: every process of a
  container dies with its PID 1 (which ends when Patroni does), PostgreSQL included, so no
  process of that container can hold the primary role; the kubelet's ``finishedAt`` and Patroni's
  ``renewTime`` are both written by the same node's clock, so the comparison needs no
  clock agreement between machines;
* **the primary went silent under synchronous replication** (``Priority``): a synchronous
  standby that Patroni's ``NAME-sync`` record lists reports that its WAL receiver lost the
  primary (``wal_receiver_timeout``, 5 s, without a word from it), and the lock went
  unrenewed (:data:`SILENT_SECONDS` and :data:`UNRENEWED_SECONDS`, or by the API server's
  own stamps, :func:`served_unrenewed`). This is not proof that
  the primary is dead: a hung or partitioned primary may wake up. It is proof that it can
  no longer *acknowledge* a commit the standby lacks: every commit waits for every listed
  standby, the listed one that is promoted stops confirming, and only the old primary's
  Patroni could shorten the list, in a loop in which it renewed the lock, which the release
  makes impossible. Quorum commit (``ANY n``) keeps the ttl.

Releasing the lock is a write conditioned on the lock's resourceVersion: if the holder (or a
restarted container of it) renewed the lock since it was read, the write fails and nothing
is released.

Under ``Priority`` synchronous replication the release is preceded by Patroni's own
failover record (``NAME-failover``) naming a synchronous standby (:func:`handover`): the
standby then takes the lock in its first loop, as in a ``patronictl failover``, instead of
first asking every member's REST API for its WAL position — 2 s lost to the dead primary's,
which cannot answer. A member Patroni's ``NAME-sync`` record lists holds every acknowledged
commit, which is all that question would establish. Pure code; the safety argument is in
docs/architecture.md.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable, Mapping
from typing import Any, Final

from stateward import rfc3339
from stateward.controllers.postgres.members import STREAMING, Member
from stateward.instance import patroni
from stateward.specs import meta

Body = dict[str, Any]

OUT_OF_SERVICE_TAINT: Final = "node.kubernetes.io/out-of-service"
LEADER_ANNOTATION: Final = "leader"
RENEW_ANNOTATION: Final = "renewTime"

NODE_OUT_OF_SERVICE: Final = "NodeOutOfService"
CONTAINER_TERMINATED: Final = "ContainerTerminated"
PRIMARY_SILENT: Final = "PrimarySilent"

SILENT_SECONDS: Final = patroni.LOOP_WAIT + 1.0
"""How long the operator must read one and the same version of a silent primary's lock, by
its own monotonic clock, before it releases it: a live Patroni renews the lock every loop
(``loop_wait``, 2 s). (Patroni judges its own ttl the same way: by how long it has seen one
version, not by another machine's timestamps.)"""
UNRENEWED_SECONDS: Final = 2 * patroni.LOOP_WAIT + 1.0
"""And the lock's ``renewTime`` must be at least this old by the operator's wall clock: two
loops missed. The holder's clock wrote it, so a holder whose clock runs behind makes it look
older; the wait then falls back to :data:`SILENT_SECONDS` of the operator's own, which
alone already excludes a running Patroni. (The release is safe either way; the waits keep
it from failing over a primary that was only slow.)"""
RUNNING_STATE: Final = "running"
FAILOVER_LEADER: Final = "leader"
FAILOVER_CANDIDATE: Final = "member"
"""The annotations of Patroni's failover record (``NAME-failover``): from whom, to whom."""
WITHDRAW_HANDOVER: Final[Body] = {
    "metadata": {"annotations": {FAILOVER_LEADER: None, FAILOVER_CANDIDATE: None}}
}
"""The merge patch that empties the failover record again (as Patroni itself does)."""


@dataclasses.dataclass(frozen=True)
class Proof:
    """Why the lock holder cannot accept writes: a reason and the words for a user."""

    reason: str
    message: str


parse_time = rfc3339.parse


def container_status(pod: Body, container: str) -> Body:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return next((s for s in statuses if s.get("name") == container), {})


def termination(pod: Body, container: str) -> Body | None:
    """The kubelet's record of the container's last death, if it is not running now: its
    current ``terminated`` state, or the last one while it waits to be started again."""
    status = container_status(pod, container)
    state = status.get("state") or {}
    if "running" in state:
        return None
    if "terminated" in state:
        return dict(state["terminated"])
    last = (status.get("lastState") or {}).get("terminated")
    if "waiting" in state and last:
        return dict(last)
    return None


def _waiting_reason(pod: Body, container: str) -> str | None:
    waiting = (container_status(pod, container).get("state") or {}).get("waiting")
    return str(waiting.get("reason") or "") or None if isinstance(waiting, dict) else None


def out_of_service(node: Body | None) -> Body | None:
    """The node's out-of-service taint, if it carries one."""
    taints = ((node or {}).get("spec") or {}).get("taints") or []
    return next((t for t in taints if t.get("key") == OUT_OF_SERVICE_TAINT), None)


def suspect(pod: Body, container: str) -> bool:
    """Cheap filter on the pod alone: worth a look at the lock and the node only when the
    pod is being deleted, is not Ready, or its instance container is not running."""
    if pod["metadata"].get("deletionTimestamp"):
        return True
    return not meta.pod_ready(pod) or termination(pod, container) is not None


def started(pod: Body, container: str) -> bool:
    """Whether the instance container has ever run in this pod: it runs, has ended, or is
    waiting to run again. A pod whose container never started (unscheduled, pulling its
    image, being created) has no Patroni that could hold the leader lock, so while a
    cluster's pods come up nothing about them is worth a read of the lock."""
    status = container_status(pod, container)
    state = status.get("state") or {}
    return (
        "running" in state
        or "terminated" in state
        or bool((status.get("lastState") or {}).get("terminated"))
        or int(status.get("restartCount") or 0) > 0
    )


def proof(pod: Body, node: Body | None, lock: Mapping[str, str], *, container: str) -> Proof | None:
    """Proof that ``pod``, holding the leader lock whose annotations are ``lock``, can no
    longer accept writes; None if there is none (the lock is someone else's, or alive)."""
    name = pod["metadata"]["name"]
    if lock.get(LEADER_ANNOTATION) != name:
        return None
    node_name = (pod.get("spec") or {}).get("nodeName")
    taint = out_of_service(node) if node_name and node else None
    if taint is not None and (node or {})["metadata"]["name"] == node_name:
        value = f"={taint['value']}" if taint.get("value") else ""
        return Proof(
            NODE_OUT_OF_SERVICE,
            f"its node {node_name} is marked out of service ({OUT_OF_SERVICE_TAINT}{value})",
        )
    ended = termination(pod, container)
    renewed = parse_time(lock.get(RENEW_ANNOTATION))
    finished = parse_time((ended or {}).get("finishedAt"))
    if ended is None or renewed is None or finished is None:
        return None
    # The kubelet writes whole seconds: 10:00:05Z may mean 10:00:05.9, so a renewal within
    # that second may have come from an instance started after the death. Not while the
    # container waits out a crash-loop backoff, though: no instance of it starts within a
    # second of a death (the backoff is 10 s, 1 s at its shortest), so a renewal before the
    # second's end was the dead instance's. (Without this, a Patroni killed in the second it
    # renewed the lock kept its cluster without a primary until the backoff ended.)
    backing_off = _waiting_reason(pod, container) == "CrashLoopBackOff"
    if not renewed < (finished + datetime.timedelta(seconds=1) if backing_off else finished):
        return None
    return Proof(
        CONTAINER_TERMINATED,
        f"its container {container} terminated ({_why(ended)}) at {ended['finishedAt']},"
        f" after the leader lock was last renewed",
    )


def stream_witness(
    members: Iterable[Member], primary: str, synchronous: frozenset[str]
) -> Member | None:
    """A synchronous standby whose Patroni, running, reports that its WAL receiver stopped
    streaming from ``primary``: the sign the primary went silent. ``synchronous`` is
    Patroni's ``NAME-sync`` record as last read (confirmed afresh before any release)."""
    for candidate in sorted(members, key=lambda x: (x.ordinal, x.name)):
        if (
            candidate.name != primary
            and candidate.name in synchronous
            and candidate.label_role == meta.REPLICA_ROLE
            and candidate.state == RUNNING_STATE
            and candidate.replication_state != STREAMING
        ):
            return candidate
    return None


def handover_candidate(
    members: Iterable[Member], primary: str, synchronous: frozenset[str] | None
) -> str | None:
    """The member Patroni may promote at once when ``primary``'s lock is released: one that
    Patroni's ``NAME-sync`` record, read afresh (``synchronous``), lists — so it holds every
    commit the primary acknowledged — and whose Patroni runs; the lowest ordinal first.
    None when there is none (no record, or only the primary in it)."""
    for candidate in sorted(members, key=lambda x: (x.ordinal, x.name)):
        if (
            candidate.name != primary
            and candidate.name in (synchronous or ())
            and candidate.state == RUNNING_STATE
        ):
            return candidate.name
    return None


def handover(lock: Body, name: str, primary: str, candidate: str) -> Body:
    """Patroni's failover record ``name``, from ``primary`` to ``candidate``, as a ConfigMap
    to create: it carries the leader lock's labels, by which Patroni lists its records."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": lock["metadata"].get("namespace", ""),
            "labels": dict(lock["metadata"].get("labels") or {}),
            "annotations": {FAILOVER_LEADER: primary, FAILOVER_CANDIDATE: candidate},
        },
    }


def handover_patch(primary: str, candidate: str) -> Body:
    """The merge patch that writes :func:`handover` into an existing record (clearing a
    scheduled switchover's time: a dead primary is failed over now)."""
    return {
        "metadata": {
            "annotations": {
                FAILOVER_LEADER: primary,
                FAILOVER_CANDIDATE: candidate,
                "scheduled_at": None,
            }
        }
    }


def silent_proof(witness: str, unrenewed: float) -> Proof:
    return Proof(
        PRIMARY_SILENT,
        f"its synchronous standby {witness} lost its WAL stream from it and its leader lock"
        f" went unrenewed for {unrenewed:.1f} s; every commit waits for {witness}, so it can"
        " acknowledge none after the promotion",
    )


def release_patch(lock_body: Body) -> Body:
    """The merge patch that releases the lock, valid only for the version that was read."""
    return {
        "metadata": {
            "resourceVersion": lock_body["metadata"]["resourceVersion"],
            "annotations": {LEADER_ANNOTATION: None},
        }
    }


def restart_count(pod: Body, container: str) -> int:
    return int(container_status(pod, container).get("restartCount") or 0)


def concrete_cause(
    pod: Body, node: Body | None, container: str, restarts: int | None = None
) -> str | None:
    """How a primary was lost, when the API shows it plainly: its node out of service, its
    container terminated (now, or restarted since ``restarts`` was counted), its pod
    deleted. None when nothing concrete shows (it only stopped being ready, or went
    silent)."""
    if out_of_service(node) is not None:
        return f"its node {pod['spec'].get('nodeName')} went out of service"
    ended = termination(pod, container)
    if ended is None and restarts is not None and restart_count(pod, container) > restarts:
        last = container_status(pod, container).get("lastState") or {}
        ended = dict(last.get("terminated") or {})
    if ended is not None:
        return f"its container terminated ({_why(ended)})"
    if pod["metadata"].get("deletionTimestamp"):
        return "its pod was deleted"
    return None


def failure_cause(pod: Body, node: Body | None, container: str) -> str:
    """How a primary :func:`suspect` was lost, in a user's words, from what the API shows."""
    return concrete_cause(pod, node, container) or "its pod stopped being ready"


def unrenewed_for(lock: Mapping[str, str], now: str | None) -> float:
    """How long, by the operator's wall clock ``now``, the lock (its annotations) has gone
    unrenewed; 0 when either time is unreadable (the wait then rests on the operator's own
    monotonic clock alone, :data:`SILENT_SECONDS`)."""
    renewed = parse_time(lock.get(RENEW_ANNOTATION))
    stamped = parse_time(now)
    return (stamped - renewed).total_seconds() if renewed and stamped else 0.0


def last_written(body: Body) -> datetime.datetime | None:
    """When the API server last changed the object for any writer: the newest ``time`` of
    its ``managedFields``, stamped by the server's clock (whole seconds) whenever a writer
    changes a value it owns — for the leader lock, every renewal by Patroni."""
    entries = body["metadata"].get("managedFields") or []
    times = [t for e in entries if (t := parse_time(e.get("time"))) is not None]
    return max(times, default=None)


def served_unrenewed(lock: Body, witness: Body | None) -> float | None:
    """How long, by the API server's clock alone, the lock had gone unrenewed when the
    stream witness's pod was last written (its Patroni reporting the lost stream, or later):
    both times are the server's stamps, so no two machines' clocks are compared. Both are
    whole seconds, so the result is one second less than their difference. None when either
    is unknown."""
    renewed = last_written(lock)
    reported = last_written(witness) if witness is not None else None
    if renewed is None or reported is None:
        return None
    return (reported - renewed).total_seconds() - 1.0


def silent_wait(seen_for: float, unrenewed: float, served: float | None = None) -> float:
    """Seconds still to wait before a silent primary's lock may be released: the operator
    has read one version of it for ``seen_for`` seconds, and its ``renewTime`` is
    ``unrenewed`` seconds old. 0 once both waits are over — or at once when the API
    server's own stamps show the lock unrenewed for :data:`UNRENEWED_SECONDS` (``served``,
    :func:`served_unrenewed`): the server's clock is one clock, so the operator's
    :data:`SILENT_SECONDS` of watching (which exists only because the holder's clock may
    run behind) proves nothing more."""
    if served is not None and served >= UNRENEWED_SECONDS:
        return 0.0
    return max(SILENT_SECONDS - seen_for, UNRENEWED_SECONDS - unrenewed, 0.0)


def _why(ended: Body) -> str:
    """The kubelet's reason for a container's end (OOMKilled, Error), or its exit code."""
    return str(ended.get("reason") or f"exit code {ended.get('exitCode', '?')}")
