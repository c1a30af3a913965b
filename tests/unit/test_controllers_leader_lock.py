"""follow_leader_lock: the lock released on proof, stale primary labels removed (DataPlane)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from lightkube import ApiError

from stateward.controllers.postgres import reconcile as postgrescluster
from stateward.controllers.postgres.dataplane import DataPlane
from stateward.controllers.store import ObjectStore
from tests.support.clusters import make_cluster

pytestmark = pytest.mark.unit

PATRONI_LABELS = {"stateward.io/cluster": "demo", "app.kubernetes.io/component": "instance"}
"""What Patroni labels its records with (and lists them by)."""
OUT = {"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"}


class FakeKube:
    """The reads and writes follow_leader_lock makes, against objects the test sets."""

    def __init__(self, objects: dict[tuple[str, str], dict[str, Any]]) -> None:
        self.objects = objects
        self.gets: list[tuple[str, str]] = []
        self.patches: list[tuple[str, str, dict[str, Any]]] = []
        self.events: list[tuple[str, str]] = []
        self.creates: list[dict[str, Any]] = []
        self.conflict = False
        """The leader lock was renewed since it was read: its conditional patch fails."""

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Any:
        self.gets.append((kind, name))
        return self.objects.get((kind, name))

    async def create(self, body: dict[str, Any]) -> dict[str, Any]:
        self.creates.append(body)
        self.objects[(body["kind"], body["metadata"]["name"])] = body
        return body

    async def patch(self, ref: Any, patch: dict[str, Any], **_: Any) -> dict[str, Any]:
        if self.conflict and ref.name == "demo-leader":
            raise ApiError(
                status=type("S", (), {"code": 409, "message": "conflict", "reason": "Conflict"})()
            )  # type: ignore[call-arg]
        if ref.kind == "ConfigMap" and (ref.kind, ref.name) not in self.objects:
            raise ApiError(
                status=type("S", (), {"code": 404, "message": "not found", "reason": "NotFound"})()
            )  # type: ignore[call-arg]
        self.patches.append((ref.kind, ref.name, patch))
        body = self.objects.get((ref.kind, ref.name), {"metadata": {"name": ref.name}})
        labels = dict(body["metadata"].get("labels") or {})
        for key, value in ((patch.get("metadata") or {}).get("labels") or {}).items():
            if value is None:
                labels.pop(key, None)
            else:
                labels[key] = value
        return {**body, "kind": ref.kind, "metadata": {**body["metadata"], "labels": labels}}

    async def event(self, body: Any, *, reason: str, message: str, warning: bool = False) -> None:
        self.events.append((reason, message))


def pod(
    name: str,
    *,
    role: str | None,
    node: str,
    deleting: bool = False,
    ready: bool = True,
    state: dict[str, Any] | None = None,
    last: dict[str, Any] | None = None,
    stream: str | None = None,
    restarts: int = 0,
) -> dict[str, Any]:
    labels = {
        "app.kubernetes.io/name": "stateward",
        "stateward.io/cluster": "demo",
        "app.kubernetes.io/component": "instance",
    }
    if role:
        labels["stateward.io/role"] = role
    metadata: dict[str, Any] = {"name": name, "namespace": "db", "labels": labels}
    if deleting:
        metadata["deletionTimestamp"] = "2026-12-02T10:00:30Z"
    if stream is not None:  # Patroni's record of a running replica and its WAL receiver
        record = {"state": "running", "role": "replica", "replication_state": stream}
        metadata["annotations"] = {"status": json.dumps(record)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"nodeName": node},
        "status": {
            "podIP": "10.0.0.1",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [
                {
                    "name": "postgres",
                    "state": state or {"running": {}},
                    "lastState": {"terminated": last} if last else {},
                    "restartCount": restarts,
                }
            ],
        },
    }


def lock(
    holder: str, renewed: str = "2026-12-02T10:00:03.5+00:00", written: str | None = None
) -> dict[str, Any]:
    """The leader lock; ``written``: when the API server stamped its last change."""
    metadata: dict[str, Any] = {
        "name": "demo-leader",
        "namespace": "db",
        "resourceVersion": "42",
        "labels": PATRONI_LABELS,
        "annotations": {"leader": holder, "renewTime": renewed},
    }
    if written is not None:
        metadata["managedFields"] = stamped(written)["metadata"]["managedFields"]
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata}


def stamped(written: str, *, name: str = "x") -> dict[str, Any]:
    """A body the API server last changed at ``written`` (for Patroni), earlier for others."""
    return {
        "kind": "Pod",
        "metadata": {
            "name": name,
            "managedFields": [
                {"manager": "kubelet", "operation": "Update", "time": "2026-12-02T09:00:00Z"},
                {"manager": "Patroni", "operation": "Update", "time": written},
            ],
        },
    }


def scope(kube: FakeKube, *pods: dict[str, Any], **spec: Any) -> postgrescluster.Scope:
    cluster = make_cluster(**spec)
    store = ObjectStore()
    for body in pods:
        store.observe(body)
    return postgrescluster.Scope(
        cluster=cluster,
        body={"metadata": {"name": cluster.name, "namespace": cluster.namespace}},
        kube=kube,  # type: ignore[arg-type]
        store=store,
        now="2026-12-02T10:00:31Z",
        conditions=[],
    )


async def test_a_primary_on_an_out_of_service_node_has_its_lock_released() -> None:
    kube = FakeKube(
        {
            ("Node", "node-1"): {"metadata": {"name": "node-1"}, "spec": {"taints": [OUT]}},
            ("ConfigMap", "demo-leader"): lock("demo-0"),
        }
    )
    plane = DataPlane()
    the_scope = scope(
        kube,
        pod("demo-0", role="primary", node="node-1", deleting=True),
        pod("demo-1", role="replica", node="node-2"),
    )
    note = await plane.follow_leader_lock(the_scope)
    assert note == "released the leader lock of demo-0 (NodeOutOfService)"
    assert kube.patches == [
        (
            "ConfigMap",
            "demo-leader",
            {"metadata": {"resourceVersion": "42", "annotations": {"leader": None}}},
        )
    ]
    assert kube.events[0][0] == "LeaderLockReleased" and "node-1" in kube.events[0][1]
    # Released once: the next reconcile does not write again.
    assert await plane.follow_leader_lock(the_scope) is None
    assert len(kube.patches) == 1


async def test_a_healthy_primary_costs_no_request() -> None:
    kube = FakeKube({})
    the_scope = scope(kube, pod("demo-0", role="primary", node="node-1"))
    assert await DataPlane().follow_leader_lock(the_scope) is None
    assert kube.gets == [] and kube.patches == []


async def test_an_unready_primary_without_proof_keeps_its_lock_and_is_looked_at_again() -> None:
    kube = FakeKube(
        {
            ("Node", "node-1"): {"metadata": {"name": "node-1"}, "spec": {}},
            ("ConfigMap", "demo-leader"): lock("demo-0"),
        }
    )
    the_scope = scope(kube, pod("demo-0", role="primary", node="node-1", ready=False))
    assert await DataPlane().follow_leader_lock(the_scope) is None
    assert kube.patches == []
    assert the_scope.requeue_after is not None


async def test_a_container_that_died_after_the_last_renewal_has_its_lock_released() -> None:
    died = {"finishedAt": "2026-12-02T10:00:05Z", "reason": "Error", "exitCode": 137}
    kube = FakeKube(
        {
            ("Node", "node-1"): {"metadata": {"name": "node-1"}, "spec": {}},
            ("ConfigMap", "demo-leader"): lock("demo-0"),
        }
    )
    the_scope = scope(
        kube,
        pod("demo-0", role="primary", node="node-1", ready=False, state={"terminated": died}),
    )
    note = await DataPlane().follow_leader_lock(the_scope)
    assert note == "released the leader lock of demo-0 (ContainerTerminated)"


async def test_a_lock_renewed_meanwhile_is_not_released() -> None:
    kube = FakeKube(
        {
            ("Node", "node-1"): {"metadata": {"name": "node-1"}, "spec": {"taints": [OUT]}},
            ("ConfigMap", "demo-leader"): lock("demo-0"),
        }
    )
    kube.conflict = True
    the_scope = scope(kube, pod("demo-0", role="primary", node="node-1", deleting=True))
    note = await DataPlane().follow_leader_lock(the_scope)
    assert note is not None and "renewed meanwhile" in note
    assert kube.events == []


async def test_the_stale_one_of_two_primary_labels_is_removed() -> None:
    kube = FakeKube({("ConfigMap", "demo-leader"): lock("demo-1")})
    stale = pod("demo-0", role="primary", node="node-1")
    kube.objects[("Pod", "demo-0")] = stale
    the_scope = scope(kube, stale, pod("demo-1", role="primary", node="node-2"))
    note = await DataPlane().follow_leader_lock(the_scope)
    assert note == "unlabelled the stale primary demo-0"
    assert kube.patches == [
        ("Pod", "demo-0", {"metadata": {"labels": {"stateward.io/role": None}}})
    ]
    assert [m.name for m in the_scope.members if m.is_primary] == ["demo-1"]


async def test_two_primary_labels_during_a_leader_race_are_left_alone() -> None:
    kube = FakeKube({("ConfigMap", "demo-leader"): lock("")})
    the_scope = scope(
        kube,
        pod("demo-0", role="primary", node="node-1"),
        pod("demo-1", role="primary", node="node-2"),
    )
    assert await DataPlane().follow_leader_lock(the_scope) is None
    assert kube.patches == []


async def test_a_crash_looping_primary_relabelled_replica_is_found_by_its_lock() -> None:
    # Restarted, Patroni labels its pod a replica while it starts read-only; the kubelet then
    # backs off: the lock still names it, and its container died after the last renewal.
    died = {"finishedAt": "2026-12-02T10:00:05Z", "reason": "Error", "exitCode": 137}
    kube = FakeKube(
        {
            ("Node", "node-1"): {"metadata": {"name": "node-1"}, "spec": {}},
            ("ConfigMap", "demo-leader"): lock("demo-0"),
        }
    )
    backing_off = {"waiting": {"reason": "CrashLoopBackOff"}}
    the_scope = scope(
        kube,
        pod("demo-0", role="replica", node="node-1", ready=False, state=backing_off, last=died),
        pod("demo-1", role="replica", node="node-2"),
    )
    note = await DataPlane().follow_leader_lock(the_scope)
    assert note == "released the leader lock of demo-0 (ContainerTerminated)"
    assert kube.gets.count(("ConfigMap", "demo-leader")) == 1  # read once, used twice


@pytest.mark.parametrize(
    "state",
    [None, {"waiting": {"reason": "ContainerCreating"}}, {"waiting": {"reason": "ErrImagePull"}}],
)
async def test_pods_coming_up_without_a_primary_read_nothing(state: dict[str, Any] | None) -> None:
    # A cluster bootstrapping: its pods are not Ready and their containers never ran, so no
    # Patroni among them can hold the lock. (At a hundred clusters coming up, reading it for
    # every pod event was a thousand GETs a minute.)
    pending = pod("demo-0", role=None, node="node-1", ready=False)
    statuses = pending["status"]["containerStatuses"]
    if state is None:
        pending["status"]["containerStatuses"] = []  # not even scheduled onto a kubelet yet
    else:
        statuses[0]["state"] = state
    kube = FakeKube({("ConfigMap", "demo-leader"): lock("demo-0")})
    the_scope = scope(kube, pending, pod("demo-1", role=None, node="node-2"))
    assert await DataPlane().follow_leader_lock(the_scope) is None
    assert kube.gets == [] and kube.patches == []


async def test_a_pod_that_ran_and_is_unready_without_a_primary_reads_the_lock() -> None:
    # Running but not Ready (Patroni restarting read-only, or its node lost): the lock may
    # still be its own, so it is read; a live holder keeps it.
    kube = FakeKube(
        {
            ("Node", "node-1"): {"metadata": {"name": "node-1"}, "spec": {}},
            ("ConfigMap", "demo-leader"): lock("demo-0"),
        }
    )
    the_scope = scope(kube, pod("demo-0", role="replica", node="node-1", ready=False))
    assert await DataPlane().follow_leader_lock(the_scope) is None
    assert kube.gets.count(("ConfigMap", "demo-leader")) == 1
    assert kube.patches == []


async def test_no_primary_and_nobody_unwell_reads_nothing() -> None:
    kube = FakeKube({})
    the_scope = scope(kube, pod("demo-0", role="replica", node="node-1"))
    assert await DataPlane().follow_leader_lock(the_scope) is None
    assert kube.gets == []


# --- a silent primary: hung or cut off, its pod still Ready --------------------------------


HANDOVER = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "metadata": {
        "name": "demo-failover",
        "namespace": "db",
        "labels": PATRONI_LABELS,
        "annotations": {"leader": "demo-0", "member": "demo-1"},
    },
}
"""Patroni's failover record from the lost primary demo-0 to its synchronous standby."""
WITHDRAWN = {"metadata": {"annotations": {"leader": None, "member": None}}}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def silent_cluster(stream: str, **spec: Any) -> tuple[FakeKube, postgrescluster.Scope]:
    kube = FakeKube(
        {
            ("ConfigMap", "demo-leader"): lock("demo-0"),
            ("ConfigMap", "demo-sync"): {"metadata": {"annotations": {"sync_standby": "demo-1"}}},
        }
    )
    return kube, scope(
        kube,
        pod("demo-0", role="primary", node="node-1"),
        pod("demo-1", role="replica", node="node-2", stream=stream),
        pod("demo-2", role="replica", node="node-3", stream="streaming"),
        **spec,
    )


async def knows_the_sync_standby(plane: DataPlane, **spec: Any) -> None:
    """A reconcile while every replica streams: the operator has read Patroni's record."""
    kube, healthy = silent_cluster("streaming", **spec)
    await plane.observe_sync(healthy)
    assert await plane.follow_leader_lock(healthy) is None
    assert ("ConfigMap", "demo-leader") not in kube.gets, "streaming standbys cost no read"


async def first_sight(
    **changes: Any,
) -> tuple[Clock, DataPlane, FakeKube, postgrescluster.Scope]:
    """A plane that knows the sync standby, and the scope of a reconcile after that standby
    lost its stream (``changes`` set on it), with a clock the test moves."""
    clock = Clock()
    plane = DataPlane(clock=clock)
    await knows_the_sync_standby(plane)
    kube, lost_stream = silent_cluster("in archive recovery")
    for name, value in changes.items():
        setattr(lost_stream, name, value)
    return clock, plane, kube, lost_stream


async def test_a_silent_primary_loses_its_lock_once_unrenewed_while_its_standby_lost_it() -> None:
    clock, plane, kube, lost_stream = await first_sight()
    # First sight: the lock is read and its version remembered; nothing is released yet.
    assert await plane.follow_leader_lock(lost_stream) is None
    assert kube.patches == [] and lost_stream.requeue_after is not None
    assert lost_stream.requeue_after <= 3.0
    clock.now += 1.0
    assert await plane.follow_leader_lock(lost_stream) is None and kube.patches == []
    # The same version a whole loop and more later: no running Patroni renewed it.
    clock.now += 2.1
    note = await plane.follow_leader_lock(lost_stream)
    assert note == "released the leader lock of demo-0 (PrimarySilent)"
    # Patroni's failover record names the standby first, so that it takes the lock at once
    # instead of waiting 2 s on the silent primary's REST API in its leader race.
    assert kube.creates == [HANDOVER]
    assert kube.patches == [
        (
            "ConfigMap",
            "demo-leader",
            {"metadata": {"resourceVersion": "42", "annotations": {"leader": None}}},
        )
    ]
    assert ("ConfigMap", "demo-sync") in kube.gets, "the sync record is confirmed afresh"
    reason, message = kube.events[-1]
    assert reason == "LeaderLockReleased" and "demo-1 lost its WAL stream" in message
    assert await plane.follow_leader_lock(lost_stream) is None and len(kube.patches) == 1
    # Patroni promotes the standby: the failover report says how and that the lock went.
    clock.now += 2.0
    _, promoted = silent_cluster("streaming")
    promoted.store.observe(pod("demo-0", role="replica", node="node-1", stream="streaming"))
    promoted.store.observe(pod("demo-1", role="primary", node="node-2"))
    promoted.body["status"] = {"primaryPod": "demo-0"}
    assert await plane.report_failover(promoted) == "failover from demo-0 to demo-1"
    assert promoted.last_failover is not None
    assert promoted.last_failover["lockReleased"] is True
    assert promoted.last_failover["seconds"] == 5.1
    assert "went silent" in promoted.last_failover["cause"]


def promoted_after(old_primary: dict[str, Any] | None) -> postgrescluster.Scope:
    """The scope once Patroni promoted demo-1, the old primary's pod as given (or gone)."""
    _, promoted = silent_cluster("streaming")
    if old_primary is None:
        promoted.store.forget("Pod", "db", "demo-0")
    else:
        promoted.store.observe(old_primary)
    promoted.store.observe(pod("demo-1", role="primary", node="node-2"))
    promoted.body["status"] = {"primaryPod": "demo-0"}
    return promoted


DIED = {"finishedAt": "2026-12-02T10:00:30Z", "reason": "Error", "exitCode": 137}


async def test_a_silent_primary_seen_dead_afterwards_is_reported_by_what_killed_it() -> None:
    # Its standby lost the stream before the kubelet reported the container's end: the
    # inference ("went silent") gives way to what the API shows once it shows it.
    clock, plane, _, lost_stream = await first_sight()
    assert await plane.follow_leader_lock(lost_stream) is None
    dead = pod("demo-0", role="primary", node="node-1", ready=False, state={"terminated": DIED})
    lost_stream.store.observe(dead)
    clock.now += 1.0
    await plane.follow_leader_lock(lost_stream)
    clock.now += 2.0
    promoted = promoted_after(None)  # its pod is being replaced: only the memory tells
    assert await plane.report_failover(promoted) == "failover from demo-0 to demo-1"
    assert promoted.last_failover is not None
    assert promoted.last_failover["cause"] == "its container terminated (Error)"
    assert promoted.last_failover["seconds"] == 3.0, "first seen failing when it went silent"


async def test_a_silent_primary_whose_container_restarted_unseen_is_reported_by_it() -> None:
    # The container died and came back between two reconciles: running and ready again,
    # only its restart count (and its last termination) tell.
    clock, plane, _, lost_stream = await first_sight()
    assert await plane.follow_leader_lock(lost_stream) is None
    clock.now += 3.5
    assert await plane.follow_leader_lock(lost_stream) is not None  # released, as silent
    back = pod("demo-0", role="replica", node="node-1", last=DIED, restarts=1)
    promoted = promoted_after(back)
    assert await plane.report_failover(promoted) == "failover from demo-0 to demo-1"
    assert promoted.last_failover is not None
    assert promoted.last_failover["cause"] == "its container terminated (Error)"
    assert promoted.last_failover["lockReleased"] is True


async def test_a_silent_primary_that_only_went_silent_is_reported_as_silent() -> None:
    clock, plane, _, lost_stream = await first_sight()
    assert await plane.follow_leader_lock(lost_stream) is None
    clock.now += 3.5
    assert await plane.follow_leader_lock(lost_stream) is not None
    promoted = promoted_after(pod("demo-0", role="replica", node="node-1", stream="streaming"))
    assert await plane.report_failover(promoted) == "failover from demo-0 to demo-1"
    assert promoted.last_failover is not None
    assert promoted.last_failover["cause"].startswith("it went silent")


async def test_a_lock_the_server_stamped_long_before_the_standby_reported_goes_at_once() -> None:
    # The API server stamped the lock's last renewal 6 s before it stamped the standby's
    # report: one clock, so the operator need not watch the lock for its own 3 s.
    _, plane, kube, lost_stream = await first_sight()
    # (The holder's own stamp looks 3 s old: its clock may run ahead; the server's decides.)
    renewed = "2026-12-02T10:00:28+00:00"
    kube.objects[("ConfigMap", "demo-leader")] = lock(
        "demo-0", renewed, written="2026-12-02T10:00:24Z"
    )
    kube.objects[("Pod", "demo-1")] = stamped("2026-12-02T10:00:30Z", name="demo-1")
    note = await plane.follow_leader_lock(lost_stream)
    assert note == "released the leader lock of demo-0 (PrimarySilent)"
    assert kube.gets.index(("Pod", "demo-1")) < kube.gets.index(("ConfigMap", "demo-leader"))
    assert "went unrenewed for 5.0 s" in kube.events[-1][1]


@pytest.mark.parametrize(
    ("renewed", "reported"),
    [
        ("2026-12-02T10:00:26Z", "2026-12-02T10:00:30Z"),  # 4 s apart: could be a slow loop
        ("2026-12-02T10:00:31Z", "2026-12-02T10:00:30Z"),  # renewed after the report
        (None, "2026-12-02T10:00:30Z"),  # no stamp on the lock
    ],
)
async def test_server_stamps_too_close_together_leave_the_operators_own_wait(
    renewed: str | None, reported: str
) -> None:
    clock, plane, kube, lost_stream = await first_sight()
    kube.objects[("ConfigMap", "demo-leader")] = lock("demo-0", written=renewed)
    kube.objects[("Pod", "demo-1")] = stamped(reported, name="demo-1")
    assert await plane.follow_leader_lock(lost_stream) is None
    assert kube.patches == [] and lost_stream.requeue_after is not None
    clock.now += 3.5  # the operator's own wait still releases it
    assert await plane.follow_leader_lock(lost_stream) is not None and len(kube.patches) == 1


async def test_a_silent_primary_that_renews_its_lock_keeps_it() -> None:
    clock, plane, kube, lost_stream = await first_sight()
    assert await plane.follow_leader_lock(lost_stream) is None
    for version in ("43", "44", "45"):  # Patroni renews every loop: a new version each read
        clock.now += 3.5
        kube.objects[("ConfigMap", "demo-leader")]["metadata"]["resourceVersion"] = version
        assert await plane.follow_leader_lock(lost_stream) is None
    assert kube.patches == [] and kube.events == []


async def test_a_lock_renewed_moments_ago_by_its_holders_clock_is_kept_a_while() -> None:
    # The operator read one version for 3.5 s, but the holder stamped it 2 s before now:
    # its loop may just be slow. The wait goes on until the stamp is two loops old.
    clock, plane, kube, lost_stream = await first_sight()
    kube.objects[("ConfigMap", "demo-leader")] = lock("demo-0", "2026-12-02T10:00:29+00:00")
    assert await plane.follow_leader_lock(lost_stream) is None
    clock.now += 3.5
    assert await plane.follow_leader_lock(lost_stream) is None
    assert kube.patches == []
    assert lost_stream.requeue_after is not None and lost_stream.requeue_after <= 3.0


async def test_a_silent_primary_keeps_its_lock_during_a_planned_switchover() -> None:
    switchover = {"phase": "Running", "fromPod": "demo-0", "target": "any"}
    clock, plane, kube, lost_stream = await first_sight(switchover=switchover)
    for _ in range(3):
        assert await plane.follow_leader_lock(lost_stream) is None
        clock.now += 3.5
    assert ("ConfigMap", "demo-leader") not in kube.gets and kube.patches == []


async def test_a_standby_patroni_no_longer_lists_keeps_the_lock() -> None:
    clock, plane, kube, lost_stream = await first_sight()
    assert await plane.follow_leader_lock(lost_stream) is None
    # The primary's Patroni took the standby off its list: it is alive, and may commit alone.
    kube.objects[("ConfigMap", "demo-sync")]["metadata"]["annotations"]["sync_standby"] = "demo-2"
    clock.now += 3.5
    assert await plane.follow_leader_lock(lost_stream) is None
    assert kube.patches == []


async def test_a_silent_primary_whose_lock_is_renewed_at_the_release_keeps_it() -> None:
    clock, plane, kube, lost_stream = await first_sight()
    assert await plane.follow_leader_lock(lost_stream) is None
    clock.now += 3.5
    kube.conflict = True
    note = await plane.follow_leader_lock(lost_stream)
    assert note is not None and "renewed meanwhile" in note and kube.events == []
    # The failover record named the standby: emptied again, or the primary, alive after
    # all, would take it for a request to hand over.
    assert kube.creates == [HANDOVER]
    assert kube.patches == [("ConfigMap", "demo-failover", WITHDRAWN)]


async def test_an_existing_failover_record_is_rewritten_not_created() -> None:
    clock, plane, kube, lost_stream = await first_sight()
    kube.objects[("ConfigMap", "demo-failover")] = {"metadata": {"name": "demo-failover"}}
    assert await plane.follow_leader_lock(lost_stream) is None
    clock.now += 3.5
    assert await plane.follow_leader_lock(lost_stream) is not None
    assert kube.creates == [] and ("ConfigMap", "demo-failover") not in kube.gets, "one write"
    handover = {"leader": "demo-0", "member": "demo-1", "scheduled_at": None}
    assert [p[:2] for p in kube.patches] == [
        ("ConfigMap", "demo-failover"),
        ("ConfigMap", "demo-leader"),
    ]
    assert kube.patches[0][2] == {"metadata": {"annotations": handover}}


def out_of_service_primary(**spec: Any) -> tuple[FakeKube, postgrescluster.Scope]:
    """demo-0, the primary, on a node marked out of service; demo-1 its sync standby."""
    kube = FakeKube(
        {
            ("Node", "node-1"): {"metadata": {"name": "node-1"}, "spec": {"taints": [OUT]}},
            ("ConfigMap", "demo-leader"): lock("demo-0"),
            ("ConfigMap", "demo-sync"): {"metadata": {"annotations": {"sync_standby": "demo-1"}}},
        }
    )
    the_scope = scope(
        kube,
        pod("demo-0", role="primary", node="node-1", deleting=True),
        pod("demo-1", role="replica", node="node-2", stream="streaming"),
        pod("demo-2", role="replica", node="node-3", stream="streaming"),
        **spec,
    )
    return kube, the_scope


async def test_a_primary_on_an_out_of_service_node_is_handed_to_its_sync_standby() -> None:
    kube, the_scope = out_of_service_primary()
    note = await DataPlane().follow_leader_lock(the_scope)
    assert note == "released the leader lock of demo-0 (NodeOutOfService)"
    assert kube.creates == [HANDOVER]
    assert "Patroni promotes demo-1 now" in kube.events[-1][1]


@pytest.mark.parametrize(
    "synchronous",
    [{"method": "Quorum"}, {"mode": "Off"}],
    ids=["quorum-commit", "asynchronous"],
)
async def test_without_priority_replication_a_released_lock_names_no_candidate(
    synchronous: dict[str, str],
) -> None:
    # Patroni's leader race must ask the members who is most advanced: nobody is named.
    kube, the_scope = out_of_service_primary(synchronous=synchronous)
    note = await DataPlane().follow_leader_lock(the_scope)
    assert note == "released the leader lock of demo-0 (NodeOutOfService)"
    assert kube.creates == [] and [p[1] for p in kube.patches] == ["demo-leader"]


@pytest.mark.parametrize(
    "synchronous",
    [{"method": "Quorum"}, {"mode": "Off"}],
    ids=["quorum-commit", "asynchronous"],
)
async def test_without_priority_synchronous_replication_a_silent_primary_waits_for_the_ttl(
    synchronous: dict[str, str],
) -> None:
    # Under quorum commit a second voter could confirm a thawed primary's commit; without
    # synchronous replication the standby may lack acknowledged commits. Patroni's ttl decides.
    clock = Clock()
    plane = DataPlane(clock=clock)
    kube, healthy = silent_cluster("streaming", synchronous=synchronous)
    await plane.observe_sync(healthy)
    _, lost_stream = silent_cluster("in archive recovery", synchronous=synchronous)
    lost_stream.kube = kube  # type: ignore[assignment]
    for _ in range(3):
        assert await plane.follow_leader_lock(lost_stream) is None
        clock.now += 3.5
    assert ("ConfigMap", "demo-leader") not in kube.gets and kube.patches == []
