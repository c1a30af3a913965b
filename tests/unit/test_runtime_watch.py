"""The operator's watches (stateward.runtime.watch): a LIST then a WATCH per kind, resumed from
the last version seen, relisted when the server no longer has it, and every object deleted
while nobody watched delivered as deleted. Driven through a scripted API server."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx2
import pytest

from stateward.runtime.transport import HttpxTransport
from stateward.runtime.watch import Resource, Watch, _lines

pytestmark = pytest.mark.unit

PODS = Resource("", "v1", "pods", "Pod")
STATEFULSETS = Resource("apps", "v1", "statefulsets", "StatefulSet")
Body = dict[str, Any]


def pod(name: str, version: str, namespace: str = "ns", uid: str | None = None) -> Body:
    return {"metadata": {"name": name, "namespace": namespace, "resourceVersion": version,
                         "uid": uid or f"uid-{name}"}}  # fmt: skip


def listing(items: list[Body], version: str, token: str | None = None) -> httpx2.Response:
    metadata: Body = {"resourceVersion": version}
    if token:
        metadata["continue"] = token
    return httpx2.Response(200, json={"kind": "PodList", "metadata": metadata, "items": items})


def stream(*events: Body, chunk: int = 0) -> httpx2.Response:
    """A watch response that sends ``events`` and ends, as the server does at timeoutSeconds;
    ``chunk`` > 0 cuts the bytes into pieces of that size, across line boundaries."""
    data = b"".join(json.dumps(e).encode() + b"\n" for e in events)
    pieces = [data[i : i + chunk] for i in range(0, len(data), chunk)] if chunk else [data]

    async def body() -> AsyncIterator[bytes]:
        for piece in pieces:
            yield piece

    return httpx2.Response(200, content=body())


def status(code: int, reason: str, message: str) -> httpx2.Response:
    return httpx2.Response(
        code, json={"kind": "Status", "code": code, "reason": reason, "message": message}
    )


class Api:
    """Answers each request with the next scripted response; once the script is done, holds
    every request open (a watch with nothing to say) until the test ends."""

    def __init__(self, *script: httpx2.Response | Callable[[], httpx2.Response]) -> None:
        self.script = list(script)
        self.requests: list[httpx2.Request] = []
        self.done = asyncio.Event()

    async def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request)
        if not self.script:
            self.done.set()
            await asyncio.Event().wait()
        answer = self.script.pop(0)
        return answer() if callable(answer) else answer

    def params(self, index: int) -> dict[str, str]:
        return dict(self.requests[index].url.params)


class Seen:
    """The handler: every delivery in order, and a store of what is current."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []
        self.store: dict[tuple[str, str], Body] = {}

    def __call__(self, kind: str, body: Body) -> None:
        metadata = body["metadata"]
        key = (metadata.get("namespace", ""), metadata["name"])
        self.events.append((kind, body["kind"], metadata["name"]))
        if kind == "DELETED":
            self.store.pop(key, None)
        else:
            self.store[key] = body

    def known(self) -> list[Body]:
        return list(self.store.values())


async def run_until_script_done(watch: Watch, api: Api) -> None:
    task = asyncio.create_task(watch.run())
    try:
        await asyncio.wait_for(api.done.wait(), 10.0)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def new_watch(api: Api, seen: Seen, resource: Resource = PODS, **kwargs: Any) -> Watch:
    kwargs.setdefault("backoff_first", 0.01)
    kwargs.setdefault("backoff_max", 0.02)
    return Watch(transport(api), resource, seen, known=seen.known, **kwargs)


def transport(api: Api) -> HttpxTransport:
    """The watch's transport over the scripted server (the operator's own, aiohttp, runs
    against the real API server in the integration tests)."""
    return HttpxTransport(
        httpx2.AsyncClient(transport=httpx2.MockTransport(api), base_url="https://kube")
    )


def test_paths_of_core_and_grouped_kinds_cluster_wide_and_in_a_namespace() -> None:
    assert PODS.path(None) == "/api/v1/pods"
    assert PODS.path("db") == "/api/v1/namespaces/db/pods"
    assert STATEFULSETS.path(None) == "/apis/apps/v1/statefulsets"
    assert STATEFULSETS.path("db") == "/apis/apps/v1/namespaces/db/statefulsets"
    assert (PODS.api_version, STATEFULSETS.api_version) == ("v1", "apps/v1")


async def test_a_paged_list_is_delivered_typed_then_watched_from_its_version() -> None:
    api = Api(
        listing([pod("a", "5")], "10", token="next"),
        listing([pod("b", "7")], "10"),
        stream(
            {"type": "ADDED", "object": {**pod("c", "11"), "kind": "Pod"}},
            {"type": "MODIFIED", "object": pod("a", "12")},
            {"type": "DELETED", "object": pod("b", "13")},
        ),
    )
    seen = Seen()
    watch = new_watch(api, seen, selector="app.kubernetes.io/managed-by=stateward", page=1)
    await run_until_script_done(watch, api)
    assert seen.events == [
        ("ADDED", "Pod", "a"), ("ADDED", "Pod", "b"),
        ("ADDED", "Pod", "c"), ("MODIFIED", "Pod", "a"), ("DELETED", "Pod", "b"),
    ]  # fmt: skip
    assert watch.synced.is_set()
    assert all(body["apiVersion"] == "v1" for body in seen.store.values())
    assert api.params(0) == {
        "limit": "1",
        "labelSelector": "app.kubernetes.io/managed-by=stateward",
    }
    assert api.params(1)["continue"] == "next"
    watching = api.params(2)
    assert watching["watch"] == "true" and watching["resourceVersion"] == "10"
    assert watching["allowWatchBookmarks"] == "true"
    assert watching["labelSelector"] == "app.kubernetes.io/managed-by=stateward"
    # The next watch resumes after the last event, with no second LIST.
    assert api.params(3)["resourceVersion"] == "13" and (watch.lists, watch.watches) == (1, 2)


async def test_a_bookmark_moves_the_version_on_and_delivers_nothing() -> None:
    api = Api(
        listing([], "10"),
        stream(
            {"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": "90"}}}
        ),
    )
    seen = Seen()
    watch = new_watch(api, seen)
    await run_until_script_done(watch, api)
    assert seen.events == []
    assert api.params(2)["resourceVersion"] == "90"


async def test_a_watch_too_old_for_the_server_relists_and_delivers_what_was_deleted_meanwhile() -> (
    None
):
    seen = Seen()

    def second_list() -> httpx2.Response:
        # Written by the operator after this LIST's snapshot: newer than it, not deleted.
        seen.store[("ns", "just-created")] = {**pod("just-created", "25"), "kind": "Pod"}
        return listing([pod("kept", "5")], "20")

    api = Api(
        listing([pod("kept", "5"), pod("gone", "6")], "10"),
        stream({"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}),
        second_list,
    )
    seen.store[("x", "other-ns")] = {**pod("other-ns", "6", namespace="x"), "kind": "Pod"}
    watch = new_watch(api, seen, namespace="ns")
    await run_until_script_done(watch, api)
    assert ("DELETED", "Pod", "gone") in seen.events
    assert ("DELETED", "Pod", "just-created") not in seen.events
    assert set(seen.store) == {("ns", "kept"), ("ns", "just-created"), ("x", "other-ns")}, (
        "an object of another namespace is not this watch's to delete"
    )
    assert watch.lists == 2
    assert api.params(3)["resourceVersion"] == "20"
    assert api.requests[3].url.path == "/api/v1/namespaces/ns/pods"


async def test_a_list_refused_is_retried_with_one_warning_naming_the_kind_and_the_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = Api(
        status(403, "Forbidden", 'pods is forbidden: User "op" cannot list resource "pods"'),
        status(429, "TooManyRequests", "storage is (re)initializing"),
        httpx2.Response(503, text="not json"),
        listing([pod("a", "5")], "10"),
    )
    seen = Seen()
    watch = new_watch(api, seen)
    with caplog.at_level(logging.DEBUG, logger="stateward.watch"):
        await run_until_script_done(watch, api)
    assert seen.events == [("ADDED", "Pod", "a")] and watch.synced.is_set()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "could not list the watched objects yet: pods: list of pods: 403 Forbidden:"
        ' pods is forbidden: User "op" cannot list resource "pods"; retrying'
    ]
    later = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert any("429 TooManyRequests: storage is (re)initializing" in m for m in later)
    assert any("503 Service Unavailable" in m for m in later)


async def test_an_error_event_other_than_gone_resumes_from_the_same_version_without_a_list() -> (
    None
):
    api = Api(
        listing([], "10"),
        stream(
            {"type": "MODIFIED", "object": pod("a", "11")},
            {"type": "ERROR", "object": {"kind": "Status", "code": 500, "message": "etcd hiccup"}},
        ),
    )
    seen = Seen()
    watch = new_watch(api, seen)
    await run_until_script_done(watch, api)
    assert watch.lists == 1
    assert api.params(2)["resourceVersion"] == "11"


async def test_a_watch_the_server_ends_at_once_backs_off_instead_of_spinning() -> None:
    api = Api(listing([], "10"), *(stream() for _ in range(4)))
    seen = Seen()
    watch = new_watch(api, seen, backoff_first=0.05, backoff_max=0.2)
    started = time.monotonic()
    await run_until_script_done(watch, api)
    # Four empty watches: 0.05 + 0.1 + 0.2 + 0.2 s of backoff at least (jitter ±20 %).
    assert time.monotonic() - started >= 0.8 * 0.55


async def test_a_handler_that_fails_on_one_object_does_not_end_the_watch(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def handler(kind: str, body: Body) -> None:
        if body["metadata"]["name"] == "bad":
            raise KeyError("spec")
        delivered.append(body["metadata"]["name"])

    delivered: list[str] = []
    api = Api(
        listing([pod("bad", "5"), pod("good", "6")], "10"),
        stream({"type": "ADDED", "object": pod("c", "11")}),
    )
    watch = Watch(transport(api), PODS, handler)
    await run_until_script_done(watch, api)
    assert delivered == ["good", "c"]
    assert "handling Pod ns/bad failed" in caplog.text


async def test_lines_are_split_wherever_the_chunks_end() -> None:
    async def chunks(*pieces: bytes) -> AsyncIterator[bytes]:
        for piece in pieces:
            yield piece

    got = [line async for line in _lines(chunks(b'{"a":', b'1}\n{"b"', b":2}\n\n", b'{"c":3}'))]
    assert [json.loads(line) for line in got] == [{"a": 1}, {"b": 2}, {"c": 3}]


async def test_events_split_across_chunks_are_delivered_whole() -> None:
    events = [{"type": "ADDED", "object": pod(f"p{i}", str(11 + i))} for i in range(5)]
    api = Api(listing([], "10"), stream(*events, chunk=7))
    seen = Seen()
    await run_until_script_done(new_watch(api, seen), api)
    assert [name for _kind, _k, name in seen.events] == [f"p{i}" for i in range(5)]
