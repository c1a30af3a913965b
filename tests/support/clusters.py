"""PostgresCluster models for unit tests of pure code."""

from __future__ import annotations

from typing import Any

from stateward.api.v1alpha1 import PostgresCluster


def make_cluster(*, metadata: dict[str, Any] | None = None, **spec: Any) -> PostgresCluster:
    """``demo`` in namespace ``db``: version 16, 3 replicas, 1Gi, overridden by ``spec``."""
    return PostgresCluster.model_validate(
        {
            "metadata": {"name": "demo", "namespace": "db", "uid": "uid-1", **(metadata or {})},
            "spec": {"version": "16", "replicas": 3, "storageSize": "1Gi", **spec},
        }
    )
