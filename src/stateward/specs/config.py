"""The ConfigMap holding ``patroni.yaml``, and the hash that rolls the pods when it changes."""

from __future__ import annotations

import hashlib
import json

from stateward.api import v1alpha1
from stateward.instance import patroni
from stateward.specs import meta

HASH_LENGTH = 16


def render(cluster: v1alpha1.PostgresCluster) -> str:
    """``patroni.yaml``, with Patroni listing its members by the instance selector labels."""
    return patroni.render(cluster, labels=meta.selector_labels(cluster))


def config_map(cluster: v1alpha1.PostgresCluster) -> meta.Object:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        # No component label: Patroni lists ConfigMaps by the instance selector labels and
        # must not see (or ever delete) this one.
        "metadata": meta.object_meta(cluster, cluster.patroni_config_map_name),
        "data": {patroni.CONFIG_FILE_NAME: render(cluster)},
    }


def config_hash(cluster: v1alpha1.PostgresCluster) -> str:
    """Short sha256 of the configuration a running instance reads, for the pod template
    annotation: a change rolls the pods. ``bootstrap.dcs`` (the PostgreSQL parameters among
    it) is left out: Patroni reads it only to initialize a new cluster, and the operator
    applies later changes through Patroni's ``PATCH /config`` without restarting anything."""
    document = patroni.configuration(cluster, labels=meta.selector_labels(cluster))
    document["bootstrap"] = {k: v for k, v in document["bootstrap"].items() if k != "dcs"}
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:HASH_LENGTH]
