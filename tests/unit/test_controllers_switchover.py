"""A planned switchover (the ``stateward.io/switchover`` annotation), against a fake Patroni:
which member is asked, what the status and Events say, what is refused, and that a request
is served once — across reconciles and across an operator restart."""

from __future__ import annotations

import pytest

from stateward.api import v1alpha1
from stateward.controllers.kube import PatroniError
from stateward.controllers.postgres import dataplane
from stateward.specs import meta
from tests.support.fake_patroni import Call, FakePatroni, Member, Operator, stamp

pytestmark = pytest.mark.unit

ANNOTATION = v1alpha1.SWITCHOVER_ANNOTATION


def three(*, sync: set[str] | None = None, **demo2: object) -> FakePatroni:
    """demo-0 the primary; demo-1 the synchronous standby; demo-2 a replica (``demo2``)."""
    return FakePatroni(
        Member("demo-0", role=meta.PRIMARY_ROLE, replication_state=None, wal=1000),
        Member("demo-1", wal=990),
        Member("demo-2", **{"wal": 995, **demo2}),  # type: ignore[arg-type]
        sync={"demo-1"} if sync is None else sync,
    )


async def settled(fake: FakePatroni, **spec: object) -> Operator:
    """An operator that has reconciled the cluster once, with nothing to do."""
    operator = Operator(fake, **spec)
    await operator.reconcile()
    assert fake.posts() == []
    fake.forget_calls()
    return operator


async def test_a_requested_switchover_asks_the_primary_and_reports_the_new_one() -> None:
    fake = three()
    operator = await settled(fake)
    operator.request_switchover("demo-1")

    await operator.reconcile()
    assert fake.posts() == [
        Call("demo-0", "POST", "/switchover", {"leader": "demo-0", "candidate": "demo-1"})
    ]
    assert operator.switchover["phase"] == "Running"
    assert (operator.switchover["fromPod"], operator.switchover["target"]) == ("demo-0", "demo-1")
    assert fake.reasons() == ["SwitchoverStarted"]
    progressing = next(c for c in fake.status["conditions"] if c["type"] == "Progressing")
    assert "switching over from demo-0 to demo-1" in progressing["message"]

    # Patroni handed over: the next reconcile sees demo-1 labelled primary.
    fake.forget_calls()
    await operator.reconcile()
    assert fake.posts() == []
    assert operator.switchover["phase"] == "Succeeded"
    assert operator.switchover["message"] == "demo-1 is the primary"
    assert fake.status["primaryPod"] == "demo-1"
    assert fake.reasons() == ["SwitchedOver"]  # planned: not reported as a failover
    assert "lastFailover" not in fake.status
    assert ANNOTATION not in fake.annotations  # answered: the next value is a new request


async def test_a_served_request_is_not_served_again() -> None:
    fake = three()
    operator = await settled(fake)
    operator.request_switchover("demo-1")
    await operator.reconcile()
    await operator.reconcile()
    assert operator.switchover["phase"] == "Succeeded"
    fake.forget_calls()

    await operator.reconcile()
    await operator.reconcile()
    # Nothing at all: no request to Patroni or the API server, no Event, no status write.
    assert fake.calls == [] and fake.events == []
    assert fake.annotation_patches == [] and fake.status_patches == 0


async def test_a_switchover_under_way_is_followed_not_asked_again() -> None:
    fake = three()
    fake.switch_at_once = False
    operator = await settled(fake)
    operator.request_switchover("demo-1")
    await operator.reconcile()
    assert len(fake.posts("/switchover")) == 1
    fake.forget_calls()

    notes = await operator.reconcile()
    assert "waiting for the switchover" in notes
    assert fake.posts() == [] and fake.events == []
    assert operator.switchover["phase"] == "Running"
    assert ANNOTATION in fake.annotations  # not answered yet

    fake.complete_switchover("demo-1")
    await operator.reconcile()
    assert operator.switchover["phase"] == "Succeeded" and fake.posts() == []


async def test_a_restarted_operator_finishes_the_switchover_it_started() -> None:
    fake = three()
    fake.switch_at_once = False
    operator = await settled(fake)
    operator.request_switchover("demo-1")
    await operator.reconcile()
    fake.forget_calls()

    operator.restart()  # only status.switchover remembers it
    await operator.reconcile()
    assert fake.posts() == [] and operator.switchover["phase"] == "Running"
    fake.complete_switchover("demo-1")
    await operator.reconcile()
    assert fake.posts() == []
    assert operator.switchover["phase"] == "Succeeded"
    assert fake.reasons() == ["SwitchedOver"]
    assert "lastFailover" not in fake.status  # the new process knew it was planned


async def test_any_picks_the_freshest_synchronous_standby() -> None:
    fake = three(sync={"demo-1", "demo-2"})
    operator = await settled(fake)
    operator.request_switchover("any")
    await operator.reconcile()
    ((call,),) = [fake.posts("/switchover")]
    assert call.body == {"leader": "demo-0", "candidate": "demo-2"}  # 995 beats 990
    await operator.reconcile()
    assert operator.switchover["target"] == "demo-2"


async def test_any_without_synchronous_replication_picks_the_freshest_replica() -> None:
    fake = three(sync=set())
    operator = await settled(fake, synchronous={"mode": "Off"})
    operator.request_switchover("any")
    await operator.reconcile()
    assert [c.body["candidate"] for c in fake.posts("/switchover")] == ["demo-2"]


@pytest.mark.parametrize(
    "demo2",
    [{"ready": False}, {"replication_state": "in archive recovery"}],
    ids=["not-ready", "not-streaming"],
)
async def test_a_switchover_to_an_unhealthy_target_is_refused_naming_it(
    demo2: dict[str, object],
) -> None:
    fake = three(sync={"demo-1", "demo-2"}, **demo2)
    operator = await settled(fake)
    operator.request_switchover("demo-2")
    await operator.reconcile()

    assert fake.posts() == []  # Patroni is not even asked
    assert operator.switchover["phase"] == "Failed"
    assert operator.switchover["message"] == "demo-2 is not a ready, streaming replica"
    assert fake.events == [("SwitchoverFailed", "demo-2 is not a ready, streaming replica", True)]
    assert ANNOTATION not in fake.annotations
    assert fake.primary() == "demo-0"

    fake.forget_calls()
    await operator.reconcile()
    assert fake.posts() == [] and fake.events == []  # refused once, not again and again


async def test_a_switchover_that_could_lose_commits_is_refused() -> None:
    fake = three()  # demo-2 streams, but only demo-1 is a synchronous standby
    operator = await settled(fake)
    operator.request_switchover("demo-2")
    await operator.reconcile()
    assert fake.posts() == []
    assert operator.switchover["phase"] == "Failed"
    message = operator.switchover["message"]
    assert "demo-2 is not a synchronous standby (those are demo-1)" in message
    assert "could lose acknowledged commits" in message


async def test_a_request_naming_no_instance_is_refused_with_the_names_to_use() -> None:
    fake = three()
    operator = await settled(fake)
    operator.request_switchover("demo-7")
    await operator.reconcile()
    assert fake.posts() == []
    assert operator.switchover["phase"] == "Failed"
    message = operator.switchover["message"]
    assert (
        "names no instance of this cluster; use one of demo-0, demo-1, demo-2 or 'any'" in message
    )


async def test_a_request_for_the_current_primary_changes_nothing() -> None:
    fake = three()
    operator = await settled(fake)
    operator.request_switchover("demo-0")
    await operator.reconcile()
    assert fake.posts() == []
    assert operator.switchover["phase"] == "Succeeded"
    assert operator.switchover["message"] == "demo-0 already is the primary"
    assert fake.reasons() == ["SwitchoverSkipped"] and ANNOTATION not in fake.annotations


async def test_no_candidate_for_any_is_a_refusal_not_a_wait() -> None:
    fake = three(sync=set())  # synchronous mode on, no synchronous standby yet
    operator = await settled(fake)
    operator.request_switchover("any")
    await operator.reconcile()
    assert fake.posts() == []
    assert operator.switchover["phase"] == "Failed"
    assert operator.switchover["message"] == (
        "no ready, streaming replica to switch over to (only synchronous standbys qualify)"
    )


async def test_patronis_refusal_is_reported_with_its_reason() -> None:
    fake = three()
    fake.answer("/switchover", (412, "candidate demo-1 is lagging"))
    operator = await settled(fake)
    operator.request_switchover("demo-1")
    await operator.reconcile()
    assert len(fake.posts("/switchover")) == 1
    assert operator.switchover["phase"] == "Failed"
    assert operator.switchover["message"] == (
        "Patroni refused the switchover to demo-1: candidate demo-1 is lagging"
    )
    assert ("SwitchoverFailed", operator.switchover["message"], True) in fake.events
    assert ANNOTATION not in fake.annotations
    fake.forget_calls()
    await operator.reconcile()
    assert fake.posts() == []  # a refused request is not retried on its own


async def test_an_unanswered_request_is_observed_then_failed_after_the_timeout() -> None:
    # Patroni did not answer in time (it may still be switching over): the operator watches
    # instead of asking again, and reports a failure once the deadline has passed.
    fake = three()
    fake.answer("/switchover", PatroniError("Patroni at 10.0.0.10:8008 did not answer"))
    fake.switch_at_once = False
    operator = await settled(fake)
    operator.request_switchover("demo-1")
    operator.clock = stamp(dataplane.SWITCHOVER_TIMEOUT + 5)
    await operator.reconcile()
    assert operator.switchover["phase"] == "Running"
    assert fake.reasons() == ["SwitchoverStarted"]

    operator.clock = None
    fake.forget_calls()
    await operator.reconcile()
    assert fake.posts() == []
    assert operator.switchover["phase"] == "Failed"
    assert operator.switchover["message"].startswith(
        "demo-0 is still the primary 120s after the switchover started"
    )
    assert fake.reasons() == ["SwitchoverFailed"] and ANNOTATION not in fake.annotations


async def test_a_switchover_waits_for_the_rest_api_credentials() -> None:
    fake = three()
    fake.secrets_present = False
    operator = await settled(fake)
    operator.request_switchover("demo-1")
    notes = await operator.reconcile()
    assert fake.posts() == []
    assert "switchover waits for Secret demo-patroni-api" in notes
    assert "switchover" not in fake.status and ANNOTATION in fake.annotations
