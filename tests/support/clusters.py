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


REPOSITORY: dict[str, Any] = {
    "s3": {
        "endpoint": "s3.example.com",
        "bucket": "backups",
        "credentialsSecret": "s3-credentials",
    }
}
"""A complete ``spec.backup.repository``: an S3 bucket and its credentials Secret."""
BACKUP: dict[str, Any] = {"repository": REPOSITORY}
"""A complete ``spec.backup``."""
