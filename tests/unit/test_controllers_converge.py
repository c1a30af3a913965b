"""core.converge: what it writes, and what it spares comparing again."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest

from stateward.controllers import core
from stateward.controllers.postgres import reconcile as postgrescluster
from stateward.specs import postgres as postgres_specs
from stateward.specs.postgres import config
from tests.support.clusters import make_cluster
from tests.support.stores import CountingStore

pytestmark = pytest.mark.unit


class Server:
    """Applies echoed back as the API server would: each write a new resourceVersion."""

    def __init__(self) -> None:
        self.versions = itertools.count(100)
        self.applied: list[dict[str, Any]] = []
        self.deleted: list[Any] = []

    async def apply(self, body: dict[str, Any]) -> dict[str, Any]:
        self.applied.append(body)
        metadata = {**body["metadata"], "namespace": "db", "uid": f"uid-{body['metadata']['name']}"}
        metadata["resourceVersion"] = str(next(self.versions))
        return {**copy.deepcopy(body), "metadata": metadata}

    async def delete(self, ref: Any, **_: Any) -> None:
        self.deleted.append(ref)

    async def event(self, *_: Any, **__: Any) -> None:
        return None


def setup() -> tuple[Any, Server, CountingStore, list[dict[str, Any]]]:
    cluster = make_cluster(version="15")
    children = postgres_specs.children(cluster, patroni_config=config.patroni_config(cluster))
    server, store = Server(), CountingStore()

    def scope() -> postgrescluster.Scope:
        return postgrescluster.Scope(
            cluster=cluster,
            body=cluster.model_dump(by_alias=True, mode="json"),
            kube=server,  # type: ignore[arg-type]
            store=store,
            now="2026-12-07T08:00:00Z",
            conditions=[],
        )

    return scope, server, store, children


async def test_children_unchanged_since_they_were_compared_are_not_compared_again() -> None:
    scope, server, store, children = setup()
    assert (await core.converge(scope(), children) or "").startswith("created")
    written = len(server.applied)
    assert await core.converge(scope(), children) is None  # compared: each contains ours
    assert len(server.applied) == written
    store.decoded = 0
    assert await core.converge(scope(), children) is None
    assert store.decoded == 0 and len(server.applied) == written


async def test_a_child_someone_else_changed_is_compared_and_repaired() -> None:
    scope, server, store, children = setup()
    await core.converge(scope(), children)
    await core.converge(scope(), children)
    service = next(c for c in children if c["kind"] == "Service")
    name = service["metadata"]["name"]
    edited = store.get("Service", "db", name)
    assert edited is not None
    edited["spec"]["ports"][0]["port"] = 6543
    edited["metadata"]["resourceVersion"] = "999"  # the API server's, for the hand edit
    store.observe(edited)
    written = len(server.applied)
    note = await core.converge(scope(), children)
    assert note is not None and f"Service {name}" in note
    assert [b["metadata"]["name"] for b in server.applied[written:]] == [name]


async def test_a_change_to_immutable_fields_alone_is_still_found() -> None:
    # The applied hash leaves out a StatefulSet's volumeClaimTemplates (the API server
    # refuses changes there); the memo keys on the whole desired body, so a new template
    # still makes the object recreated.
    scope, server, _, children = setup()
    await core.converge(scope(), children)
    await core.converge(scope(), children)
    grown = copy.deepcopy(children)
    statefulset = next(c for c in grown if c["kind"] == "StatefulSet")
    template = statefulset["spec"]["volumeClaimTemplates"][0]
    template["spec"]["storageClassName"] = "faster"
    written = len(server.applied)
    note = await core.converge(scope(), grown)
    assert note is not None and "volumeClaimTemplates" in note
    assert [r.kind for r in server.deleted] == ["StatefulSet"]
    assert [b["kind"] for b in server.applied[written:]] == ["StatefulSet"]
