"""roll_pods: a cluster made before TLS restarts its members together, any other change
rolls one pod at a time; check_instances: an instance the placement keeps off every node."""

from __future__ import annotations

from typing import Any

import pytest

from stateward.controllers.kube import Ref
from stateward.controllers.postgres import reconcile as postgrescluster
from stateward.controllers.postgres.status import check_instances
from stateward.controllers.store import ObjectStore
from tests.support.clusters import make_cluster

pytestmark = pytest.mark.unit


class Kube:
    def __init__(self) -> None:
        self.deleted: list[str] = []
        self.events: list[tuple[str, str]] = []

    async def delete(self, ref: Ref, **_: Any) -> None:
        self.deleted.append(ref.name)

    async def event(self, body: Any, *, reason: str, message: str, warning: bool = False) -> None:
        self.events.append((reason, message))


def pod(
    name: str, *, revision: str, tls: bool, ready: bool = True, role: str = "replica"
) -> dict[str, Any]:
    labels = {
        "stateward.io/cluster": "demo",
        "app.kubernetes.io/component": "instance",
        "controller-revision-hash": revision,
        "stateward.io/role": role,
    }
    if tls:
        labels["stateward.io/tls"] = "1"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "db", "labels": labels, "resourceVersion": "1"},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def scope_with(pods: list[dict[str, Any]], kube: Kube) -> postgrescluster.Scope:
    cluster = make_cluster()
    store = ObjectStore()
    store.observe(
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {
                "name": "demo", "namespace": "db", "generation": 2, "resourceVersion": "1",
                "labels": {"stateward.io/cluster": "demo"},
            },
            "status": {"updateRevision": "new", "observedGeneration": 2},
        }
    )  # fmt: skip
    for body in pods:
        store.observe(body)
    return postgrescluster.Scope(
        cluster=cluster,
        body={"metadata": {"name": "demo", "namespace": "db"}},
        kube=kube,  # type: ignore[arg-type]
        store=store,
        now="2026-12-04T00:00:00Z",
        conditions=[],
    )


async def test_members_made_before_tls_restart_together_even_when_not_ready() -> None:
    kube = Kube()
    pods = [
        pod("demo-0", revision="old", tls=False, role="primary"),
        pod("demo-1", revision="old", tls=False, ready=False),
        pod("demo-2", revision="old", tls=False),
    ]
    note = await postgrescluster.roll_pods(scope_with(pods, kube))
    assert sorted(kube.deleted) == ["demo-0", "demo-1", "demo-2"]
    assert note == "restarted demo-0, demo-1, demo-2 together onto TLS"
    ((reason, message),) = kube.events
    assert reason == "RestartingOntoTLS" and "demo-0, demo-1, demo-2" in message


async def test_a_stalled_roll_of_an_earlier_operator_finishes_together() -> None:
    # One replica already runs TLS (an earlier operator restarted it) and cannot stream from
    # the primary without it: the rest go at once, the one on TLS stays.
    kube = Kube()
    pods = [
        pod("demo-0", revision="old", tls=False, role="primary"),
        pod("demo-1", revision="new", tls=True, ready=False),
        pod("demo-2", revision="old", tls=False),
    ]
    await postgrescluster.roll_pods(scope_with(pods, kube))
    assert sorted(kube.deleted) == ["demo-0", "demo-2"]


async def test_any_other_change_rolls_one_replica_at_a_time_and_waits_for_readiness() -> None:
    kube = Kube()
    pods = [
        pod("demo-0", revision="old", tls=True, role="primary"),
        pod("demo-1", revision="old", tls=True),
        pod("demo-2", revision="old", tls=True),
    ]
    assert await postgrescluster.roll_pods(scope_with(pods, kube)) is not None
    assert kube.deleted == ["demo-1"]
    assert [reason for reason, _ in kube.events] == ["RollingUpdate"]
    waiting = Kube()
    pods[2] = pod("demo-2", revision="old", tls=True, ready=False)
    note = await postgrescluster.roll_pods(scope_with(pods, waiting))
    assert waiting.deleted == [] and note == "rolling update waits for every instance to be ready"


async def test_a_pod_never_scheduled_is_replaced_at_once_and_nothing_else() -> None:
    # The 4th instance could not be placed under the old revision (a required anti-affinity
    # on 3 nodes); the new one (Preferred) may place it, so it does not wait for readiness
    # it can never reach. The running instances still roll one at a time afterwards.
    kube = Kube()
    pending = pod("demo-3", revision="old", tls=True, ready=False)
    pending["status"]["conditions"].append(
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    )
    pods = [
        pod("demo-0", revision="old", tls=True, role="primary"),
        pod("demo-1", revision="old", tls=True),
        pod("demo-2", revision="old", tls=True),
        pending,
    ]
    note = await postgrescluster.roll_pods(scope_with(pods, kube))
    assert kube.deleted == ["demo-3"]
    assert note == "replaced demo-3 (never scheduled) on revision new"


async def test_an_instance_kept_out_by_the_older_instances_does_not_hold_their_roll() -> None:
    # After Required -> Preferred the new demo-3 is refused by the older instances' own
    # required anti-affinity: rolling them is what makes room, so it goes ahead. Anything
    # else unscheduled (here: memory) holds the roll, or it would take instance after
    # instance down.
    kube = Kube()
    blocked = unplaced("demo-3", f"0/3 nodes are available: 3 node(s) {EXISTING}.")
    pods = [
        pod("demo-0", revision="old", tls=True, role="primary"),
        pod("demo-1", revision="old", tls=True),
        pod("demo-2", revision="old", tls=True),
        blocked,
    ]
    scope = scope_with(pods, kube)
    scope.cluster.spec.replicas = 4
    await postgrescluster.roll_pods(scope)
    assert kube.deleted == ["demo-1"]
    held = Kube()
    pods[3] = unplaced("demo-3", "0/3 nodes are available: 3 Insufficient memory.")
    scope = scope_with(pods, held)
    scope.cluster.spec.replicas = 4
    note = await postgrescluster.roll_pods(scope)
    assert held.deleted == [] and note == "rolling update waits for every instance to be ready"


EXISTING = "didn't satisfy existing pods anti-affinity rules"


def unplaced(name: str, message: str) -> dict[str, Any]:
    body = pod(name, revision="new", tls=True, ready=False)
    body["status"]["conditions"].append(
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
    )
    return body


ANTI_AFFINITY = (
    "0/4 nodes are available: 1 node(s) had untolerated taint {kwok: true},"
    " 3 node(s) didn't match pod anti-affinity rules."
)


async def test_an_instance_the_required_placement_cannot_place_says_how_to_fix_it() -> None:
    kube = Kube()
    scope = scope_with(
        [pod("demo-0", revision="new", tls=True), unplaced("demo-3", ANTI_AFFINITY)], kube
    )
    assert await check_instances(scope) == "instances cannot run: NotEnoughNodes"
    ((reason, message),) = scope.degraded
    assert reason == "NotEnoughNodes"
    assert message.startswith("demo-3 cannot be placed: spec.placement.antiAffinity is Required")
    assert "didn't match pod anti-affinity rules" in message
    assert "spec.placement.antiAffinity: Preferred" in message and "spec.replicas" in message
    assert kube.events == [("NotEnoughNodes", message)]


async def test_an_instance_unplaced_for_another_reason_is_not_blamed_on_the_placement() -> None:
    scope = scope_with(
        [unplaced("demo-1", "0/3 nodes are available: 3 Insufficient memory.")], Kube()
    )
    await check_instances(scope)
    ((reason, message),) = scope.degraded
    assert reason == "InstancesNotRunning" and "Insufficient memory" in message


UNBOUND = "0/7 nodes are available: pod has unbound immediate PersistentVolumeClaims. not found"
CACHE_BEHIND = (
    '0/7 nodes are available: persistentvolumeclaim "pgdata-demo-0" bound to non-existent'
    ' persistentvolume "". not found'
)


@pytest.mark.parametrize("said", [UNBOUND, CACHE_BEHIND])
@pytest.mark.parametrize(
    ("since", "problem"), [("2026-12-03T23:51:30Z", False), ("2026-12-03T23:49:30Z", True)]
)
async def test_an_instance_waiting_for_its_new_volume_is_starting_until_the_wait_is_long(
    said: str, since: str, problem: bool
) -> None:
    """Every new instance waits for a provisioner to make its volume, and the scheduler says
    so as "unschedulable": for ten minutes that is starting, not failing; after, Degraded
    names the wait (a StorageClass whose provisioner does nothing)."""
    waiting = unplaced("demo-0", said)
    waiting["status"]["conditions"][-1]["lastTransitionTime"] = since
    kube = Kube()
    scope = scope_with([waiting], kube)
    note = await check_instances(scope)
    if problem:
        assert note == "instances cannot run: InstancesNotRunning"
        ((reason, message),) = scope.degraded
        assert reason == "InstancesNotRunning"
        assert said in message
        assert [said for said, _ in kube.events] == ["InstancesNotRunning"]
    else:
        assert note is None and scope.degraded == [] and kube.events == []
        assert scope.progressing == [("InstancesStarting", "demo-0 waiting for volumes to bind")]
        assert scope.requeue_after == 91  # and looked at again when the grace is over


def scaling(
    pods: list[dict[str, Any]], want: int
) -> tuple[postgrescluster.Scope, list[dict[str, Any]]]:
    scope = scope_with(pods, Kube())
    scope.cluster.spec.replicas = want
    observed = scope.store.get("StatefulSet", "db", "demo")
    assert observed is not None
    observed["spec"] = {"replicas": 3}
    # The store hands out copies: a change is observed anew, as the API server would
    # return it, with a version of its own.
    observed["metadata"]["resourceVersion"] = str(
        int(observed["metadata"].get("resourceVersion") or 0) + 1000
    )
    scope.store.observe(observed)
    desired = [{"kind": "StatefulSet", "spec": {"replicas": want}}]
    postgrescluster._hold_scale_down(scope, desired, scope.cluster.spec.replicas)
    return scope, desired


def running(name: str, role: str | None) -> dict[str, Any]:
    body = pod(name, revision="new", tls=True, role=role or "")
    if role is None:
        del body["metadata"]["labels"]["stateward.io/role"]
    body["status"]["phase"] = "Running"
    return body


def test_a_scale_down_waits_for_the_primary_to_move_below_the_cut() -> None:
    pods = [
        running("demo-0", "replica"),
        running("demo-1", "replica"),
        running("demo-2", "primary"),
    ]
    scope, desired = scaling(pods, 2)
    assert desired[0]["spec"]["replicas"] == 3 and scope.scale_down_to == 2


def test_a_scale_down_goes_ahead_when_the_primary_stays() -> None:
    pods = [
        running("demo-0", "primary"),
        running("demo-1", "replica"),
        running("demo-2", "replica"),
    ]
    scope, desired = scaling(pods, 1)
    assert desired[0]["spec"]["replicas"] == 1 and scope.scale_down_to is None


def test_no_instance_is_removed_while_the_primary_is_unknown() -> None:
    # A failover under way: no pod carries the primary label, and demo-2 may be it.
    pods = [running("demo-0", "replica"), running("demo-1", None), running("demo-2", None)]
    scope, desired = scaling(pods, 1)
    assert desired[0]["spec"]["replicas"] == 3
    ((reason, message),) = scope.progressing
    assert reason == "Scaling" and "a known primary (demo-1, demo-2 may be it)" in message
    assert scope.scale_down_to is None  # nothing to switch over to yet


def test_pods_that_never_ran_do_not_hold_a_scale_down() -> None:
    pending = [running("demo-0", None), pod("demo-1", revision="new", tls=True, role=""),
               pod("demo-2", revision="new", tls=True, role="")]  # fmt: skip
    for body in pending[1:]:
        body["status"]["phase"] = "Pending"
    _scope, desired = scaling(pending, 1)
    assert desired[0]["spec"]["replicas"] == 1
