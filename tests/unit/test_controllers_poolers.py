"""The pooler around a switchover, against a fake Patroni and fake PgBouncer consoles:
PAUSE before the primary is asked to step down, RESUME only once the primary Service leads
to the new one, never a pause left behind (a refused switchover, a failed PAUSE, an operator
restart)."""

from __future__ import annotations

from typing import Any

import pytest

from stateward.controllers import certificates
from stateward.controllers.postgres import pgbouncer, poolers
from tests.support.fake_patroni import FakePatroni, Operator
from tests.unit.test_controllers_switchover import settled, three

pytestmark = pytest.mark.unit

POOLERS = ["demo-pooler-0", "demo-pooler-1"]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakePatroni:
    fake = three()
    fake.poolers = list(POOLERS)
    monkeypatch.setattr(pgbouncer, "console", fake.console)

    async def context(*_: Any) -> object:
        return object()

    monkeypatch.setattr(certificates, "console_context", context)
    monkeypatch.setattr(poolers, "SETTLE_SECONDS", 0.0)
    monkeypatch.setattr(poolers, "INLINE_SECONDS", 0.0)  # one look, unless a test waits
    return fake


async def pooled(fake: FakePatroni) -> Operator:
    operator = await settled(fake, pooler={})
    fake.console_calls.clear()
    return operator


async def test_the_pooler_is_paused_before_and_resumed_after_the_switchover(
    fake: FakePatroni,
) -> None:
    operator = await pooled(fake)
    operator.request_switchover("demo-1")
    fake.primary_endpoints = [fake.members["demo-0"].address]  # kube-proxy not there yet

    await operator.reconcile()
    assert sorted(fake.console_calls) == [(p, "PAUSE") for p in POOLERS]
    assert fake.posts()  # asked Patroni after pausing
    assert operator.switchover["poolerPaused"] == POOLERS

    # demo-1 is the primary, but the Service still leads to demo-0: held.
    fake.console_calls.clear()
    await operator.reconcile()
    assert fake.console_calls == [] and fake.paused == set(POOLERS)
    assert operator.switchover["phase"] == "Running"

    fake.primary_endpoints = None  # the Service follows the new primary
    await operator.reconcile()
    assert sorted(fake.console_calls) == [(p, "RESUME") for p in POOLERS]
    assert fake.paused == set()
    assert operator.switchover["phase"] == "Succeeded"
    assert "poolerPaused" not in operator.switchover

    fake.console_calls.clear()
    await operator.reconcile()
    assert fake.console_calls == []  # nothing more to do at rest


async def test_the_reconcile_that_switches_over_resumes_as_soon_as_the_service_follows(
    fake: FakePatroni, monkeypatch: pytest.MonkeyPatch
) -> None:
    operator = await pooled(fake)
    monkeypatch.setattr(poolers, "INLINE_SECONDS", 5.0)
    monkeypatch.setattr(poolers, "POLL", 0.01)
    fake.primary_endpoints = [fake.members["demo-0"].address]  # kube-proxy not there yet
    looks = 0
    list_objects = fake.list_objects

    async def slices(*args: Any, **kwargs: Any) -> Any:
        nonlocal looks
        looks += 1
        if looks == 3:
            fake.primary_endpoints = None  # the Service follows the new primary
        return await list_objects(*args, **kwargs)

    monkeypatch.setattr(fake, "list_objects", slices)
    operator.request_switchover("demo-1")

    await operator.reconcile()
    assert sorted(fake.console_calls[:2]) == [(p, "PAUSE") for p in POOLERS]
    assert sorted(fake.console_calls[2:]) == [(p, "RESUME") for p in POOLERS]
    assert looks >= 3 and fake.paused == set()
    assert "poolerPaused" not in operator.switchover

    fake.console_calls.clear()
    await operator.reconcile()
    assert operator.switchover["phase"] == "Succeeded"
    assert fake.console_calls == []  # resumed already: nothing more to send


async def test_a_pooler_that_cannot_be_paused_is_resumed_and_the_switchover_goes_on(
    fake: FakePatroni,
) -> None:
    operator = await pooled(fake)
    fake.console_fails[("demo-pooler-1", "PAUSE")] = "PAUSE did not complete within 10s"
    operator.request_switchover("demo-1")

    await operator.reconcile()
    assert fake.paused == set()  # demo-pooler-0 was paused, then resumed
    assert ("demo-pooler-0", "RESUME") in fake.console_calls
    assert "PoolerNotPaused" in fake.reasons()
    assert fake.posts() and "poolerPaused" not in operator.switchover


async def test_a_refused_switchover_resumes_the_pooler(fake: FakePatroni) -> None:
    operator = await pooled(fake)
    fake.answer("/switchover", (412, "no good candidate"))
    operator.request_switchover("demo-1")

    await operator.reconcile()
    assert operator.switchover["phase"] == "Failed"
    assert fake.paused == set()
    assert [c for _, c in fake.console_calls].count("RESUME") == 2


async def test_a_restarted_operator_resumes_what_a_crash_may_have_left_paused(
    fake: FakePatroni,
) -> None:
    operator = await pooled(fake)
    fake.paused = {"demo-pooler-1"}  # paused by an operator that died before its status write
    operator.restart()

    await operator.reconcile()
    assert sorted(fake.console_calls) == [(p, "RESUME") for p in POOLERS]
    assert fake.paused == set()
    fake.console_calls.clear()
    await operator.reconcile()
    assert fake.console_calls == []  # once per operator start, not per reconcile


async def test_a_cluster_without_a_pooler_never_calls_a_console(fake: FakePatroni) -> None:
    operator = await settled(fake)
    operator.request_switchover("demo-1")
    await operator.reconcile()
    await operator.reconcile()
    assert operator.switchover["phase"] == "Succeeded"
    assert fake.console_calls == []
