"""The Database's name check: a child of that name owned by someone else is never taken over,
also when the watch has not delivered it yet."""

from __future__ import annotations

from typing import Any

import pytest

from stateward.controllers import database
from stateward.controllers.store import ObjectStore
from tests.unit.test_specs_database import make_database

pytestmark = pytest.mark.unit


class SeenByTheServer:
    """The API server knows the Database's main child ``shop``, which the watch has not
    delivered; ``owner_uid`` None: nobody controls it (a user made it), else that object."""

    def __init__(self, owner_uid: str | None = None, *, exists: bool = True) -> None:
        self.owner_uid = owner_uid
        self.exists = exists
        self.gets: list[tuple[str, str, str]] = []
        self.events: list[tuple[str, str]] = []

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Any:
        self.gets.append((api_version, kind, name))
        if not self.exists:
            return None
        owners = [{"uid": self.owner_uid, "controller": True}] if self.owner_uid else []
        return {"metadata": {"name": name, "namespace": namespace, "ownerReferences": owners}}

    async def event(self, body: Any, *, reason: str, message: str, warning: bool = False) -> None:
        self.events.append((reason, message))


def a_scope(engine: str, kube: SeenByTheServer) -> database.Scope:
    return database.Scope(
        database=make_database(engine),
        body={"metadata": {"name": "shop", "namespace": "apps"}},
        kube=kube,  # type: ignore[arg-type]
        store=ObjectStore(),
        now="2026-12-04T00:00:00Z",
        conditions=[],
    )


@pytest.mark.parametrize(
    ("engine", "asked"),
    [
        ("postgres", ("stateward.io/v1alpha1", "PostgresCluster", "shop")),
        ("mariadb", ("apps/v1", "StatefulSet", "shop")),
    ],
)
async def test_a_name_taken_that_the_watch_has_not_delivered_is_still_never_taken_over(
    engine: str, asked: tuple[str, str, str]
) -> None:
    kube = SeenByTheServer()  # e.g. a PostgresCluster a user created just before
    scope = a_scope(engine, kube)
    with pytest.raises(database.Stop, match=f"a {asked[1]} named shop already exists"):
        await database.check_name(scope)
    assert kube.gets == [asked], "asked the API server, not the store"
    assert [reason for reason, _ in scope.degraded] == ["NameTaken"]
    assert [reason for reason, _ in kube.events] == ["NameTaken"]


async def test_a_child_of_its_own_lets_the_database_go_on_and_is_kept_for_later_phases() -> None:
    kube = SeenByTheServer()
    scope = a_scope("postgres", kube)
    kube.owner_uid = scope.database.uid
    assert await database.check_name(scope) is None
    assert scope.observed("PostgresCluster", "shop") is not None, "kept for later phases"
    assert scope.degraded == []
    assert await database.check_name(scope) is None
    assert len(kube.gets) == 1, "asked once: the store holds it now"


async def test_no_child_at_all_lets_the_database_go_on() -> None:
    kube = SeenByTheServer(exists=False)
    scope = a_scope("postgres", kube)
    assert await database.check_name(scope) is None
    assert scope.degraded == [] and kube.events == []
