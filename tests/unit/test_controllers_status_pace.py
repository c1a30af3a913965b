"""Status writes: progress (ready counts, members' states and lag, condition messages) is
written at most every STATUS_PACE per object; everything users act on is written at once."""

from __future__ import annotations

from typing import Any

import pytest

from stateward.controllers import core
from stateward.controllers.store import ObjectStore
from tests.support.clock import Clock

pytestmark = pytest.mark.unit


class StatusKube:
    def __init__(self) -> None:
        self.patches: list[dict[str, Any]] = []

    async def settle_events(self, involved: Any = None) -> None:
        """No Event is sent here."""

    async def patch(self, ref: Any, patch: dict[str, Any], *, status: bool = False) -> Any:
        assert status
        self.patches.append(patch["status"])
        return {"kind": "PostgresCluster", "metadata": {"name": "pg", "namespace": "db"}}


def ready(status: str, reason: str, message: str) -> dict[str, Any]:
    return {"type": "Ready", "status": status, "reason": reason, "message": message,
            "lastTransitionTime": "t"}  # fmt: skip


STARTING = {
    "phase": "Creating",
    "readyReplicas": 1,
    "conditions": [ready("False", "InstancesNotReady", "1/3 ready")],
}


def scope_with(status: dict[str, Any], kube: StatusKube, pacer: core.StatusPacer) -> core.Scope:
    return core.Scope(
        body={"kind": "PostgresCluster", "apiVersion": "stateward.io/v1alpha1",
              "metadata": {"name": "pg", "namespace": "db"}, "status": status},
        kube=kube,  # type: ignore[arg-type]
        store=ObjectStore(),
        now="t",
        conditions=[],
        status_pacer=pacer,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("change", "progress"),
    [
        ({"readyReplicas": 2}, True),
        ({"replicaPods": ["pg-1"]}, True),
        ({"instances": [{"name": "pg-0", "lagBytes": 10}]}, True),
        ({"conditions": [ready("False", "InstancesNotReady", "2/3 ready")]}, True),
        ({"conditions": [ready("True", "AllInstancesReady", "3/3 ready")]}, False),
        ({"conditions": [ready("False", "NoPrimary", "1/3 ready")]}, False),
        ({"phase": "Ready"}, False),
        ({"primaryPod": "pg-0"}, False),
        ({"lastFailover": {"fromPod": "pg-0"}}, False),
        ({"observedGeneration": 2}, False),
    ],
)
def test_what_counts_as_progress(change: dict[str, Any], progress: bool) -> None:
    assert core.only_progress(STARTING, {**STARTING, **change}) is progress


def progressing(status: str, reason: str) -> dict[str, Any]:
    return {"type": "Progressing", "status": status, "reason": reason, "message": reason,
            "lastTransitionTime": "t"}  # fmt: skip


@pytest.mark.parametrize(
    ("before", "after", "progress"),
    [
        # One step of bringing instances up to the next: progress, paced.
        (progressing("True", "Scaling"), progressing("True", "InstancesStarting"), True),
        # Something starts or stops being under way: users act on that, written at once.
        (progressing("False", "Stable"), progressing("True", "Scaling"), False),
        (progressing("True", "InstancesStarting"), progressing("False", "Stable"), False),
    ],
)
def test_the_step_under_way_changing_is_progress_but_starting_or_ending_is_not(
    before: dict[str, Any], after: dict[str, Any], progress: bool
) -> None:
    current = {**STARTING, "conditions": [*STARTING["conditions"], before]}
    desired = {**STARTING, "conditions": [*STARTING["conditions"], after]}
    assert core.only_progress(current, desired) is progress


def test_a_field_that_goes_away_is_not_progress_unless_it_is_a_progress_field() -> None:
    assert not core.only_progress({**STARTING, "switchover": {"phase": "Running"}}, STARTING)
    assert core.only_progress({**STARTING, "instances": [{"name": "pg-0"}]}, STARTING)


async def test_progress_waits_out_the_pace_and_the_reconcile_comes_back_for_it() -> None:
    clock, kube = Clock(), StatusKube()
    pacer = core.StatusPacer(clock=clock)
    # The first write of an object is never held back.
    scope = scope_with({}, kube, pacer)
    await core.patch_status(scope, STARTING)
    assert len(kube.patches) == 1
    # Progress a moment later: not written; the reconcile is requeued for when it may be.
    clock.now += 3
    scope = scope_with(STARTING, kube, pacer)
    await core.patch_status(scope, {**STARTING, "readyReplicas": 2})
    assert len(kube.patches) == 1
    assert scope.requeue_after == pytest.approx(core.STATUS_PACE - 3)
    # Then it is.
    clock.now += core.STATUS_PACE
    scope = scope_with(STARTING, kube, pacer)
    await core.patch_status(scope, {**STARTING, "readyReplicas": 2})
    assert kube.patches[-1]["readyReplicas"] == 2 and len(kube.patches) == 2


async def test_what_users_act_on_is_written_at_once_with_the_progress_beside_it() -> None:
    clock, kube = Clock(), StatusKube()
    pacer = core.StatusPacer(clock=clock)
    await core.patch_status(scope_with({}, kube, pacer), STARTING)
    clock.now += 1
    became_ready = {
        **STARTING,
        "phase": "Ready",
        "readyReplicas": 3,
        "conditions": [ready("True", "AllInstancesReady", "3/3 ready")],
    }
    scope = scope_with(STARTING, kube, pacer)
    await core.patch_status(scope, became_ready)
    assert len(kube.patches) == 2
    assert kube.patches[-1]["phase"] == "Ready" and kube.patches[-1]["readyReplicas"] == 3
    assert scope.requeue_after is None


async def test_each_object_has_its_own_pace_and_a_deleted_one_is_forgotten() -> None:
    clock = Clock()
    pacer = core.StatusPacer(clock=clock)
    pacer.wrote("db", "pg")
    assert pacer.wait_left("db", "pg") == core.STATUS_PACE
    assert pacer.wait_left("db", "other") == 0
    pacer.forget("db", "pg")
    assert pacer.wait_left("db", "pg") == 0


async def test_an_unchanged_status_is_not_written_at_all() -> None:
    kube = StatusKube()
    await core.patch_status(scope_with(STARTING, kube, core.StatusPacer()), dict(STARTING))
    assert kube.patches == []


async def test_a_cluster_coming_up_is_written_when_made_when_ready_and_when_it_fails() -> None:
    """Three pods starting one after another, a primary elected among them: two writes, not
    one per pod (issue 24: at most 2 status patches until Ready). A problem on the way is
    written at once, and a bring-up longer than STATUS_PACE_COMING_UP still shows progress."""
    clock, kube = Clock(), StatusKube()
    pacer = core.StatusPacer(clock=clock)
    first = {**STARTING, "readyReplicas": 0, "conditions": [ready("False", "NoPrimary", "0/3")]}
    await core.patch_status(scope_with({}, kube, pacer), first, coming_up=True)
    steps = [
        {"readyReplicas": 1, "primaryPod": "pg-0",
         "conditions": [ready("False", "InstancesNotReady", "1/3 ready"),
                        progressing("True", "InstancesStarting")]},
        {"readyReplicas": 2, "primaryPod": "pg-0", "replicaPods": ["pg-1"],
         "conditions": [ready("False", "InstancesNotReady", "2/3 ready"),
                        progressing("True", "Scaling")]},
    ]  # fmt: skip
    for step in steps:
        clock.now += core.STATUS_PACE + 1  # far apart, as reconciles come in a busy queue
        scope = scope_with(first, kube, pacer)
        await core.patch_status(scope, {**first, **step}, coming_up=True)
        assert scope.requeue_after is not None, "held back, and looked at again later"
    assert len(kube.patches) == 1
    clock.now += 1
    failing = {**first, "phase": "Failing",
               "conditions": [{"type": "Degraded", "status": "True", "reason": "ImageUnavailable",
                               "message": "m", "lastTransitionTime": "t"}]}  # fmt: skip
    await core.patch_status(scope_with(first, kube, pacer), failing)  # no longer coming up
    assert len(kube.patches) == 2, "a problem is written at once"
    pacer.forget("db", "pg")
    pacer.wrote("db", "pg")
    clock.now += core.STATUS_PACE_COMING_UP
    await core.patch_status(scope_with(first, kube, pacer), {**first, **steps[0]}, coming_up=True)
    assert len(kube.patches) == 3, "a long bring-up still shows its progress, less often"
