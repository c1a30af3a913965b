"""Restart rolls against a fake Patroni: a parameter that needs a restart (``restart_pending``)
and a new pod template (``roll_pods``) go through the members one at a time, replicas
first, the primary last after a switchover, never while a member is unwell, and a restarted
operator continues the roll where ``status.rollingRestart`` says it stands."""

from __future__ import annotations

import pytest

from stateward.controllers.kube import PatroniError
from stateward.specs import meta
from stateward.specs.postgres import config as config_spec
from tests.support.clusters import make_cluster
from tests.support.fake_patroni import FakePatroni, Member, Operator

pytestmark = pytest.mark.unit

PENDING = {"postgresql": {"parameters": {"shared_buffers": "256MB"}}}


def three(*, pending: bool = True) -> FakePatroni:
    """demo-1 the primary (so ordinal order and role order differ); demo-2 its synchronous
    standby; every member waiting for a restart."""
    return FakePatroni(
        Member("demo-0", wal=990, pending_restart=pending),
        Member("demo-1", role=meta.PRIMARY_ROLE, replication_state=None, pending_restart=pending),
        Member("demo-2", wal=995, pending_restart=pending),
        sync={"demo-2"},
    )


def restarted(fake: FakePatroni) -> list[str]:
    return [c.member for c in fake.posts("/restart")]


async def step(operator: Operator) -> list[str]:
    """One reconcile, then the restarted members come back."""
    notes = await operator.reconcile()
    operator.fake.settle()
    return notes


async def test_replicas_restart_one_at_a_time_then_the_primary_after_a_switchover() -> None:
    fake = three()
    operator = Operator(fake, **PENDING)

    await step(operator)
    assert restarted(fake) == ["demo-0"]  # a replica first, lowest ordinal
    assert fake.reasons() == ["RollingRestart", "InstanceRestarted"]
    assert operator.roll["restarted"] == ["demo-0"] and operator.roll["phase"] == "Running"
    await step(operator)
    assert restarted(fake) == ["demo-0", "demo-2"]  # the other replica; the primary skipped
    assert operator.roll["restarted"] == ["demo-0", "demo-2"]

    # Only the primary is left: it hands over to its synchronous standby, not /restart.
    await step(operator)
    assert restarted(fake) == ["demo-0", "demo-2"]
    ((switchover,),) = [fake.posts("/switchover")]
    assert (switchover.member, switchover.body) == (
        "demo-1",
        {"leader": "demo-1", "candidate": "demo-2"},
    )
    assert operator.switchover["reason"] == "Restart"

    await step(operator)  # the switchover is seen done
    assert fake.primary() == "demo-2" and operator.switchover["phase"] == "Succeeded"
    await step(operator)  # the old primary, a replica now, restarts last
    assert restarted(fake) == ["demo-0", "demo-2", "demo-1"]
    assert all(x.restarts == 1 for x in fake.members.values())

    await step(operator)
    assert operator.roll["phase"] == "Succeeded"
    assert fake.reasons()[-1] == "RollingRestartDone"
    assert "Failover" not in fake.reasons()
    assert "lastFailover" not in fake.status

    fake.forget_calls()
    await operator.reconcile()
    assert fake.calls == [] and fake.events == []  # done means done: nothing restarted again


async def test_the_primary_hands_over_to_the_standby_patroni_chose_during_the_roll() -> None:
    # Patroni may name another synchronous standby while the one it had restarts, and the
    # operator, waiting for that restart to end, never sees the member down. The handover
    # goes to the standby Patroni names now; asking for the old one is refused for ever
    # ("candidate name does not match with sync_standby": a clean-clone CI run).
    fake = three()
    operator = Operator(fake, **PENDING)
    await step(operator)
    await operator.reconcile()
    assert restarted(fake) == ["demo-0", "demo-2"]
    fake.sync = {"demo-0"}  # chosen while demo-2 was down
    fake.settle()
    await step(operator)
    roles = {i["name"]: i.get("role") for i in fake.status["instances"]}
    assert roles == {"demo-0": "sync_standby", "demo-1": "primary", "demo-2": "replica"}
    ((switchover,),) = [fake.posts("/switchover")]
    assert switchover.body == {"leader": "demo-1", "candidate": "demo-0"}
    await step(operator)
    await step(operator)
    assert fake.primary() == "demo-0" and restarted(fake) == ["demo-0", "demo-2", "demo-1"]
    assert "SwitchoverFailed" not in fake.reasons()


async def test_no_member_restarts_while_another_is_not_ready() -> None:
    fake = three()
    operator = Operator(fake, **PENDING)
    await operator.reconcile()
    assert restarted(fake) == ["demo-0"]
    # demo-0 is still starting: nobody else goes down meanwhile, however often it looks.
    for _ in range(3):
        notes = await operator.reconcile()
        assert "rolling restart waits for every instance to be ready" in notes
    assert restarted(fake) == ["demo-0"]
    fake.settle()
    await operator.reconcile()
    assert restarted(fake) == ["demo-0", "demo-2"]


async def test_an_unready_member_holds_the_roll_before_it_starts() -> None:
    fake = three()
    fake.members["demo-2"].ready = False
    operator = Operator(fake, **PENDING)
    await operator.reconcile()
    assert fake.posts() == []
    assert fake.reasons() == ["RollingRestart"]  # announced, but nothing restarted


async def test_a_restarted_operator_continues_the_roll_without_repeating_a_member() -> None:
    fake = three()
    operator = Operator(fake, **PENDING)
    await step(operator)
    assert restarted(fake) == ["demo-0"]

    operator.restart()
    await step(operator)
    assert restarted(fake) == ["demo-0", "demo-2"]  # not demo-0 again
    assert fake.reasons().count("RollingRestart") == 1  # the same roll, not a new one


async def test_a_restarted_operator_finishes_the_switchover_before_restarting_anyone() -> None:
    fake = three()
    fake.switch_at_once = False
    operator = Operator(fake, **PENDING)
    await step(operator)
    await step(operator)
    await step(operator)
    assert len(fake.posts("/switchover")) == 1 and operator.switchover["phase"] == "Running"

    operator.restart()
    for _ in range(2):
        await step(operator)
    # While the primary is moving, no member is restarted and no second switchover asked.
    assert restarted(fake) == ["demo-0", "demo-2"] and len(fake.posts("/switchover")) == 1

    fake.complete_switchover("demo-2")
    await step(operator)
    await step(operator)
    assert restarted(fake) == ["demo-0", "demo-2", "demo-1"]
    assert len(fake.posts("/switchover")) == 1


async def test_the_roll_restarts_a_member_whose_pending_flag_patroni_dropped() -> None:
    # Patroni can clear the flag of a member that still runs the old value; the roll, once
    # started, restarts every member it has not restarted.
    fake = three()
    operator = Operator(fake, **PENDING)
    await step(operator)
    fake.members["demo-2"].pending_restart = False
    await step(operator)
    assert restarted(fake) == ["demo-0", "demo-2"]


async def test_nothing_restarts_without_a_pending_parameter() -> None:
    fake = three(pending=False)
    operator = Operator(fake, **PENDING)
    await operator.reconcile()
    assert fake.posts() == [] and "rollingRestart" not in fake.status


async def test_a_lone_primary_restarts_in_place() -> None:
    fake = FakePatroni(
        Member("demo-0", role=meta.PRIMARY_ROLE, replication_state=None, pending_restart=True)
    )
    operator = Operator(fake, **PENDING)
    await step(operator)
    assert restarted(fake) == ["demo-0"] and fake.posts("/switchover") == []
    (message,) = [m for reason, m, _ in fake.events if reason == "InstanceRestarted"]
    assert "primary, in place: no replica to switch over to" in message
    await step(operator)
    assert operator.roll["phase"] == "Succeeded"


async def test_a_refused_restart_is_reported_and_tried_again() -> None:
    fake = three()
    fake.answer("/restart", (503, "restart already in progress"))
    operator = Operator(fake, **PENDING)
    notes = await step(operator)
    assert "restart of demo-0 refused" in notes
    assert ("RestartFailed", "Patroni refused to restart demo-0: restart already in progress",
            True) in fake.events  # fmt: skip
    assert operator.roll["restarted"] == []  # not counted as done
    await step(operator)
    assert restarted(fake) == ["demo-0", "demo-0"] and operator.roll["restarted"] == ["demo-0"]


async def test_a_restart_patroni_does_not_answer_is_reported_and_tried_again() -> None:
    fake = three()
    fake.answer("/restart", PatroniError("timed out after 120s"))
    operator = Operator(fake, **PENDING)
    notes = await step(operator)  # the reconcile goes on: no exception, no backoff
    assert "restart of demo-0 refused" in notes
    assert any(reason == "RestartFailed" and "did not answer the restart of demo-0" in message
               for reason, message, _ in fake.events)  # fmt: skip
    assert operator.roll["restarted"] == []
    await step(operator)
    assert operator.roll["restarted"] == ["demo-0"]


async def test_a_parameter_change_is_applied_through_patroni_and_then_rolled() -> None:
    # The spec asks for a parameter PostgreSQL reads only at start: Patroni gets it once,
    # on the primary, flags every member, and the roll follows.
    fake = three(pending=False)
    operator = Operator(fake)
    before = make_cluster(replicas=3)  # what Patroni runs: the spec without it
    fake.dcs = {
        **config_spec.ha_settings(before),
        "postgresql": {"parameters": config_spec.parameters(before)},
    }
    await operator.reconcile()
    assert [c for c in fake.calls if c.method != "GET"] == []  # nothing to change yet
    fake.forget_calls()
    operator.spec = PENDING

    await step(operator)
    patches = [c for c in fake.calls if c.method == "PATCH"]
    assert [(c.member, c.path) for c in patches] == [("demo-1", "/config")]
    assert patches[0].body["postgresql"]["parameters"]["shared_buffers"] == "256MB"
    assert fake.posts() == []  # the flags show up at the next look
    await step(operator)
    assert restarted(fake) == ["demo-0"]
    await step(operator)
    assert len([c for c in fake.calls if c.method == "PATCH"]) == 1  # applied once


# --- a new pod template (roll_pods) -----------------------------------------------------------


async def test_a_new_template_replaces_replicas_first_and_moves_the_primary_last() -> None:
    fake = three(pending=False)
    operator = Operator(fake)
    operator.revision = "new"

    await step(operator)
    assert fake.deleted == ["demo-0"]
    await step(operator)
    assert fake.deleted == ["demo-0", "demo-2"]
    # Only the primary runs the old template: it switches over instead of being deleted.
    await step(operator)
    assert fake.deleted == ["demo-0", "demo-2"]
    assert [c.body for c in fake.posts("/switchover")] == [
        {"leader": "demo-1", "candidate": "demo-2"}
    ]
    assert operator.switchover["reason"] == "RollingUpdate"
    await step(operator)  # switchover seen done: the old primary is a replica now
    await step(operator)
    assert fake.deleted == ["demo-0", "demo-2", "demo-1"]
    assert fake.primary() == "demo-2"


async def test_no_pod_is_replaced_while_a_switchover_runs() -> None:
    fake = three(pending=False)
    fake.switch_at_once = False
    for name in ("demo-0", "demo-2"):
        fake.members[name].revision = "new"
    operator = Operator(fake)
    operator.revision = "new"
    await step(operator)
    assert len(fake.posts("/switchover")) == 1
    notes = await step(operator)
    assert "rolling update waits for the switchover" in notes
    assert fake.deleted == [] and len(fake.posts("/switchover")) == 1


async def test_a_synchronous_replication_change_is_applied_without_a_restart() -> None:
    fake = three(pending=False)
    operator = Operator(fake)
    before = make_cluster(replicas=3)
    fake.dcs = {
        **config_spec.ha_settings(before),
        "postgresql": {"parameters": config_spec.parameters(before)},
    }
    await operator.reconcile()
    fake.forget_calls()
    operator.spec = {"synchronous": {"mode": "Required", "number": 2}}

    await step(operator)
    await step(operator)
    patches = [c for c in fake.calls if c.method == "PATCH"]
    assert [(c.member, c.body) for c in patches] == [
        ("demo-1", {"synchronous_mode_strict": True, "synchronous_node_count": 2})
    ]
    assert fake.posts() == [] and "rollingRestart" not in fake.status
    assert fake.reasons() == ["ConfigurationApplied"]
