"""Degraded: every problem in the condition, each announced once in a Warning Event."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from stateward.controllers import core

pytestmark = pytest.mark.unit


class Events:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    async def event(self, involved: Any, *, reason: str, message: str, warning: bool) -> None:
        assert warning
        self.sent.append((reason, message))


def reconcile(
    kube: Events, conditions: list[dict[str, Any]], *problems: tuple[str, str]
) -> list[dict[str, Any]]:
    """One reconcile that finds ``problems``; the conditions it leaves for the next."""
    scope = core.Scope(
        body={"metadata": {"name": "demo", "namespace": "db"}},
        kube=kube,  # type: ignore[arg-type]
        store=None,  # type: ignore[arg-type]
        now="2026-12-04T00:00:00Z",
        conditions=[dict(c) for c in conditions],
    )

    async def run() -> None:
        for reason, message in problems:
            await scope.degrade(reason, message)

    asyncio.run(run())
    scope.summarize("settled")
    return scope.conditions


def test_each_problem_is_announced_once_while_it_lasts_even_beside_another() -> None:
    kube = Events()
    secret = ("SecretMissing", "Secret demo-app is missing")
    storage = ("StorageClassNotFound", "StorageClass 'fast' does not exist")
    conditions = reconcile(kube, [], secret)
    assert kube.sent == [secret]
    # A second problem: announced, the first not again (though the condition's reason is
    # the first problem's), and neither on the reconciles after.
    conditions = reconcile(kube, conditions, secret, storage)
    conditions = reconcile(kube, conditions, secret, storage)
    assert kube.sent == [secret, storage]
    (degraded,) = [c for c in conditions if c["type"] == "Degraded"]
    assert degraded["status"] == "True" and degraded["reason"] == "SecretMissing"
    # A changed message is news; a problem gone and back is news again.
    changed = ("StorageClassNotFound", "StorageClass 'faster' does not exist")
    conditions = reconcile(kube, conditions, secret, changed)
    conditions = reconcile(kube, conditions)
    conditions = reconcile(kube, conditions, secret)
    assert kube.sent == [secret, storage, changed, secret]


def test_one_problem_found_twice_in_a_reconcile_is_one_event() -> None:
    kube = Events()
    reconcile(kube, [], ("FencingInvalid", "bad"), ("FencingInvalid", "bad"))
    assert kube.sent == [("FencingInvalid", "bad")]
