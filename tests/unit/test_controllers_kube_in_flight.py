"""Kube lets a bounded number of requests to the API server through at once."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from stateward.controllers.kube import Kube, Ref

pytestmark = pytest.mark.unit


class SlowApiServer:
    """Kube's transport, answering each request after the test says so."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.most = 0
        self.answer = asyncio.Event()

    async def request(self, *_: Any, **__: Any) -> tuple[int, bytes]:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            await self.answer.wait()
        finally:
            self.in_flight -= 1
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}
        return 200, json.dumps(body).encode()


async def until(condition: Any) -> None:
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("never happened")


async def test_requests_beyond_the_bound_wait_their_turn_and_all_are_answered() -> None:
    server = SlowApiServer()
    kube = Kube(server, in_flight=3)
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "n"}}
    calls = [kube.get("v1", "ConfigMap", "n", "c") for _ in range(5)]
    calls += [kube.apply(body) for _ in range(5)]
    calls += [kube.patch(Ref.of(body), {"data": {}}) for _ in range(5)]
    answered = asyncio.gather(*calls)
    await until(lambda: server.in_flight == 3)
    assert server.most == 3  # twelve wait in Kube, not in the HTTP client's pool
    server.answer.set()
    results = await answered
    assert len(results) == 15 and server.most == 3


async def test_without_a_bound_every_request_goes_at_once() -> None:
    server = SlowApiServer()
    kube = Kube(server)
    answered = asyncio.gather(*(kube.get("v1", "ConfigMap", "n", "c") for _ in range(10)))
    await until(lambda: server.in_flight == 10)
    server.answer.set()
    assert len(await answered) == 10
