"""Host slots for the tests' clusters with real nodes: each pytest-xdist worker runs its own
shared cluster (``real_cluster``) in a slot of its own, and the e2e stories, which start and
stop clusters of their own, use one more slot that no worker's shared cluster takes. So any
worker may run any group of real-node tests in any order (and ``make test`` runs three
workers, each with a cluster of its own, at the same time)."""

from __future__ import annotations

import os

from stateward_local.nodes import layout

STORY_SLOT = layout.Slot(layout.SLOTS - 1)
"""The e2e stories' slot: never a worker's shared cluster's."""


def worker_slot() -> layout.Slot:
    """``gw0`` (or no xdist at all) is slot 0, ``gw1`` slot 1, ``gw2`` slot 2; a fourth
    worker would share slot 0 with the first (a second ``up`` there is refused, loudly)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return layout.Slot(int(worker.removeprefix("gw")) % STORY_SLOT.number)
