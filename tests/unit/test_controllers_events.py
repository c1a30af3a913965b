"""Events are best effort: a refused Event never fails a reconcile."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest
from lightkube import ApiError
from lightkube.models.meta_v1 import Status

from stateward.controllers import core
from stateward.controllers.kube import Kube, NotLeader

pytestmark = pytest.mark.unit

CLUSTER = {
    "apiVersion": "stateward.io/v1alpha1",
    "kind": "PostgresCluster",
    "metadata": {"name": "pg", "namespace": "leaving", "uid": "u1"},
}


class RefusingClient:
    """A namespace being deleted: the API server refuses new objects in it."""

    def __init__(self) -> None:
        self.creates = 0

    async def request(self, method: str, path: str, **_: Any) -> tuple[int, bytes]:
        assert (method, path) == ("POST", "/api/v1/namespaces/leaving/events")
        self.creates += 1
        refused = {
            "apiVersion": "v1",
            "kind": "Status",
            "status": "Failure",
            "code": 403,
            "reason": "Forbidden",
            "message": "events is forbidden: unable to create new content in namespace"
            " leaving because it is being terminated",
        }
        return 403, json.dumps(refused).encode()


def test_an_event_refused_in_a_terminating_namespace_does_not_fail_the_caller() -> None:
    client = RefusingClient()
    counted: list[tuple[str, str]] = []
    kube = Kube(client, on_event=lambda reason, kind: counted.append((reason, kind)))

    async def send() -> None:
        await kube.event(CLUSTER, reason="FinalBackupImpossible", message="m", warning=True)
        await kube.settle_events()

    asyncio.run(send())
    assert client.creates == 1  # it was tried
    assert counted == []  # and not counted as recorded


class SlowClient:
    """Answers a create only when told to: an Event whose round trip takes long."""

    def __init__(self) -> None:
        self.answer = asyncio.Event()
        self.created: list[str] = []

    async def request(self, method: str, path: str, *, body: bytes, **_: Any) -> tuple[int, bytes]:
        await self.answer.wait()
        self.created.append(json.loads(body)["reason"])
        return 201, body


def test_an_event_does_not_hold_the_reconcile_and_is_recorded_before_settling() -> None:
    client = SlowClient()
    counted: list[tuple[str, str]] = []
    kube = Kube(client, on_event=lambda reason, kind: counted.append((reason, kind)))

    async def reconcile() -> None:
        # Returns at once although the API server has not answered yet.
        await asyncio.wait_for(kube.event(CLUSTER, reason="Created", message="m"), 1)
        assert client.created == []
        client.answer.set()
        await kube.settle_events()  # as a status write does before it patches
        assert client.created == ["Created"] and counted == [("Created", "Normal")]

    asyncio.run(reconcile())


def test_a_status_write_waits_for_its_own_clusters_events_not_anothers() -> None:
    client = SlowClient()
    kube = Kube(client)
    other = {**CLUSTER, "metadata": {**CLUSTER["metadata"], "name": "other"}}

    async def reconciles() -> None:
        await kube.event(CLUSTER, reason="Slow", message="m")
        # Another cluster's status write does not wait for this one's slow Event ...
        await asyncio.wait_for(kube.settle_events(other), 1)
        # ... while this cluster's does, until it is answered.
        settling = asyncio.create_task(kube.settle_events(CLUSTER))
        await asyncio.sleep(0)
        assert not settling.done()
        client.answer.set()
        await asyncio.wait_for(settling, 1)
        assert client.created == ["Slow"]
        await asyncio.wait_for(kube.settle_events(), 1)  # nothing left anywhere

    asyncio.run(reconciles())


def test_a_replica_that_lost_leadership_still_writes_no_event() -> None:
    client = RefusingClient()
    kube = Kube(client, may_write=lambda: False)
    with pytest.raises(NotLeader):
        asyncio.run(kube.event(CLUSTER, reason="R", message="m"))
    assert client.creates == 0


def test_a_write_refused_by_a_terminating_namespace_is_no_failure() -> None:
    refused = ApiError(
        status=Status(
            code=403,
            reason="Forbidden",
            message='statefulsets.apps "pg" is forbidden: unable to create new content in'
            " namespace leaving because it is being terminated",
        )
    )
    assert core.namespace_terminating(refused)
    other = ApiError(status=Status(code=403, reason="Forbidden", message="RBAC: access denied"))
    assert not core.namespace_terminating(other)
    assert not core.namespace_terminating(RuntimeError("because it is being terminated"))


def test_a_reconciled_object_found_gone_is_no_failure() -> None:
    gone = ApiError(
        status=Status(code=404, reason="NotFound",
                      message='postgresclusters.stateward.io "doomed" not found')
    )  # fmt: skip
    assert core.object_gone(gone, "postgresclusters", "doomed")
    assert not core.object_gone(gone, "postgresclusters", "other")
    child = ApiError(
        status=Status(code=404, reason="NotFound", message='pods "doomed-0" not found')
    )
    assert not core.object_gone(child, "postgresclusters", "doomed")


class UnreachableClient:
    """The API server is down: every request fails to connect."""

    async def request(self, *_: Any, **__: Any) -> tuple[int, bytes]:
        raise ConnectionError("POST /api/v1/namespaces/leaving/events: ClientConnectorError")


def test_an_event_lost_to_an_api_server_outage_is_no_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kube = Kube(UnreachableClient())

    async def send() -> None:
        await kube.event(CLUSTER, reason="Created", message="m")
        await kube.settle_events()

    with caplog.at_level(logging.INFO, logger="stateward.controllers.kube"):
        asyncio.run(send())
    levels = [r.levelname for r in caplog.records if "Created" in r.getMessage()]
    assert levels == ["INFO"], "an outage is ridden out: logged, never as an error"
