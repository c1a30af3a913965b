"""The ConfigMap holding ``patroni.yaml``, and the hash that rolls the pods when it changes."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from stateward.api import v1alpha1
from stateward.instance import patroni
from stateward.specs import meta

HASH_LENGTH = 16


@dataclasses.dataclass(frozen=True)
class PatroniConfig:
    """``patroni.yaml`` for one cluster, built once per reconcile and passed along: the text
    goes into the ConfigMap, the hash into the pod template."""

    text: str
    hash: str


def patroni_config(cluster: v1alpha1.PostgresCluster) -> PatroniConfig:
    """The instances' Patroni configuration (members listed by the instance selector labels),
    from one :func:`patroni.configuration` document."""
    document = patroni.configuration(cluster, labels=meta.selector_labels(cluster))
    return PatroniConfig(text=patroni.dump(document), hash=_hash(document))


def render(cluster: v1alpha1.PostgresCluster) -> str:
    """``patroni.yaml``, with Patroni listing its members by the instance selector labels."""
    return patroni_config(cluster).text


def config_map(cluster: v1alpha1.PostgresCluster, *, patroni_yaml: str) -> meta.Object:
    """``patroni_yaml`` is :attr:`PatroniConfig.text` of :func:`patroni_config`."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        # No component label: Patroni lists ConfigMaps by the instance selector labels and
        # must not see (or ever delete) this one.
        "metadata": meta.object_meta(cluster, cluster.patroni_config_map_name),
        "data": {patroni.CONFIG_FILE_NAME: patroni_yaml},
    }


def config_hash(cluster: v1alpha1.PostgresCluster) -> str:
    """:attr:`PatroniConfig.hash` of :func:`patroni_config`."""
    return patroni_config(cluster).hash


def _hash(document: Mapping[str, Any]) -> str:
    """Short sha256 of the configuration a running instance reads, for the pod template
    annotation: a change rolls the pods. ``bootstrap.dcs`` (the PostgreSQL parameters among
    it) is left out: Patroni reads it only to initialize a new cluster, and the operator
    applies later changes through Patroni's ``PATCH /config`` without restarting anything."""
    bootstrap = {k: v for k, v in document["bootstrap"].items() if k != "dcs"}
    canonical = json.dumps(
        {**document, "bootstrap": bootstrap}, sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(canonical.encode()).hexdigest()[:HASH_LENGTH]


def fencing_config_map(cluster: v1alpha1.PostgresCluster, instances: list[str]) -> meta.Object:
    """The fenced instances of ``cluster`` (a JSON list, ``["*"]`` for all), watched by each
    instance pod's supervisor: listed, its PostgreSQL stops and the pod stays."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        # No component label, like NAME-patroni: Patroni's selector must not list it.
        "metadata": meta.object_meta(cluster, cluster.fencing_config_map_name),
        "data": {"instances": json.dumps(sorted(instances))},
    }
