"""Kopf's per-object memory is not kept (stateward.runtime.operator.UnheldMemories): the
operator registers only event handlers and keeps its own store, and at 1000 clusters those
memories held ~18 MiB of an RSS goal of 200."""

from __future__ import annotations

import kopf
import pytest

from stateward.runtime.operator import UnheldMemories

pytestmark = pytest.mark.unit


def body(uid: str) -> dict[str, object]:
    return {"metadata": {"uid": uid, "name": f"pg-{uid}", "namespace": "db"}}


async def test_every_event_gets_a_memory_and_none_is_held() -> None:
    memories = UnheldMemories()
    for i in range(1000):
        memory = await memories.recall(body(str(i)), noticed_by_listing=i % 2 == 0)
        assert memory.noticed_by_listing == (i % 2 == 0)
    assert list(memories.iter_all_memories()) == []
    await memories.forget(body("7"))  # a DELETED event forgets what was never held


async def test_a_fresh_memory_starts_from_the_operators_memo() -> None:
    base = kopf.Memo(shared="yes")
    first = await UnheldMemories().recall(body("1"), memobase=base)
    assert first.memo["shared"] == "yes"
    first.memo["mine"] = 1
    second = await UnheldMemories().recall(body("1"), memobase=base)
    assert "mine" not in second.memo, "a memory lives for one event, not the object's life"
