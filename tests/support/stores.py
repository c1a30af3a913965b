"""An ObjectStore that counts what it decodes, for tests of what a reader spares."""

from __future__ import annotations

from typing import Any

from stateward.controllers.store import ObjectStore


class CountingStore(ObjectStore):
    """Counts the bodies decoded (every ``get``)."""

    def __init__(self) -> None:
        super().__init__()
        self.decoded = 0

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        self.decoded += 1
        return super().get(kind, namespace, name)
