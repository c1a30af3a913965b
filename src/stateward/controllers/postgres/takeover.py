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
  clock agreement between machines.

Releasing the lock is a write conditioned on the lock's resourceVersion: if the holder (or a
restarted container of it) renewed the lock since it was read, the write fails and nothing
is released. Pure code; the safety argument is in docs/architecture.md.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping
from typing import Any, Final

from stateward import rfc3339
from stateward.specs import meta

Body = dict[str, Any]

OUT_OF_SERVICE_TAINT: Final = "node.kubernetes.io/out-of-service"
LEADER_ANNOTATION: Final = "leader"
RENEW_ANNOTATION: Final = "renewTime"

NODE_OUT_OF_SERVICE: Final = "NodeOutOfService"
CONTAINER_TERMINATED: Final = "ContainerTerminated"


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


def release_patch(lock_body: Body) -> Body:
    """The merge patch that releases the lock, valid only for the version that was read."""
    return {
        "metadata": {
            "resourceVersion": lock_body["metadata"]["resourceVersion"],
            "annotations": {LEADER_ANNOTATION: None},
        }
    }


def failure_cause(pod: Body, node: Body | None, container: str) -> str:
    """How a primary :func:`suspect` was lost, in a user's words, from what the API shows."""
    if out_of_service(node) is not None:
        return f"its node {pod['spec'].get('nodeName')} went out of service"
    ended = termination(pod, container)
    if ended is not None:
        return f"its container terminated ({_why(ended)})"
    if pod["metadata"].get("deletionTimestamp"):
        return "its pod was deleted"
    return "its pod stopped being ready"


def _why(ended: Body) -> str:
    """The kubelet's reason for a container's end (OOMKilled, Error), or its exit code."""
    return str(ended.get("reason") or f"exit code {ended.get('exitCode', '?')}")
