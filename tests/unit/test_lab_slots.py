"""The tests' host slots: each worker's shared cluster and the stories never share one."""

from __future__ import annotations

import pytest
from lab import slots

pytestmark = pytest.mark.unit


def test_three_workers_and_the_stories_each_have_a_slot_of_their_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    taken = []
    for worker in ("gw0", "gw1", "gw2"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        taken.append(slots.worker_slot().number)
    assert taken == [0, 1, 2]
    assert slots.STORY_SLOT.number == 3 and slots.STORY_SLOT.number not in taken
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert slots.worker_slot().number == 0  # no xdist at all: the first slot
