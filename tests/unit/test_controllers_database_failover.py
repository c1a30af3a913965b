"""The MariaDB failover's guards that need no server: the grace before leaving a primary
that only stopped answering, and when the primary waits for acknowledgements."""

from __future__ import annotations

from typing import Any

import pytest

from stateward.controllers import database
from stateward.controllers.mariadb import failover, sql
from stateward.controllers.mariadb import reconcile as mariadb
from stateward.controllers.store import ObjectStore
from tests.support.clock import Clock
from tests.unit.test_specs_database import make_database

pytestmark = pytest.mark.unit


def pod(name: str, *, ready: bool = True, deleting: bool = False) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": "apps"}
    if deleting:
        metadata["deletionTimestamp"] = "2026-12-04T00:00:00Z"
    return {
        "kind": "Pod",
        "metadata": metadata,
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


class Kube:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    async def event(self, body: Any, *, reason: str, message: str, warning: bool = False) -> None:
        self.events.append((reason, message))


def scope(replicas: int = 3, kube: Kube | None = None) -> database.Scope:
    db = make_database("mariadb", replicas=replicas)
    return database.Scope(
        database=db,
        body={"metadata": {"name": "shop", "namespace": "apps"}},
        kube=kube or Kube(),  # type: ignore[arg-type]
        store=ObjectStore(),
        now="2026-12-04T00:00:00Z",
        conditions=[],
    )


def test_a_silent_primary_whose_pod_is_ready_gets_a_grace_before_the_failover() -> None:
    clock = Clock()
    reconciler = database.DatabaseReconciler(None, ObjectStore(), clock=clock)  # type: ignore[arg-type]
    s = scope()
    waiting = reconciler.servers._failover_wait(s, pod("shop-0"))
    assert waiting is not None and "shop-0 does not answer" in waiting
    clock.now += mariadb.FAILOVER_GRACE - 0.5
    assert reconciler.servers._failover_wait(s, pod("shop-0")) is not None  # still within the grace
    clock.now += 0.5
    assert reconciler.servers._failover_wait(s, pod("shop-0")) is None  # silent long enough


@pytest.mark.parametrize("proof", [None, pod("shop-0", ready=False), pod("shop-0", deleting=True)])
def test_kubernetes_proof_fails_over_at_once(proof: dict[str, Any] | None) -> None:
    reconciler = database.DatabaseReconciler(None, ObjectStore(), clock=Clock())  # type: ignore[arg-type]
    assert reconciler.servers._failover_wait(scope(), proof) is None


def test_the_grace_starts_again_for_another_primary() -> None:
    clock = Clock()
    reconciler = database.DatabaseReconciler(None, ObjectStore(), clock=clock)  # type: ignore[arg-type]
    s = scope()
    reconciler.servers._failover_wait(s, pod("shop-0"))
    clock.now += mariadb.FAILOVER_GRACE
    assert reconciler.servers._failover_wait(s, pod("shop-1")) is not None


SOURCE0 = failover.host_of(make_database("mariadb"), "shop-0")


def primary(semi_sync: bool) -> failover.Server:
    return failover.Server(
        pod="shop-0", ready=True, role="primary", writable=True, semi_sync=semi_sync
    )


def replica(name: str, *, replicating: bool) -> failover.Server:
    return failover.Server(
        pod=name, ready=True, role="replica", writable=False, source=SOURCE0,
        replicating=replicating, semi_sync=False,
    )  # fmt: skip


async def keep(
    monkeypatch: pytest.MonkeyPatch, observed: list[failover.Server], replicas: int
) -> tuple[list[bool], Kube]:
    switched: list[bool] = []

    async def set_semi_sync(address: str, credentials: Any, engine: Any, *, on: bool) -> None:
        switched.append(on)

    monkeypatch.setattr(sql, "set_semi_sync", set_semi_sync)
    kube = Kube()
    credentials = sql.Credentials(root_password="r", replication_password="p")
    await mariadb._keep_semi_sync(scope(replicas, kube), observed[0], observed, credentials, "ip")
    return switched, kube


async def test_semi_sync_starts_once_a_replica_replicates(monkeypatch: pytest.MonkeyPatch) -> None:
    # Scaled up: not while the new replicas are still being copied (writes would stop)...
    waiting = [primary(False), replica("shop-1", replicating=False)]
    assert (await keep(monkeypatch, waiting, 3))[0] == []
    # ... but as soon as one replicates.
    switched, kube = await keep(
        monkeypatch, [primary(False), replica("shop-1", replicating=True)], 3
    )
    assert switched == [True] and kube.events[0][0] == "SemiSyncEnabled"


async def test_semi_sync_stays_on_when_every_replica_is_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Commits wait rather than become acknowledged writes that only the primary holds.
    switched, _ = await keep(monkeypatch, [primary(True), replica("shop-1", replicating=False)], 3)
    assert switched == []
    switched, _ = await keep(monkeypatch, [primary(True)], 2)
    assert switched == []


async def test_semi_sync_stops_when_the_database_is_scaled_to_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    switched, kube = await keep(monkeypatch, [primary(True)], 1)
    assert switched == [False] and kube.events[0][0] == "SemiSyncDisabled"


def test_a_failover_waits_for_every_server_whose_data_exists_but_cannot_be_asked() -> None:
    # Semi-synchronous: any one replica acknowledges a commit. shop-2 may hold one that the
    # server to promote lacks: silent with a ready pod, not ready (its node cut off with the
    # primary's), or with no pod at all — while its volume claim exists, the failover waits.
    decided = failover.Plan(primary="shop-1", promote="shop-1", failover_from="shop-0")
    promoted = replica("shop-1", replicating=False)
    claim = {"metadata": {"name": "data-shop-2"}}
    claims: dict[str, Any] = {"shop-0": claim, "shop-1": claim, "shop-2": claim}
    silent = failover.Server(pod="shop-2", ready=False, role="replica")
    assert mariadb._may_hold_more(decided, [promoted, silent], claims) == ["shop-2"]
    assert mariadb._may_hold_more(decided, [promoted], claims) == ["shop-2"], "no pod"
    # Answering (and so stopped from receiving, then compared): no wait.
    answering = replica("shop-2", replicating=False)
    assert mariadb._may_hold_more(decided, [promoted, answering], claims) == []
    # Its data gone, or going (the user accepted losing what only it held): no wait.
    deleting = {"metadata": {"name": "data-shop-2", "deletionTimestamp": "2026-12-04T00:00:00Z"}}
    for gone in (None, deleting):
        assert mariadb._may_hold_more(decided, [promoted, silent], {**claims, "shop-2": gone}) == []
    # The lost primary itself is never waited for (its unacknowledged tail is not a loss).
    assert mariadb._may_hold_more(decided, [promoted, answering], claims) == []
    assert mariadb._may_hold_more(failover.Plan(primary="shop-1"), [promoted], claims) == []


def test_a_server_without_a_node_of_its_own_is_named_with_the_scheduler_s_reason() -> None:
    waiting = pod("shop-2", ready=False)
    waiting["status"]["conditions"].append(
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/2 nodes are available: 2 node(s) didn't match pod anti-affinity rules."}
    )  # fmt: skip
    message = mariadb._unschedulable([pod("shop-0"), pod("shop-1"), waiting])
    assert message is not None
    assert message.startswith("shop-2: 0/2 nodes are available")
    assert "a node of its own" in message and "spec.replicas" in message
    assert mariadb._unschedulable([pod("shop-0"), pod("shop-1", ready=False)]) is None
