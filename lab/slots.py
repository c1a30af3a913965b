"""The host slot of this test process's real nodes: each pytest-xdist worker has its own, so
that `make test`'s two workers each run a cluster with real nodes at the same time."""

from __future__ import annotations

import os

from stateward_local.nodes import layout


def worker_slot() -> layout.Slot:
    """``gw0`` (or no xdist at all) is slot 0, ``gw1`` slot 1, and so on."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return layout.Slot(int(worker.removeprefix("gw")) % layout.SLOTS)
