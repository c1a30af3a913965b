"""The PodDisruptionBudget of the instance pods: voluntary evictions one at a time."""

from __future__ import annotations

from stateward.api import v1alpha1
from stateward.specs import meta


def pod_disruption_budget(cluster: v1alpha1.PostgresCluster) -> meta.Object:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": meta.object_meta(cluster, cluster.name, component=meta.INSTANCE_COMPONENT),
        "spec": {
            # 1 and not minAvailable: a single-instance cluster can still be drained.
            "maxUnavailable": 1,
            "selector": {"matchLabels": meta.selector_labels(cluster)},
            # A pod that is not ready serves nothing; evicting it must not block a drain.
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }
