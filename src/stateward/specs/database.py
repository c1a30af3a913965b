"""A Database with ``engine: postgres`` is a simpler face on a PostgresCluster: it owns one
of the same name, with its version, replicas, storage, network policy and CA, and every
other choice left to the PostgresCluster's defaults (synchronous replication, the ``app``
database and owner, no backups). Pure: the model in, the child out."""

from __future__ import annotations

from stateward.api import v1alpha1
from stateward.specs import meta

POSTGRES_APP = meta.APP_NAME


def postgres_cluster(database: v1alpha1.Database) -> meta.Object:
    """The PostgresCluster ``NAME`` that runs a postgres Database."""
    if database.spec.engine is not v1alpha1.Engine.POSTGRES:
        raise ValueError(f"Database {database.name!r} is {database.spec.engine}, not postgres")
    spec: meta.Object = {
        "version": database.spec.version,
        "replicas": database.spec.replicas,
        "storageSize": database.spec.storage.size,
    }
    if database.spec.storage.storage_class_name is not None:
        spec["storageClassName"] = database.spec.storage.storage_class_name
    # Only what the user set: a PostgresCluster made before these fields existed stays as
    # it is.
    for field, value in (
        ("networkPolicy", database.spec.network_policy),
        ("tls", database.spec.tls),
    ):
        chosen = value.model_dump(mode="json", by_alias=True, exclude_defaults=True)
        if chosen:
            spec[field] = chosen
    return {
        "apiVersion": v1alpha1.API_VERSION,
        "kind": v1alpha1.KIND,
        "metadata": meta.object_meta(database, database.name, app=POSTGRES_APP),
        "spec": spec,
    }


PHASES: dict[str, v1alpha1.DatabasePhase] = {
    v1alpha1.Phase.CREATING: v1alpha1.DatabasePhase.PENDING,
    v1alpha1.Phase.READY: v1alpha1.DatabasePhase.RUNNING,
    v1alpha1.Phase.UPDATING: v1alpha1.DatabasePhase.UPDATING,
    v1alpha1.Phase.FAILING: v1alpha1.DatabasePhase.FAILED,
    v1alpha1.Phase.DELETING: v1alpha1.DatabasePhase.DELETING,
}
"""A PostgresCluster's phase as its Database reports it."""


def phase_of(cluster_phase: str | None) -> v1alpha1.DatabasePhase:
    return PHASES.get(cluster_phase or "", v1alpha1.DatabasePhase.PENDING)
