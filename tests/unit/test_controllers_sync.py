"""Which replicas are synchronous standbys (``observe_sync``) against a fake Patroni: Patroni's
``NAME-sync`` record is not watched, so the operator reads it when the members changed, once
more a Patroni loop later, and at least every minute, and never for a cluster at rest in
between. Status names the standbys Patroni names, and a switchover asks for one of them."""

from __future__ import annotations

import dataclasses

import pytest

from stateward.controllers.postgres import dataplane
from stateward.controllers.postgres.dataplane import DataPlane
from stateward.specs import meta
from stateward.specs.postgres import config as config_spec
from tests.support.clusters import make_cluster
from tests.support.fake_patroni import NAME, FakePatroni, Member, Operator

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def three() -> FakePatroni:
    return FakePatroni(
        Member("demo-0", wal=990),
        Member("demo-1", role=meta.PRIMARY_ROLE, replication_state=None),
        Member("demo-2", wal=995),
        sync={"demo-2"},
    )


def with_clock(fake: FakePatroni) -> tuple[Operator, Clock]:
    operator = Operator(fake)
    clock = Clock()
    operator.data_plane = DataPlane(clock=clock)
    return operator, clock


async def settled(fake: FakePatroni) -> tuple[Operator, Clock]:
    """An operator that has read the record twice, a Patroni loop apart: it believes it."""
    operator, clock = with_clock(fake)
    await operator.reconcile()
    clock.now += dataplane.SYNC_CONFIRM
    await operator.reconcile()
    return operator, clock


def sync_reads(fake: FakePatroni) -> int:
    return sum(1 for c in fake.calls if c.method == "GET" and c.member == f"{NAME}-sync")


def standbys(operator: Operator) -> list[str]:
    instances = operator.fake.status.get("instances") or []
    return sorted(i["name"] for i in instances if i.get("role") == "sync_standby")


async def test_read_when_new_again_a_patroni_loop_later_then_not_at_rest() -> None:
    fake = three()
    operator, clock = with_clock(fake)
    await operator.reconcile()
    assert sync_reads(fake) == 1 and standbys(operator) == ["demo-2"]
    await operator.reconcile()  # within the loop: believed, nothing read
    assert sync_reads(fake) == 1
    clock.now += dataplane.SYNC_CONFIRM
    await operator.reconcile()  # a loop later: read again, agrees, settled
    assert sync_reads(fake) == 2
    for _ in range(3):
        clock.now += 5
        await operator.reconcile()
    assert sync_reads(fake) == 2  # at rest: no request


async def test_a_settled_record_is_read_again_after_a_minute() -> None:
    fake = three()
    operator, clock = await settled(fake)
    fake.sync = {"demo-0"}  # Patroni chose anew; nothing on the pods shows it
    clock.now += dataplane.SYNC_MAX_AGE - 1
    await operator.reconcile()
    assert standbys(operator) == ["demo-2"] and sync_reads(fake) == 2
    clock.now += 1
    await operator.reconcile()
    assert standbys(operator) == ["demo-0"] and sync_reads(fake) == 3


async def test_a_member_restarted_between_two_reconciles_has_the_record_read_again() -> None:
    # The member looks as it did (streaming, ready) but restarted meanwhile, and Patroni
    # chose another standby while it was down: its pod changed, so the record is read.
    fake = three()
    operator, clock = await settled(fake)
    fake.members["demo-2"].restarts += 1
    fake.sync = {"demo-0"}
    clock.now += 1
    await operator.reconcile()
    assert standbys(operator) == ["demo-0"]


async def test_a_new_choice_read_right_after_a_change_is_confirmed_a_loop_later() -> None:
    # Read as the member came back, before Patroni's loop chose another standby: the read a
    # loop later sees the new choice although nothing changed on the pods since.
    fake = three()
    operator, clock = await settled(fake)
    fake.members["demo-2"].restarts += 1
    clock.now += 1
    await operator.reconcile()
    assert standbys(operator) == ["demo-2"]
    fake.sync = {"demo-0"}
    clock.now += dataplane.SYNC_CONFIRM
    await operator.reconcile()
    assert standbys(operator) == ["demo-0"]


async def test_a_requested_switchover_asks_for_the_standby_patroni_names_now() -> None:
    fake = three()
    operator, _clock = await settled(fake)
    fake.sync = {"demo-0"}  # not read yet: the record is settled and the pods are as they were
    operator.request_switchover("any")
    await operator.reconcile()
    ((switchover,),) = [fake.posts("/switchover")]
    assert switchover.body == {"leader": "demo-1", "candidate": "demo-0"}
    assert "SwitchoverFailed" not in fake.reasons()


async def test_no_record_at_all_is_read_once() -> None:
    # Labelled pods with no Patroni behind them (simulated nodes): nothing to confirm.
    fake = three()
    fake.sync_written = False
    operator, clock = with_clock(fake)
    await operator.reconcile()
    clock.now += dataplane.SYNC_CONFIRM
    await operator.reconcile()
    assert sync_reads(fake) == 1 and standbys(operator) == []


async def test_no_read_without_synchronous_replication_or_a_primary() -> None:
    fake = three()
    operator = Operator(fake, synchronous={"mode": "Off"})
    await operator.reconcile()
    assert sync_reads(fake) == 0 and standbys(operator) == []
    leaderless = FakePatroni(Member("demo-0"), Member("demo-1"), sync={"demo-1"})
    operator = Operator(leaderless)
    await operator.reconcile()
    assert sync_reads(leaderless) == 0


async def test_no_read_while_no_standby_streams_and_one_as_soon_as_one_does() -> None:
    # A cluster coming up: the primary runs, its replicas do not stream yet. None can be
    # synchronous, whatever Patroni's record still says.
    fake = FakePatroni(
        Member("demo-0", role=meta.PRIMARY_ROLE, replication_state=None),
        Member("demo-1", replication_state=None),
        sync={"demo-1"},
    )
    operator, clock = with_clock(fake)
    for _ in range(3):
        await operator.reconcile()
        clock.now += dataplane.SYNC_CONFIRM
    assert sync_reads(fake) == 0 and standbys(operator) == []
    fake.members["demo-1"] = dataclasses.replace(
        fake.members["demo-1"], replication_state="streaming"
    )
    await operator.reconcile()
    assert sync_reads(fake) == 1 and standbys(operator) == ["demo-1"]


async def test_quorum_commit_names_every_voter_soon_after_the_switch() -> None:
    # Patroni's record is settled for Priority; the spec switches to quorum commit. The
    # operator sends Patroni the new mode and, since Patroni chooses its standbys anew, reads
    # the record again instead of believing the old one for a minute.
    fake = three()
    running = make_cluster(replicas=3)  # what Patroni runs: the spec before the switch
    fake.dcs = {
        **config_spec.ha_settings(running),
        "postgresql": {"parameters": config_spec.parameters(running)},
    }
    operator, clock = await settled(fake)
    assert sync_reads(fake) == 2
    operator.spec = {"synchronous": {"method": "Quorum"}}
    clock.now += 1
    await operator.reconcile()
    ((patch,),) = [[c for c in fake.calls if c.method == "PATCH"][-1:]]
    assert patch.body == {"synchronous_mode": "quorum"}
    fake.sync = {"demo-0", "demo-2"}  # Patroni's next loop: every streaming replica votes
    clock.now += dataplane.SYNC_CONFIRM
    await operator.reconcile()
    instances = operator.fake.status.get("instances") or []
    roles = {i["name"]: i.get("role") for i in instances}
    assert roles == {
        "demo-0": "quorum_standby",
        "demo-1": "primary",
        "demo-2": "quorum_standby",
    }
