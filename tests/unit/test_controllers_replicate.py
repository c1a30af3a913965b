"""MySQL and MariaDB replication (``DatabaseReconciler.replicate``) against a fake SQL layer:
what is sent to which server, in which order, and what the Database then says."""

from __future__ import annotations

from typing import Any

import pytest

from stateward.controllers import core, database
from stateward.controllers.mariadb import reconcile as mariadb
from stateward.controllers.store import ObjectStore
from stateward.specs import meta
from stateward.specs.mariadb import servers as mysql_spec
from tests.support.fake_sql import (
    NAME,
    NAMESPACE,
    FakeSQL,
    Server,
    Servers,
    host,
    primary,
    replica,
)
from tests.unit.test_specs_database import make_database

pytestmark = pytest.mark.unit


def converged() -> FakeSQL:
    return FakeSQL(
        primary("shop-0"),
        replica("shop-1", of="shop-0"),
        replica("shop-2", of="shop-0"),
    )


async def test_a_new_database_gets_a_primary_whose_replicas_connect_before_it_writes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sql = FakeSQL(*(Server(f"shop-{i}", role=None) for i in range(3)))
    world = Servers(monkeypatch, sql)
    note = await world.replicate()

    assert sql.changes == [
        ("detach", "shop-0"),
        ("follow", "shop-1"),
        ("follow", "shop-2"),
        ("wait_for_replicas", "shop-0"),
        # Writable last, waiting for a replica's acknowledgement of every commit.
        ("open_writes(semi_sync=True)", "shop-0"),
    ]
    assert world.status["primaryPod"] == "shop-0"
    assert [(r, w) for r, _, w in world.kube.events] == [("PrimaryElected", False)]
    assert note is not None and note.startswith("made shop-0 the primary")
    assert sql.servers["shop-1"].source == host("shop-0")


async def test_a_converged_database_sends_no_change_and_patches_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = Servers(monkeypatch, converged())
    for _ in range(2):
        assert await world.replicate() is None
    assert world.sql.changes == []
    assert world.kube.labels == [] and world.kube.events == []


async def test_replicas_are_labelled_for_the_services_once_they_replicate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sql = FakeSQL(*(Server(f"shop-{i}", role=None) for i in range(3)))
    world = Servers(monkeypatch, sql)
    await world.replicate()
    # Labelled from what was observed before the changes: the primary at once, the
    # replicas once they are seen replicating.
    assert world.kube.labels == [("shop-0", meta.PRIMARY_ROLE)]
    world.forget()
    await world.replicate()
    assert sorted(world.kube.labels) == [("shop-1", "replica"), ("shop-2", "replica")]
    assert world.sql.changes == []
    world.forget()
    await world.replicate()
    assert world.kube.labels == [] and world.sql.changes == []


async def test_a_lost_primary_is_replaced_by_the_most_advanced_replica_after_all_stop_receiving(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sql = FakeSQL(
        primary("shop-0", gtid="0-1-120", answers=False, ready=False),
        replica("shop-1", of="shop-0", gtid="0-1-118"),
        replica("shop-2", of="shop-0", gtid="0-1-117", received="0-1-119"),
    )
    world = Servers(monkeypatch, sql)
    world.status["primaryPod"] = "shop-0"
    await world.replicate()

    # Every replica stops taking the lost primary's WAL before the choice is made, so none
    # acknowledges another of its commits; then the most advanced (received counts) wins.
    stops = [c for c in sql.changes if c[0] == "stop_receiving"]
    assert sql.changes[: len(stops)] == stops and sorted(stops) == [
        ("stop_receiving", "shop-1"),
        ("stop_receiving", "shop-2"),
    ]
    assert sql.changes[len(stops) :] == [
        ("detach", "shop-2"),
        ("follow", "shop-1"),
        ("wait_for_replicas", "shop-2"),
        ("open_writes(semi_sync=True)", "shop-2"),
    ]
    assert world.status["primaryPod"] == "shop-2"
    assert world.status["lastFailover"]["fromPod"] == "shop-0"
    assert world.status["lastFailover"]["toPod"] == "shop-2"
    ((reason, message, warning),) = world.kube.events
    assert reason == "Failover" and warning
    assert "the primary shop-0 was lost or restarted; promoted shop-2" in message
    assert ("shop-0", None) in world.kube.labels  # the Services stop sending writes there


async def test_a_failover_waits_for_a_silent_server_whose_data_exists(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sql = FakeSQL(
        primary("shop-0", answers=False, ready=False),
        replica("shop-1", of="shop-0"),
        replica("shop-2", of="shop-0", answers=False, ready=False),
    )
    world = Servers(monkeypatch, sql)
    world.status["primaryPod"] = "shop-0"
    note = await world.replicate()

    assert note is not None and "shop-2 cannot be asked what it holds" in note
    assert "kubectl delete pvc data-shop-2" in note
    assert [c for c in sql.changes if c[0] != "stop_receiving"] == []  # nothing promoted
    assert world.status["primaryPod"] == "shop-0" and world.kube.events == []
    assert [reason for reason, _ in world.progressing] == ["FailoverWaits"]

    # The user accepts the loss of what only shop-2 held: its claim is deleted.
    sql.servers["shop-2"].claim = False
    world.forget()
    await world.replicate()
    assert ("detach", "shop-1") in sql.changes and world.status["primaryPod"] == "shop-1"


async def test_a_primary_that_only_stopped_answering_gets_a_grace_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sql = converged()
    sql.servers["shop-0"].answers = False  # its pod still ready: maybe a stall
    world = Servers(monkeypatch, sql)
    world.status["primaryPod"] = "shop-0"

    note = await world.replicate()
    assert note is not None and "does not answer over SQL but its pod is ready" in note
    world.now += mariadb.FAILOVER_GRACE - 1
    await world.replicate()
    assert sql.changes == [] and world.status["primaryPod"] == "shop-0"

    world.now += 1
    await world.replicate()
    assert ("detach", "shop-1") in sql.changes and world.status["primaryPod"] == "shop-1"


async def test_a_restarted_operator_waits_the_whole_grace_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sql = converged()
    sql.servers["shop-0"].answers = False
    world = Servers(monkeypatch, sql)
    world.status["primaryPod"] = "shop-0"
    await world.replicate()
    world.now += mariadb.FAILOVER_GRACE - 1
    world.restart()
    world.now += 1
    await world.replicate()
    assert sql.changes == []  # never less than the grace, however the operator restarts


async def test_a_departing_primary_is_made_read_only_before_anyone_is_promoted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sql = converged()
    sql.servers["shop-0"].deleting = True  # its pod is being deleted, mariadbd still runs
    world = Servers(monkeypatch, sql)
    world.status["primaryPod"] = "shop-0"
    await world.replicate()
    assert sql.changes[0] == ("fence", "shop-0")
    assert ("detach", "shop-1") in sql.changes
    assert sql.changes.index(("fence", "shop-0")) < sql.changes.index(("detach", "shop-1"))
    assert not sql.servers["shop-0"].writable


async def test_a_second_writable_server_is_fenced_not_promoted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A former primary came back writable beside the one the replicas follow.
    sql = FakeSQL(
        primary("shop-0"),
        replica("shop-1", of="shop-0"),
        Server("shop-2", role=None, writable=True, gtid="0-3-5", semi_sync=True),
    )
    world = Servers(monkeypatch, sql)
    world.status["primaryPod"] = "shop-0"
    await world.replicate()
    assert sql.changes == [("fence", "shop-2"), ("follow", "shop-2")]
    ((reason, message, warning),) = world.kube.events
    assert reason == "ServerFenced" and warning and message.startswith("shop-2 was writable")
    assert world.status["primaryPod"] == "shop-0"


async def test_a_scale_down_moves_the_primary_below_the_cut_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sql = FakeSQL(
        replica("shop-0", of="shop-2", gtid="0-1-99"),
        replica("shop-1", of="shop-2", gtid="0-1-100"),
        primary("shop-2"),
    )
    world = Servers(monkeypatch, sql, replicas=2)  # scaled down from 3
    world.status["primaryPod"] = "shop-2"
    await world.replicate()
    assert sql.changes == [("switchover(to=shop-1)", "shop-2")]  # the most advanced survivor
    assert world.status["primaryPod"] == "shop-1"
    ((reason, message, _),) = world.kube.events
    assert reason == "SwitchedOver" and "from shop-2 to shop-1" in message

    world.forget()
    await world.replicate()  # the others are pointed at the new primary; no second switch
    assert sorted(sql.changes) == [("follow", "shop-0"), ("follow", "shop-2")]


async def test_semi_sync_is_switched_on_once_a_replica_replicates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sql = FakeSQL(primary("shop-0", semi_sync=False), Server("shop-1", role=None))
    world = Servers(monkeypatch, sql, replicas=2)
    world.status["primaryPod"] = "shop-0"
    await world.replicate()
    assert sql.changes == [("follow", "shop-1")]  # not yet: shop-1 is still joining
    world.forget()
    await world.replicate()
    assert sql.changes == [("set_semi_sync(True)", "shop-0")]
    assert [reason for reason, _, _ in world.kube.events] == ["SemiSyncEnabled"]
    world.forget()
    await world.replicate()
    assert sql.changes == []


@pytest.mark.parametrize(
    ("primary", "marked_before", "marked"),
    [
        (None, False, False),  # a new Database: its first servers may initialize
        ("shop-0", False, True),  # it has had a primary: it has data
        (None, True, True),  # the mark outlives the primary, the status and a restart
    ],
)
async def test_the_servers_configmap_says_whether_the_database_has_data(
    monkeypatch: pytest.MonkeyPatch, primary: str | None, marked_before: bool, marked: bool
) -> None:
    db = make_database("mariadb")
    store = ObjectStore()
    observed = mysql_spec.config_map(db, mysql_spec.config_files(db), has_data=marked_before)
    store.observe({**observed, "metadata": {**observed["metadata"], "resourceVersion": "1"}})
    applied: list[dict[str, Any]] = []

    async def converge(scope: core.Scope, desired: list[dict[str, Any]]) -> None:
        applied.extend(desired)

    monkeypatch.setattr(core, "converge", converge)
    scope = database.Scope(
        database=db,
        body={"metadata": {"name": NAME, "namespace": NAMESPACE}},
        kube=None,  # type: ignore[arg-type]
        store=store,
        secrets=core.SecretCache(),
        now=core.now(),
        conditions=[],
        primary=primary,
    )
    await mariadb.apply_servers(scope)
    config = next(c for c in applied if c["kind"] == "ConfigMap")
    assert mysql_spec.has_data_marked(config) is marked
