"""The local control plane is the real thing: admission, controllers, scheduling, kwok nodes."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

import pytest
from lab.waiting import wait_for
from lightkube import ApiError, Client
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.apps_v1 import StatefulSet
from lightkube.resources.batch_v1 import CronJob, Job
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import ConfigMap, Node, PersistentVolumeClaim, Pod

from stateward_local.cluster import LocalCluster

pytestmark = pytest.mark.integration


def test_version_reports_the_pinned_release(control_plane: LocalCluster) -> None:
    with control_plane.http_client() as http:
        version = http.get("/version").json()
    assert version["gitVersion"] == "v1.37.2"
    assert (version["major"], version["minor"]) == ("1", "37")


def test_nodes_are_ready_and_untainted(kube: Client) -> None:
    nodes = list(kube.list(Node))
    assert len(nodes) >= 3

    def settled() -> list[str]:
        """Nodes not yet Ready, or still tainted: the node lifecycle controller removes the
        not-ready taint a moment after Ready, later on a busy machine."""
        unsettled = []
        for node in kube.list(Node):
            conditions = {c.type: c.status for c in (node.status.conditions or [])}  # type: ignore[union-attr]
            if conditions.get("Ready") != "True" or (node.spec and node.spec.taints):
                unsettled.append(node.metadata.name)  # type: ignore[union-attr]
        return unsettled

    wait_for(lambda: not settled(), what="every node Ready and untainted", timeout=60)


WIDGETS = "widgets.test.stateward.io"


def _widget_crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": WIDGETS},
        "spec": {
            "group": "test.stateward.io",
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "properties": {
                                        "size": {"type": "integer", "minimum": 1},
                                        "min": {"type": "integer"},
                                        "max": {"type": "integer"},
                                    },
                                    "x-kubernetes-validations": [
                                        {"rule": "self.min <= self.max", "message": "min > max"}
                                    ],
                                }
                            },
                        }
                    },
                }
            ],
        },
    }


def test_crd_schema_and_cel_rules_refuse_bad_objects(kube: Client, namespace: str) -> None:
    kube.apply(CustomResourceDefinition.from_dict(_widget_crd()), force=True)
    wait_for(
        lambda: any(
            c.type == "Established" and c.status == "True"
            for c in (kube.get(CustomResourceDefinition, WIDGETS).status.conditions or [])  # type: ignore[union-attr]
        ),
        what="CRD established",
    )
    widget = create_namespaced_resource("test.stateward.io", "v1", "Widget", "widgets")

    def make(spec: dict[str, int]) -> None:
        name = f"w-{uuid.uuid4().hex[:6]}"
        kube.create(widget(metadata=ObjectMeta(name=name, namespace=namespace), spec=spec))

    make({"size": 1, "min": 1, "max": 2})
    with pytest.raises(ApiError) as schema_refusal:
        make({"size": 0, "min": 1, "max": 2})
    assert schema_refusal.value.status.code == 422
    assert "spec.size" in str(schema_refusal.value.status.message)
    with pytest.raises(ApiError) as cel_refusal:
        make({"size": 1, "min": 3, "max": 2})
    assert cel_refusal.value.status.code == 422
    assert "min > max" in str(cel_refusal.value.status.message)


def _statefulset(name: str, namespace: str, replicas: int) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "serviceName": name,
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "main", "image": "example.invalid/app:1"}]},
            },
            "volumeClaimTemplates": [
                {
                    "metadata": {"name": "data"},
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": "1Gi"}},
                    },
                }
            ],
        },
    }


def test_statefulset_pods_are_created_scheduled_and_ready(kube: Client, namespace: str) -> None:
    kube.create(StatefulSet.from_dict(_statefulset("db", namespace, 3)))
    wait_for(
        lambda: (kube.get(StatefulSet, "db", namespace=namespace).status.readyReplicas or 0) == 3,  # type: ignore[union-attr]
        what="3 ready replicas",
        timeout=90,
    )
    pods = list(kube.list(Pod, namespace=namespace))
    assert sorted(p.metadata.name for p in pods) == ["db-0", "db-1", "db-2"]  # type: ignore[union-attr]
    assert all(p.spec.nodeName for p in pods)  # type: ignore[union-attr]
    assert all(p.status.podIP for p in pods)  # type: ignore[union-attr]
    claims = list(kube.list(PersistentVolumeClaim, namespace=namespace))
    assert sorted(c.status.phase for c in claims) == ["Bound"] * 3  # type: ignore[union-attr]


def test_garbage_collector_removes_owned_objects(kube: Client, namespace: str) -> None:
    owner = kube.create(ConfigMap(metadata=ObjectMeta(name="owner", namespace=namespace)))
    reference = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "owner",
        "uid": owner.metadata.uid,  # type: ignore[union-attr]
        "controller": True,
    }
    kube.create(
        ConfigMap.from_dict(
            {
                "metadata": {
                    "name": "owned",
                    "namespace": namespace,
                    "ownerReferences": [reference],
                }
            }
        )
    )
    kube.delete(ConfigMap, "owner", namespace=namespace)

    def gone() -> bool:
        try:
            kube.get(ConfigMap, "owned", namespace=namespace)
        except ApiError as error:
            return error.status.code == 404
        return False

    wait_for(gone, what="the owned ConfigMap to be collected")


def test_cronjob_runs_a_job_that_completes(kube: Client, namespace: str) -> None:
    kube.create(
        CronJob.from_dict(
            {
                "metadata": {"name": "tick", "namespace": namespace},
                "spec": {
                    "schedule": "* * * * *",
                    "jobTemplate": {
                        "spec": {
                            "template": {
                                "spec": {
                                    "restartPolicy": "Never",
                                    "containers": [
                                        {"name": "main", "image": "example.invalid/job:1"}
                                    ],
                                }
                            }
                        }
                    },
                },
            }
        )
    )

    def completed_job() -> Job | None:
        for job in kube.list(Job, namespace=namespace):
            if job.status and job.status.succeeded:
                return job
        return None

    job = wait_for(completed_job, what="a Job of the CronJob to succeed", timeout=150)
    assert job.metadata.ownerReferences[0].name == "tick"  # type: ignore[index, union-attr]
    wait_for(
        lambda: kube.get(CronJob, "tick", namespace=namespace).status.lastSuccessfulTime,  # type: ignore[union-attr]
        what="the CronJob to record the success",
    )


def test_lease_is_created_and_renewed(kube: Client, namespace: str) -> None:
    def renew(holder: str) -> datetime.datetime:
        now = datetime.datetime.now(datetime.UTC)
        lease = Lease.from_dict(
            {
                "metadata": {"name": "leader", "namespace": namespace},
                "spec": {
                    "holderIdentity": holder,
                    "leaseDurationSeconds": 15,
                    "renewTime": now.isoformat(timespec="microseconds").replace("+00:00", "Z"),
                },
            }
        )
        applied = kube.apply(lease, force=True)
        return applied.spec.renewTime  # type: ignore[union-attr, return-value]

    first = renew("a")
    second = wait_for(lambda: (t := renew("a")) > first and t, what="a later renewTime")
    assert kube.get(Lease, "leader", namespace=namespace).spec.renewTime == second  # type: ignore[union-attr]


def test_node_leases_are_renewed_by_kwok(kube: Client) -> None:
    def renew_times() -> dict[str, Any]:
        return {
            lease.metadata.name: lease.spec.renewTime  # type: ignore[union-attr]
            for lease in kube.list(Lease, namespace="kube-node-lease")
        }

    before = wait_for(renew_times, what="node leases")
    wait_for(
        lambda: any(renew_times()[name] != when for name, when in before.items()),
        what="a node lease to be renewed",
        timeout=90,
    )


def test_apiserver_only_cluster_serves_without_controllers(apiserver: LocalCluster) -> None:
    names = [process.name for process in apiserver.status()]
    assert names == ["etcd", "kube-apiserver"]
    with apiserver.http_client() as http:
        assert http.get("/readyz").text == "ok"
        assert http.get("/api/v1/nodes").json()["items"] == []
