"""The PodDisruptionBudget of the instance pods."""

from __future__ import annotations

import pytest

from stateward.api.v1alpha1 import PostgresCluster
from stateward.specs import meta
from stateward.specs.postgres import pdb
from tests.support import clusters

pytestmark = pytest.mark.unit


def make_cluster(replicas: int = 3) -> PostgresCluster:
    return clusters.make_cluster(replicas=replicas)


@pytest.mark.parametrize("replicas", [1, 3])
def test_pod_disruption_budget(replicas: int) -> None:
    cluster = make_cluster(replicas)
    assert pdb.pod_disruption_budget(cluster) == {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {
            "name": "demo",
            "namespace": "db",
            "labels": meta.labels(cluster, component="instance"),
            "ownerReferences": [meta.owner_reference(cluster)],
        },
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": meta.selector_labels(cluster)},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }
