"""The PostgresCluster operator against a real control plane: children, drift, day-2, deletion."""

from __future__ import annotations

import base64
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from lab.kwok import SIMULATED_FAILURE_SUFFIX
from lab.operator import get_pgc, metric
from lab.waiting import wait_for
from lightkube import ApiError, Client, codecs
from lightkube.models.core_v1 import ResourceRequirements
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import Deployment, StatefulSet
from lightkube.resources.authorization_v1 import SubjectAccessReview
from lightkube.resources.batch_v1 import CronJob, Job
from lightkube.resources.core_v1 import (
    ConfigMap,
    Event,
    Namespace,
    PersistentVolumeClaim,
    Pod,
    ResourceQuota,
    Secret,
    Service,
    ServiceAccount,
)
from lightkube.resources.networking_v1 import NetworkPolicy
from lightkube.resources.policy_v1 import PodDisruptionBudget
from lightkube.resources.rbac_authorization_v1 import Role, RoleBinding
from lightkube.types import PatchType

from stateward import pki
from stateward.specs import tls
from stateward_local.cluster import LocalCluster
from stateward_local.run import OperatorProcess, PostgresClusterResource
from tests.integration.conftest import (
    AuditLog,
    assert_no_writes_at_rest,
    condition,
    gone,
    pgc_body,
    wait_condition,
    wait_phase,
)
from tests.support import certificates, clusters

pytestmark = pytest.mark.integration

MakeCluster = Callable[..., str]

CHILDREN: list[tuple[Any, str]] = [
    (StatefulSet, "{}"),
    (Service, "{}-primary"),
    (Service, "{}-replicas"),
    (Service, "{}-headless"),
    (ConfigMap, "{}-patroni"),
    (Secret, "{}-superuser"),
    (Secret, "{}-replication"),
    (ServiceAccount, "{}-instance"),
    (Role, "{}-instance"),
    (RoleBinding, "{}-instance"),
    (PodDisruptionBudget, "{}"),
    (NetworkPolicy, "{}"),
    (CronJob, "{}-backup"),
    (ServiceAccount, "{}-backup"),
    (Role, "{}-backup"),
    (RoleBinding, "{}-backup"),
]


def patch_cluster(kube: Client, name: str, namespace: str, patch: dict[str, Any]) -> None:
    """A merge patch of a PostgresCluster, as `kubectl patch --type=merge` sends it."""
    kube.patch(
        PostgresClusterResource, name, patch, namespace=namespace, patch_type=PatchType.MERGE
    )


def events(kube: Client, namespace: str, name: str) -> list[str]:
    """The events of one object, oldest first (creation order is resourceVersion order)."""
    found = kube.list(Event, namespace=namespace, fields={"involvedObject.name": name})
    ordered = sorted(found, key=lambda e: int(e.metadata.resourceVersion))  # type: ignore[union-attr, arg-type]
    return [f"{e.reason}: {e.message}" for e in ordered]


def test_children_exist_owned_and_labelled_and_status_converges(
    kube: Client, namespace: str, make_cluster: MakeCluster
) -> None:
    name = make_cluster(backupSchedule="0 3 * * *", backup=clusters.BACKUP)
    ready = wait_phase(kube, name, namespace, "Ready", timeout=90)
    uid = ready["metadata"]["uid"]
    for resource, pattern in CHILDREN:
        child = kube.get(resource, pattern.format(name), namespace=namespace)
        owners = child.metadata.ownerReferences  # type: ignore[union-attr]
        assert owners and owners[0].uid == uid and owners[0].controller, pattern
        labels = child.metadata.labels or {}  # type: ignore[union-attr]
        assert labels["app.kubernetes.io/managed-by"] == "stateward"
        assert labels["stateward.io/cluster"] == name
        assert not any(k.startswith("kopf.") for k in child.metadata.annotations or {})  # type: ignore[union-attr]
    # The repository is the object store's: no volume of ours holds backups.
    assert gone(kube, PersistentVolumeClaim, f"{name}-backups", namespace)

    status = ready["status"]
    assert status["readyReplicas"] == 3
    assert status["primaryPod"] == f"{name}-0"
    assert status["replicaPods"] == [f"{name}-1", f"{name}-2"]
    assert status["observedGeneration"] == ready["metadata"]["generation"]
    assert condition(ready, "Ready")["status"] == "True"
    assert condition(ready, "BackupScheduled")["status"] == "True"
    assert ready["metadata"]["finalizers"] == ["stateward.io/finalizer"]
    assert any(
        e.startswith("Created: ") and f"StatefulSet {name}," in e
        for e in events(kube, namespace, name)
    )

    sts = kube.get(StatefulSet, name, namespace=namespace)
    assert sts.spec.updateStrategy.type == "OnDelete"  # type: ignore[union-attr]
    assert sts.spec.serviceName == f"{name}-headless"  # type: ignore[union-attr]
    # Services select by the role label Patroni keeps current.
    primary = kube.get(Service, f"{name}-primary", namespace=namespace)
    assert primary.spec.selector["stateward.io/role"] == "primary"  # type: ignore[index, union-attr]


def test_secrets_hold_generated_passwords_that_never_reach_status_events_or_logs(
    kube: Client, namespace: str, make_cluster: MakeCluster, operator: OperatorProcess
) -> None:
    name = make_cluster()
    wait_phase(kube, name, namespace, "Ready", timeout=90)
    passwords = []
    for suffix in ("superuser", "replication"):
        secret = kube.get(Secret, f"{name}-{suffix}", namespace=namespace)
        password = base64.b64decode(secret.data["password"]).decode()  # type: ignore[index]
        assert len(password) >= 32
        passwords.append(password)
    assert passwords[0] != passwords[1]
    visible = str(get_pgc(kube, name, namespace)) + " ".join(events(kube, namespace, name))
    visible += operator.log.read_text()
    assert not any(p in visible for p in passwords)


def _wait_restored(kube: Client, resource: Any, name: str, namespace: str, old_uid: str) -> Any:
    return wait_for(
        lambda: (
            (obj := kube.get(resource, name, namespace=namespace)).metadata.uid != old_uid  # type: ignore[union-attr]
            and obj
        ),
        what=f"{resource.__name__} {name} to be recreated",
        timeout=30,
    )


@pytest.mark.parametrize(
    ("resource", "suffix"),
    [(StatefulSet, ""), (Service, "-primary"), (CronJob, "-backup"), (ConfigMap, "-patroni")],
)
def test_deleted_child_is_recreated(
    kube: Client, namespace: str, make_cluster: MakeCluster, resource: Any, suffix: str
) -> None:
    name = make_cluster(backupSchedule="*/5 * * * *", backup=clusters.BACKUP)
    wait_phase(kube, name, namespace, "Ready", timeout=90)
    child = f"{name}{suffix}"
    old = kube.get(resource, child, namespace=namespace)
    kube.delete(resource, child, namespace=namespace)
    _wait_restored(kube, resource, child, namespace, old.metadata.uid)  # type: ignore[union-attr]


def test_hand_edits_are_repaired(kube: Client, namespace: str, make_cluster: MakeCluster) -> None:
    name = make_cluster(backupSchedule="0 3 * * *", backup=clusters.BACKUP)
    wait_phase(kube, name, namespace, "Ready", timeout=90)
    kube.patch(
        Service,
        f"{name}-primary",
        {"spec": {"selector": {"stateward.io/role": "replica"}}},
        namespace=namespace,
        patch_type=PatchType.MERGE,
    )
    kube.patch(
        CronJob,
        f"{name}-backup",
        {"spec": {"schedule": "1 1 1 1 1"}},
        namespace=namespace,
        patch_type=PatchType.MERGE,
    )
    kube.patch(
        ConfigMap,
        f"{name}-patroni",
        {"data": {"patroni.yaml": "tampered: true"}},
        namespace=namespace,
        patch_type=PatchType.MERGE,
    )
    wait_for(
        lambda: (
            kube.get(Service, f"{name}-primary", namespace=namespace).spec.selector[  # type: ignore[index, union-attr]
                "stateward.io/role"
            ]
            == "primary"
        ),
        what="the primary Service selector to be repaired",
        timeout=30,
    )
    wait_for(
        lambda: (
            kube.get(CronJob, f"{name}-backup", namespace=namespace).spec.schedule  # type: ignore[union-attr]
            == "0 3 * * *"
        ),
        what="the CronJob schedule to be repaired",
        timeout=30,
    )
    wait_for(
        lambda: (
            "tampered"
            not in kube.get(ConfigMap, f"{name}-patroni", namespace=namespace).data["patroni.yaml"]
        ),  # type: ignore[index]
        what="the ConfigMap to be repaired",
        timeout=30,
    )


def test_deleted_secret_with_existing_data_is_reported_not_regenerated(
    kube: Client, namespace: str, make_cluster: MakeCluster
) -> None:
    name = make_cluster()
    wait_phase(kube, name, namespace, "Ready", timeout=90)
    kube.delete(Secret, f"{name}-superuser", namespace=namespace)
    failing = wait_phase(kube, name, namespace, "Failing", timeout=30)
    degraded = condition(failing, "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "SecretMissing"
    assert gone(kube, Secret, f"{name}-superuser", namespace)
    assert any(e.startswith("SecretMissing") for e in events(kube, namespace, name))


def test_backup_schedule_set_changed_cleared(
    kube: Client, namespace: str, make_cluster: MakeCluster
) -> None:
    name = make_cluster(backup=clusters.BACKUP)
    wait_phase(kube, name, namespace, "Ready", timeout=90)
    assert gone(kube, CronJob, f"{name}-backup", namespace)
    assert condition(get_pgc(kube, name, namespace), "BackupScheduled")["status"] == "False"

    def schedule(value: str | None) -> None:
        patch_cluster(kube, name, namespace, {"spec": {"backupSchedule": value}})

    schedule("15 2 * * *")
    wait_for(
        lambda: (
            kube.get(CronJob, f"{name}-backup", namespace=namespace).spec.schedule  # type: ignore[union-attr]
            == "15 2 * * *"
        ),
        what="the CronJob to be created",
        timeout=30,
    )
    schedule("30 4 * * 1")
    wait_for(
        lambda: (
            kube.get(CronJob, f"{name}-backup", namespace=namespace).spec.schedule  # type: ignore[union-attr]
            == "30 4 * * 1"
        ),
        what="the CronJob to follow the new schedule",
        timeout=30,
    )
    schedule(None)
    wait_for(
        lambda: gone(kube, CronJob, f"{name}-backup", namespace),
        what="the CronJob to be deleted",
        timeout=30,
    )
    # Without backups, nothing may keep the right to exec in the instance pods.
    assert kube.get(Role, f"{name}-backup", namespace=namespace)
    patch_cluster(kube, name, namespace, {"spec": {"backup": None}})
    for resource in (Role, RoleBinding, ServiceAccount):
        wait_for(
            lambda resource=resource: gone(kube, resource, f"{name}-backup", namespace),
            what=f"the backup {resource.__name__} to be deleted",
            timeout=30,
        )


def test_a_pooler_is_made_reported_reconfigured_and_removed(
    kube: Client, namespace: str, make_cluster: MakeCluster
) -> None:
    name = make_cluster(pooler={"instances": 2, "defaultPoolSize": 10})
    ready = wait_phase(kube, name, namespace, "Ready", timeout=90)
    pooler = f"{name}-pooler"
    for resource in (ConfigMap, Service, NetworkPolicy, Deployment):
        child = kube.get(resource, pooler, namespace=namespace)
        owners = child.metadata.ownerReferences  # type: ignore[union-attr]
        assert owners and owners[0].uid == ready["metadata"]["uid"], resource.__name__
    wait_for(
        lambda: (
            get_pgc(kube, name, namespace)["status"].get("pooler")
            == {
                "host": f"{pooler}.{namespace}.svc",
                "instances": 2,
                "readyInstances": 2,
                "poolMode": "transaction",
            }
        ),
        what="status.pooler: two PgBouncer pods ready",
        timeout=60,
    )
    # The pooler's pods are no instances: the cluster still counts three.
    assert get_pgc(kube, name, namespace)["status"]["readyReplicas"] == 3

    def ini() -> str:
        return (kube.get(ConfigMap, pooler, namespace=namespace).data or {})["pgbouncer.ini"]

    assert "default_pool_size = 10" in ini()
    before = kube.get(Deployment, pooler, namespace=namespace).spec.template.metadata.annotations  # type: ignore[union-attr]
    patch_cluster(kube, name, namespace, {"spec": {"pooler": {"defaultPoolSize": 12}}})
    wait_for(lambda: "default_pool_size = 12" in ini(), what="the new pool size", timeout=30)
    wait_for(
        lambda: (
            kube.get(Deployment, pooler, namespace=namespace).spec.template.metadata.annotations  # type: ignore[union-attr]
            != before
        ),
        what="the pooler's pods to roll onto the new configuration",
        timeout=30,
    )

    patch_cluster(kube, name, namespace, {"spec": {"pooler": None}})
    for resource in (ConfigMap, Service, NetworkPolicy, Deployment):
        wait_for(
            lambda resource=resource: gone(kube, resource, pooler, namespace),
            what=f"the pooler's {resource.__name__} to be deleted",
            timeout=30,
        )
    wait_for(
        lambda: "pooler" not in get_pgc(kube, name, namespace)["status"],
        what="status.pooler to go",
        timeout=30,
    )
    assert any(e.startswith("PoolerRemoved: ") for e in events(kube, namespace, name))


def test_instances_get_a_node_each_and_share_nodes_only_when_placement_allows(
    kube: Client, namespace: str, make_cluster: MakeCluster
) -> None:
    name = make_cluster(replicas=2)
    wait_phase(kube, name, namespace, "Ready", timeout=90)
    # Four instances, three nodes: the required anti-affinity (the default) places three,
    # one per node, and the fourth waits, Degraded saying why and what to change.
    patch_cluster(kube, name, namespace, {"spec": {"replicas": 4}})
    failing = wait_for(
        lambda: (
            (obj := get_pgc(kube, name, namespace))["status"].get("readyReplicas") == 3
            and condition(obj, "Degraded").get("reason") == "NotEnoughNodes"
            and obj
        ),
        what="three instances placed and the fourth reported unplaceable",
        timeout=90,
    )
    message = condition(failing, "Degraded")["message"]
    assert message.startswith(f"{name}-3 cannot be placed"), message
    assert "spec.placement.antiAffinity: Preferred" in message
    placed = [
        p.spec.nodeName  # type: ignore[union-attr]
        for p in kube.list(Pod, namespace=namespace, labels={"stateward.io/cluster": name})
        if p.spec.nodeName  # type: ignore[union-attr]
    ]
    assert len(placed) == 3 and len(set(placed)) == 3, placed
    # Preferred lets them share: the unplaced instance is replaced at once (it never ran),
    # the others roll, and all four become ready.
    patch_cluster(kube, name, namespace, {"spec": {"placement": {"antiAffinity": "Preferred"}}})
    ready = wait_for(
        lambda: (
            (obj := get_pgc(kube, name, namespace))["status"].get("readyReplicas") == 4
            and obj["status"].get("phase") == "Ready"
            and obj
        ),
        what="4 ready instances",
        timeout=150,
    )
    assert ready["status"]["replicaPods"] == [f"{name}-1", f"{name}-2", f"{name}-3"]
    patch_cluster(kube, name, namespace, {"spec": {"replicas": 1}})
    wait_for(
        lambda: (
            [
                p.metadata.name
                for p in kube.list(
                    Pod,
                    namespace=namespace,  # type: ignore[union-attr]
                    labels={"app.kubernetes.io/component": "instance"},
                )
            ]
            == [f"{name}-0"]
        ),
        what="scale down to the primary alone",
        timeout=90,
    )


def test_storage_grows_without_restarting_pods(
    kube: Client, namespace: str, make_cluster: MakeCluster
) -> None:
    name = make_cluster()
    wait_phase(kube, name, namespace, "Ready", timeout=90)
    pods_before = {
        p.metadata.name: p.metadata.uid  # type: ignore[union-attr]
        for p in kube.list(Pod, namespace=namespace, labels={"stateward.io/cluster": name})
    }
    patch_cluster(kube, name, namespace, {"spec": {"storageSize": "2Gi"}})

    def claims_grown() -> bool:
        claims = [
            c
            for c in kube.list(PersistentVolumeClaim, namespace=namespace)
            if c.metadata.name.startswith(f"pgdata-{name}-")  # type: ignore[union-attr]
        ]
        return len(claims) == 3 and all(
            c.spec.resources.requests["storage"] == "2Gi"  # type: ignore[index, union-attr]
            and c.status.capacity["storage"] == "2Gi"  # type: ignore[index, union-attr]
            for c in claims
        )

    wait_for(claims_grown, what="every data PVC to grow to 2Gi", timeout=60)
    wait_for(
        lambda: (
            kube.get(StatefulSet, name, namespace=namespace)
            .spec.volumeClaimTemplates[0]  # type: ignore[index, union-attr]
            .spec.resources.requests["storage"]  # type: ignore[index, union-attr]
            == "2Gi"
        ),
        what="the StatefulSet template to be refreshed",
        timeout=60,
    )
    wait_phase(kube, name, namespace, "Ready", timeout=60)
    pods_after = {
        p.metadata.name: p.metadata.uid  # type: ignore[union-attr]
        for p in kube.list(Pod, namespace=namespace, labels={"stateward.io/cluster": name})
    }
    assert pods_after == pods_before
    with pytest.raises(ApiError) as refused:
        patch_cluster(kube, name, namespace, {"spec": {"storageSize": "1Gi"}})
    assert "storageSize" in str(refused.value.status.message)


def test_version_change_rolls_replicas_first_primary_last(
    kube: Client, namespace: str, make_cluster: MakeCluster
) -> None:
    name = make_cluster(version="16")
    wait_phase(kube, name, namespace, "Ready", timeout=90)
    wait_for(
        lambda: get_pgc(kube, name, namespace)["status"].get("version") == "16",
        what="status.version to record the data's version",
    )
    # Below the data's major: refused by the API server (the CRD's rule on status.version).
    with pytest.raises(ApiError) as downgrade:
        patch_cluster(kube, name, namespace, {"spec": {"version": "15"}})
    assert "older than the data files, which are PostgreSQL 16" in str(
        downgrade.value.status.message
    )
    # A major the default image cannot upgrade from in place: refused by the operator, the
    # cluster left running on 16 (no pod is stopped, no image changes).
    pods_before = {
        p.metadata.name: p.metadata.uid  # type: ignore[union-attr]
        for p in kube.list(Pod, namespace=namespace, labels={"stateward.io/cluster": name})
    }
    patch_cluster(kube, name, namespace, {"spec": {"version": "17"}})
    refused = wait_condition(kube, name, namespace, "Degraded", reason="UpgradeRefused")
    assert (
        "PostgreSQL 16 cannot be upgraded to 17 in place"
        in condition(refused, "Degraded")["message"]
    )
    template = kube.get(StatefulSet, name, namespace=namespace).spec.template  # type: ignore[union-attr]
    assert template.spec.containers[0].image.endswith(":16")  # type: ignore[union-attr]
    assert {
        p.metadata.name: p.metadata.uid  # type: ignore[union-attr]
        for p in kube.list(Pod, namespace=namespace, labels={"stateward.io/cluster": name})
    } == pods_before
    # Back to the data's major, with a minor update: allowed, and rolled.
    patch_cluster(kube, name, namespace, {"spec": {"version": "16.4"}})

    def all_updated() -> bool:
        pods = list(
            kube.list(Pod, namespace=namespace, labels={"app.kubernetes.io/component": "instance"})
        )
        return len(pods) == 3 and all(
            p.spec.containers[0].image.endswith(":16.4") and not p.metadata.deletionTimestamp  # type: ignore[union-attr]
            for p in pods
        )

    wait_for(all_updated, what="every pod to run version 16.4", timeout=120)
    wait_phase(kube, name, namespace, "Ready", timeout=60)
    restarts = [
        e.split("Restarting ")[1].split(" ")[0]
        for e in events(kube, namespace, name)
        if e.startswith("RollingUpdate:")
    ]
    assert sorted(restarts) == sorted({f"{name}-0", f"{name}-1", f"{name}-2"})
    assert restarts[-1] == f"{name}-0", restarts  # the primary goes last


def test_unknown_storage_class_is_a_condition_not_a_hot_loop(
    kube: Client,
    namespace: str,
    make_cluster: MakeCluster,
    audit: AuditLog,
    operator: OperatorProcess,
) -> None:
    name = make_cluster(storageClassName="does-not-exist")
    failing = wait_phase(kube, name, namespace, "Failing", timeout=30)
    assert condition(failing, "Degraded")["reason"] == "StorageClassNotFound"
    assert "spec.storageClassName" in condition(failing, "Degraded")["message"]
    assert gone(kube, StatefulSet, name, namespace)
    writes = len(audit.writes(namespace=namespace))
    # A label change makes the operator look again, and resyncs keep coming; neither may
    # write anything new. Wait until reconciles have demonstrably happened since.
    reconciles = metric(operator.probe_port, "stateward_reconcile_total")
    patch_cluster(kube, name, namespace, {"metadata": {"labels": {"touched": "yes"}}})
    wait_for(
        lambda: metric(operator.probe_port, "stateward_reconcile_total") >= reconciles + 2,
        what="the operator to look at the cluster again",
        timeout=30,
    )
    assert len(audit.writes(namespace=namespace)) == writes


def test_converged_cluster_makes_zero_writes(
    kube: Client,
    namespace: str,
    make_cluster: MakeCluster,
    audit: AuditLog,
    operator: OperatorProcess,
) -> None:
    # Quantities in a non-canonical spelling: the API server stores "1Gi" and "1", which
    # must not look like drift to be repaired on every resync.
    name = make_cluster(
        backupSchedule="0 3 * * *",
        backup=clusters.BACKUP,
        storageSize="1024Mi",
        resources={"requests": {"cpu": "1000m", "memory": "1024Mi"}},
        pooler={"instances": 1},
    )
    wait_phase(kube, name, namespace, "Ready", timeout=90)
    wait_for(
        lambda: (
            (get_pgc(kube, name, namespace)["status"].get("pooler") or {}).get("readyInstances")
            == 1
        ),
        what="the pooler's pod ready",
        timeout=60,
    )
    sts = kube.get(StatefulSet, name, namespace=namespace)
    template = sts.spec.volumeClaimTemplates[0]  # type: ignore[index, union-attr]
    assert template.spec.resources.requests["storage"] == "1Gi"  # type: ignore[index, union-attr]
    assert_no_writes_at_rest(audit, operator, namespace)


def test_cleared_limits_are_removed_from_the_statefulset_then_nothing_is_written(
    kube: Client,
    namespace: str,
    make_cluster: MakeCluster,
    audit: AuditLog,
    operator: OperatorProcess,
) -> None:
    requests = {"cpu": "250m", "memory": "256Mi"}
    name = make_cluster(resources={"requests": requests, "limits": {"cpu": "1", "memory": "1Gi"}})

    def resources() -> Any:
        sts = kube.get(StatefulSet, name, namespace=namespace)
        return sts.spec.template.spec.containers[0].resources  # type: ignore[union-attr]

    wait_for(
        lambda: resources().limits == {"cpu": "1", "memory": "1Gi"},
        what="the StatefulSet to carry the limits",
        timeout=60,
    )
    wait_phase(kube, name, namespace, "Ready", timeout=90)
    # The old StatefulSet contains everything the new spec asks for: only the applied hash
    # says that the limits are no longer ours to set.
    patch_cluster(kube, name, namespace, {"spec": {"resources": {"limits": None}}})
    assert "limits" not in get_pgc(kube, name, namespace)["spec"]["resources"]
    wait_for(
        lambda: not resources().limits,
        what="the limits to be removed from the StatefulSet",
        timeout=60,
    )
    assert resources().requests == requests
    wait_for(
        lambda: any(
            e.startswith("Updated: ") and f"StatefulSet {name} (fields no longer desired)" in e
            for e in events(kube, namespace, name)
        ),
        what="the Updated Event to say why the StatefulSet was applied",
    )

    # The new pod template rolls the pods; once they all run it, the cluster is at rest.
    def rolled() -> bool:
        pods = list(
            kube.list(Pod, namespace=namespace, labels={"app.kubernetes.io/component": "instance"})
        )
        return len(pods) == 3 and all(
            not (p.spec.containers[0].resources or ResourceRequirements()).limits  # type: ignore[union-attr]
            and not p.metadata.deletionTimestamp  # type: ignore[union-attr]
            for p in pods
        )

    wait_for(rolled, what="every pod to run without limits", timeout=120)
    wait_for(
        lambda: (
            (obj := get_pgc(kube, name, namespace))["status"].get("phase") == "Ready"
            and obj["status"].get("observedGeneration") == obj["metadata"]["generation"]
        ),
        what="the status to describe the new generation, Ready",
        timeout=60,
    )
    assert_no_writes_at_rest(audit, operator, namespace)


def test_delete_without_a_repository_removes_volumes_and_patronis_state(
    kube: Client, namespace: str, make_cluster: MakeCluster
) -> None:
    name = make_cluster()
    wait_phase(kube, name, namespace, "Ready", timeout=90)
    # What Patroni leaves in its namespace: ConfigMaps with its labels and no owner.
    leader_lock = ConfigMap.from_dict(
        {
            "metadata": {
                "name": f"{name}-leader",
                "namespace": namespace,
                "labels": {"stateward.io/cluster": name, "app.kubernetes.io/name": "postgresql"},
                "annotations": {"leader": f"{name}-0"},
            }
        }
    )
    kube.create(leader_lock)
    # A user's own ConfigMap that happens to carry the cluster label is not Patroni's.
    users = ConfigMap.from_dict(
        {
            "metadata": {
                "name": f"{name}-app-settings",
                "namespace": namespace,
                "labels": {"stateward.io/cluster": name},
            },
            "data": {"keep": "me"},
        }
    )
    kube.create(users)
    kube.delete(PostgresClusterResource, name, namespace=namespace)
    wait_for(
        lambda: gone(kube, PostgresClusterResource, name, namespace),
        what="the cluster to be deleted",
        timeout=90,
    )
    assert gone(kube, ConfigMap, f"{name}-leader", namespace)
    kept = kube.get(ConfigMap, f"{name}-app-settings", namespace=namespace)
    assert kept.data == {"keep": "me"}
    # No repository, so no final backup (finalBackup defaults to "when there is one").
    reasons = [e.split(":")[0] for e in events(kube, namespace, name)]
    assert "FinalBackupStarted" not in reasons
    assert gone(kube, Job, f"{name}-final-backup", namespace)
    wait_for(
        lambda: (
            not [
                c
                for c in kube.list(PersistentVolumeClaim, namespace=namespace)
                if c.metadata.name.startswith(f"pgdata-{name}")  # type: ignore[union-attr]
            ]
        ),
        what="the data volumes to be deleted",
        timeout=60,
    )


def test_a_final_backup_that_reports_no_backup_keeps_the_cluster_until_skipped(
    kube: Client, namespace: str, make_cluster: MakeCluster
) -> None:
    # Simulated nodes complete every pod without running it: the final backup Job "succeeds"
    # with no pgBackRest report. That is no backup, and the volumes must stay.
    name = make_cluster(backup=clusters.BACKUP)
    wait_phase(kube, name, namespace, "Ready", timeout=90)
    kube.delete(PostgresClusterResource, name, namespace=namespace)
    failed = wait_condition(kube, name, namespace, "FinalBackup", reason="Failed", timeout=90)
    message = condition(failed, "FinalBackup")["message"]
    assert "pgBackRest reported no backup" in message
    assert "finalBackup=false" in message
    assert failed["metadata"]["deletionTimestamp"]
    assert failed["status"]["phase"] == "Deleting"
    # The attempt count, which drives the backoff, is a status field, not prose to parse.
    assert failed["status"]["finalBackupAttempts"] >= 1
    assert "lastBackupTime" not in failed["status"]
    assert any(e.startswith("FinalBackupFailed") for e in events(kube, namespace, name))
    claims = [
        c
        for c in kube.list(PersistentVolumeClaim, namespace=namespace)
        if c.metadata.name.startswith(f"pgdata-{name}")  # type: ignore[union-attr]
    ]
    assert len(claims) == 3 and not any(c.metadata.deletionTimestamp for c in claims)  # type: ignore[union-attr]
    # The override the message names lets the deletion finish.
    patch_cluster(kube, name, namespace, {"spec": {"deletionPolicy": {"finalBackup": False}}})
    wait_for(
        lambda: gone(kube, PostgresClusterResource, name, namespace),
        what="the cluster to go once the final backup is skipped",
        timeout=120,
    )


def test_failing_final_backup_pods_keep_the_cluster_and_retry(
    kube: Client, namespace: str, make_cluster: MakeCluster
) -> None:
    name = make_cluster(
        image=f"example.invalid/postgres{SIMULATED_FAILURE_SUFFIX}",
        backup=clusters.BACKUP,
        deletionPolicy={"persistentVolumeClaims": "Retain"},
    )
    wait_for(
        lambda: get_pgc(kube, name, namespace).get("status", {}).get("readyReplicas") == 3,
        what="3 ready instances",
        timeout=90,
    )
    kube.delete(PostgresClusterResource, name, namespace=namespace)
    failed = wait_condition(kube, name, namespace, "FinalBackup", reason="Failed", timeout=90)
    assert "attempt 1 failed" in condition(failed, "FinalBackup")["message"]
    # It retries with backoff: a second attempt starts by itself.
    wait_for(
        lambda: (
            (get_pgc(kube, name, namespace).get("status") or {}).get("finalBackupAttempts", 0) >= 2
        ),
        what="a second final backup attempt",
        timeout=120,
    )
    patch_cluster(kube, name, namespace, {"spec": {"deletionPolicy": {"finalBackup": False}}})
    wait_for(
        lambda: gone(kube, PostgresClusterResource, name, namespace),
        what="the cluster to go once the final backup is skipped",
        timeout=120,
    )
    retained = [
        c
        for c in kube.list(PersistentVolumeClaim, namespace=namespace)
        if c.metadata.name.startswith(f"pgdata-{name}")  # type: ignore[union-attr]
    ]
    assert len(retained) == 3 and not any(c.metadata.deletionTimestamp for c in retained)  # type: ignore[union-attr]


def test_a_failing_reconcile_is_reported_in_status_and_events_and_cleared_on_success(
    kube: Client, namespace: str, make_cluster: MakeCluster
) -> None:
    # A quota that forbids Services: the API server refuses the cluster's Services.
    kube.create(
        ResourceQuota.from_dict(
            {"metadata": {"name": "no-services"}, "spec": {"hard": {"services": "0"}}}
        ),
        namespace=namespace,
    )
    wait_for(
        lambda: (
            (q := kube.get(ResourceQuota, "no-services", namespace=namespace)).status
            and q.status.hard
        ),
        what="the quota controller to account the quota",
    )
    name = make_cluster()
    failing = wait_condition(kube, name, namespace, "Degraded", reason="ReconcileFailed")
    message = condition(failing, "Degraded")["message"]
    assert "exceeded quota" in message and "no-services" in message
    assert failing["status"]["phase"] == "Failing"
    # The Warning Event follows the status write.
    warnings = wait_for(
        lambda: [e for e in events(kube, namespace, name) if e.startswith("ReconcileFailed:")],
        what="the ReconcileFailed Event",
    )
    assert "exceeded quota" in warnings[0]
    # The cause goes away: the next reconcile succeeds and clears the condition.
    kube.delete(ResourceQuota, "no-services", namespace=namespace)
    cleared = wait_condition(kube, name, namespace, "Degraded", status="False", timeout=120)
    assert cleared["status"]["phase"] != "Failing"
    assert kube.get(Service, f"{name}-primary", namespace=namespace)


def test_invalid_specs_are_refused_with_the_field_named(
    kube: Client, namespace: str, operator: OperatorProcess
) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"replicas": 0}, "spec.replicas"),
        ({"replicas": 1000}, "spec.replicas"),
        ({"storageSize": "lots"}, "storageSize"),
        ({"backupSchedule": "61 * * * *"}, "backupSchedule"),
        ({"backupSchedule": "* * *"}, "backupSchedule"),
        ({"backupSchedule": "@every 5m"}, "backupSchedule"),
        ({"version": "9.6"}, "version"),
        ({"postgresql": {"parameters": {"port": "5433"}}}, "parameters"),
        ({"synchronous": {"mode": "Always"}}, "spec.synchronous.mode"),
        ({"synchronous": {"number": 0}}, "spec.synchronous.number"),
        ({"replicas": 2, "synchronous": {"mode": "Required", "number": 2}}, "Required needs"),
        ({"bootstrap": {"owner": "postgres"}}, "spec.bootstrap.owner"),
        ({"bootstrap": {"database": "template1"}}, "spec.bootstrap.database"),
        ({"bootstrap": {"database": "My-App"}}, "spec.bootstrap.database"),
        ({"backupSchedule": "0 3 * * *"}, "spec.backupSchedule needs a repository"),
        ({"deletionPolicy": {"finalBackup": True}}, "spec.deletionPolicy.finalBackup needs"),
        ({"backup": {"repository": {"s3": {"bucket": "bkp"}}}}, "spec.backup.repository.s3."),
        (
            {"backup": {"repository": {"s3": {**clusters.REPOSITORY["s3"], "bucket": "A_B"}}}},
            "spec.backup.repository.s3.bucket",
        ),
    ]
    for index, (spec, field) in enumerate(cases):
        with pytest.raises(ApiError) as refused:
            kube.create(codecs.from_dict(pgc_body(f"bad-{index}", namespace, **spec)))
        assert field in str(refused.value.status.message), (spec, refused.value.status.message)


def test_missing_backup_credentials_are_a_condition_naming_the_field(
    kube: Client, namespace: str, make_cluster: MakeCluster
) -> None:
    repository = {"s3": {**clusters.REPOSITORY["s3"], "credentialsSecret": "not-yet"}}
    name = make_cluster(backup={"repository": repository})
    failing = wait_condition(
        kube, name, namespace, "Degraded", reason="BackupCredentialsMissing", timeout=60
    )
    message = condition(failing, "Degraded")["message"]
    assert "spec.backup.repository.s3.credentialsSecret" in message and "not-yet" in message
    assert "accessKeyId" in message and "secretAccessKey" in message
    # PostgreSQL is not held back: the keys are optional in the pods.
    assert kube.get(StatefulSet, name, namespace=namespace)
    kube.create(
        Secret.from_dict(
            {
                "metadata": {"name": "not-yet"},
                "stringData": {"accessKeyId": "AK", "secretAccessKey": "SK"},
            }
        ),
        namespace=namespace,
    )
    wait_condition(kube, name, namespace, "Degraded", status="False", timeout=90)


def test_never_firing_schedule_is_refused_by_the_webhook(
    kube: Client, namespace: str, operator: OperatorProcess
) -> None:
    with pytest.raises(ApiError) as refused:
        kube.create(
            codecs.from_dict(
                pgc_body("feb30", namespace, backupSchedule="0 0 30 2 *", backup=clusters.BACKUP)
            )
        )
    message = str(refused.value.status.message)
    assert "backupSchedule" in message and "admission webhook" in message


def test_another_namespaces_repository_path_is_refused_naming_the_field(
    kube: Client, namespace: str, operator: OperatorProcess
) -> None:
    backup = {"repository": {"s3": {**clusters.BACKUP["repository"]["s3"], "path": "/prod/db"}}}
    with pytest.raises(ApiError) as refused:
        kube.create(codecs.from_dict(pgc_body("thief", namespace, backup=backup)))
    message = str(refused.value.status.message)
    assert "spec.backup.repository.s3.path: /prod/db is outside" in message, message
    assert f"/{namespace}/" in message
    backup["repository"]["s3"]["path"] = f"/{namespace}/db"
    kube.create(codecs.from_dict(pgc_body("owner", namespace, backup=backup)))


def test_immutable_storage_class_and_unknown_fields(
    kube: Client, namespace: str, make_cluster: MakeCluster
) -> None:
    name = make_cluster()
    with pytest.raises(ApiError) as refused:
        patch_cluster(kube, name, namespace, {"spec": {"storageClassName": "other"}})
    assert "storageClassName" in str(refused.value.status.message)
    with pytest.raises(ApiError) as refused:
        patch_cluster(kube, name, namespace, {"spec": {"bootstrap": {"database": "other"}}})
    assert "spec.bootstrap is immutable" in str(refused.value.status.message)
    # Required with enough standbys is fine, and scaling below what it needs is refused.
    patch_cluster(kube, name, namespace, {"spec": {"synchronous": {"mode": "Required"}}})
    with pytest.raises(ApiError) as refused:
        patch_cluster(kube, name, namespace, {"spec": {"replicas": 1}})
    assert "Required needs spec.replicas" in str(refused.value.status.message)


def test_a_switchover_request_that_cannot_be_served_is_answered_and_consumed(
    kube: Client, namespace: str, make_cluster: MakeCluster
) -> None:
    # On simulated nodes no replica streams (no Patroni runs), so no switchover can happen:
    # the request is refused in status and an Event, and its annotation removed.
    name = make_cluster()
    wait_phase(kube, name, namespace, "Ready", timeout=120)
    for target, words in ((f"{name}-7", "names no instance"), ("any", "no ready, streaming")):
        kube.patch(
            PostgresClusterResource,
            name,
            {"metadata": {"annotations": {"stateward.io/switchover": target}}},
            namespace=namespace,
            patch_type=PatchType.MERGE,
        )
        record = wait_for(
            lambda target=target: (
                (obj := get_pgc(kube, name, namespace))
                and "stateward.io/switchover" not in (obj["metadata"].get("annotations") or {})
                and (obj.get("status") or {}).get("switchover", {}).get("target") == target
                and obj["status"]["switchover"]
            ),
            what=f"the switchover request for {target} to be answered",
        )
        assert record["phase"] == "Failed" and words in record["message"], record
        assert record["fromPod"] == f"{name}-0"
    assert any(e.startswith("SwitchoverFailed") for e in events(kube, namespace, name))
    assert get_pgc(kube, name, namespace)["status"]["primaryPod"] == f"{name}-0"


def test_unknown_fields_are_refused_by_kubectl(
    control_plane: LocalCluster, namespace: str, crds: None, tmp_path: Path
) -> None:
    manifest = tmp_path / "typo.yaml"
    manifest.write_text(yaml.safe_dump(pgc_body("typo", namespace, replcas=3)))
    result = subprocess.run(
        ["kubectl", f"--kubeconfig={control_plane.kubeconfig}", "apply", "-f", str(manifest)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert 'unknown field "spec.replcas"' in result.stderr


def _may(kube: Client, namespace: str, account: str, verb: str, resource: str, name: str) -> bool:
    """Whether the API server's authorizer lets ServiceAccount ``account`` do it."""
    resource, _, subresource = resource.partition("/")
    review = kube.create(
        SubjectAccessReview.from_dict(
            {
                "spec": {
                    "user": f"system:serviceaccount:{namespace}:{account}",
                    "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"],
                    "resourceAttributes": {
                        "namespace": namespace,
                        "verb": verb,
                        "resource": resource,
                        "subresource": subresource,
                        "name": name,
                    },
                }
            }
        )
    )
    return bool(review.status and review.status.allowed)


def test_instances_and_backup_jobs_may_touch_only_their_own_clusters_objects(
    kube: Client, namespace: str, make_cluster: MakeCluster
) -> None:
    # Two clusters in one namespace: an attacker in one's pods, or in its backup Job, goes
    # for the other's pods (its Service traffic, a shell) and leader lock.
    mine = make_cluster(backup=clusters.BACKUP)
    theirs = make_cluster()
    wait_for(
        lambda: (
            _may(kube, namespace, f"{mine}-backup", "create", "pods/exec", f"{mine}-0")
            and _may(kube, namespace, f"{mine}-instance", "patch", "pods", f"{mine}-0")
        ),
        what="the cluster's Roles to be bound",
    )
    instance, backup = f"{mine}-instance", f"{mine}-backup"
    assert _may(kube, namespace, instance, "update", "configmaps", f"{mine}-leader")
    assert _may(kube, namespace, instance, "create", "configmaps", "")
    assert _may(kube, namespace, backup, "create", "pods/exec", f"{mine}-15")
    for verb, resource, name in (
        ("patch", "pods", f"{theirs}-0"),
        ("update", "configmaps", f"{theirs}-leader"),
        ("delete", "configmaps", f"{theirs}-failover"),
        ("patch", "configmaps", "someone-elses-config"),
        ("patch", "pods", "application-pod"),
        ("get", "secrets", f"{theirs}-superuser"),
    ):
        assert not _may(kube, namespace, instance, verb, resource, name), (verb, resource, name)
    for name in (f"{theirs}-0", "application-pod", f"{mine}-16"):
        assert not _may(kube, namespace, backup, "create", "pods/exec", name), name


def test_deleting_the_namespace_of_a_cluster_completes(
    kube: Client, operator: OperatorProcess
) -> None:
    # The namespace refuses new Events while it terminates; the finalizer's Event must not
    # keep the finalizer (and so the namespace) forever.
    ns = f"t-{uuid.uuid4().hex[:10]}"
    kube.create(Namespace(metadata=ObjectMeta(name=ns, labels={"stateward.io/test": "true"})))
    # With a repository, so the finalizer wants a final backup it cannot start, and says so.
    kube.create(
        Secret.from_dict(
            {
                "metadata": {"name": clusters.REPOSITORY["s3"]["credentialsSecret"]},
                "stringData": {"accessKeyId": "AK", "secretAccessKey": "SK"},
            }
        ),
        namespace=ns,
    )
    kube.create(codecs.from_dict(pgc_body("doomed", ns, replicas=1, backup=clusters.BACKUP)))
    wait_phase(kube, "doomed", ns, "Ready", timeout=90)
    kube.delete(Namespace, ns)

    def namespace_gone() -> bool:
        try:
            kube.get(Namespace, ns)
        except ApiError as error:
            return error.status.code == 404
        return False

    wait_for(namespace_gone, what=f"namespace {ns} to be gone", timeout=120)
    # A namespace going away is the normal end of what is in it: no ERROR line in the
    # operator's log (there were 10 to 25 of them, with tracebacks, for each such namespace).
    errors = [
        line for line in operator.log.read_text().splitlines()
        if ns in line and '"level": "ERROR"' in line
    ]  # fmt: skip
    assert errors == [], errors[:3]


def test_each_cluster_gets_its_own_ca_and_a_serving_certificate_for_its_names(
    kube: Client, namespace: str, make_cluster: MakeCluster, operator: OperatorProcess
) -> None:
    name = make_cluster()
    wait_phase(kube, name, namespace, "Ready", timeout=90)

    def data(secret: str) -> dict[str, bytes]:
        found = kube.get(Secret, secret, namespace=namespace).data or {}
        return {key: base64.b64decode(value) for key, value in found.items()}

    ca, served, app = data(f"{name}-ca"), data(f"{name}-tls"), data(f"{name}-app")
    authority = x509.load_pem_x509_certificate(ca["ca.crt"])
    certificate = x509.load_pem_x509_certificate(served["tls.crt"])
    certificate.verify_directly_issued_by(authority)
    assert pki.key_matches(served["tls.crt"], served["tls.key"])
    assert served["ca.crt"] == app["ca.crt"] == ca["ca.crt"]
    assert f"{name}-primary.{namespace}.svc" in pki.subject_alt_names(served["tls.crt"])
    # The instances mount the certificate; only the operator reads the CA's key.
    sts = kube.get(StatefulSet, name, namespace=namespace)
    volumes = sts.spec.template.spec.volumes or []  # type: ignore[union-attr]
    assert [v.secret.secretName for v in volumes if v.secret] == [f"{name}-tls"]
    # No private key reaches status, Events or the operator's log.
    visible = str(get_pgc(kube, name, namespace)) + " ".join(events(kube, namespace, name))
    visible += operator.log.read_text()
    for key in (ca["ca.key"], served["tls.key"]):
        body = b"".join(key.splitlines()[1:-1]).decode()
        assert body[:40] not in visible

    # A deleted serving certificate is issued again by the same CA, and said so.
    kube.delete(Secret, f"{name}-tls", namespace=namespace)

    def reissued() -> dict[str, bytes] | None:
        try:
            again = data(f"{name}-tls")
        except ApiError:
            return None
        return again if again.get("tls.crt") not in (None, served["tls.crt"]) else None

    again = wait_for(reissued, what="the serving certificate to be issued again", timeout=30)
    x509.load_pem_x509_certificate(again["tls.crt"]).verify_directly_issued_by(authority)
    wait_for(
        lambda: any("CertificateIssued" in e for e in events(kube, namespace, name)),
        what="the CertificateIssued Event",
    )


def test_a_users_ca_signs_the_certificates_and_its_renewal_and_removal_are_followed(
    kube: Client, namespace: str, make_cluster: MakeCluster, operator: OperatorProcess
) -> None:
    """spec.tls.caSecretName, with the Secret cert-manager writes for a CA Certificate (an
    RSA intermediate under a root): the servers' certificates chain to it, clients trust the
    intermediate and the root; a renewed CA is followed within the resync interval; unset,
    the cluster gets a CA of its own again."""

    def put_ca() -> dict[str, bytes]:
        secret, _ = certificates.cert_manager_ca()
        body = certificates.tls_secret("corp-ca", secret)
        kube.apply(Secret.from_dict(body), namespace=namespace, field_manager="cert-manager")
        return secret

    def data(secret: str) -> dict[str, bytes]:
        found = kube.get(Secret, secret, namespace=namespace).data or {}
        return {key: base64.b64decode(value) for key, value in found.items()}

    def chained_to(signer: bytes) -> dict[str, bytes] | None:
        """NAME-tls and NAME-app once they chain to ``signer``."""
        try:
            served, app = data(f"{name}-tls"), data(f"{name}-app")
        except ApiError:
            return None
        if pki.fingerprint(served.get("ca.crt", b"")) != pki.fingerprint(signer):
            return None
        return served if app.get("ca.crt") == served["ca.crt"] else None

    # Named before it exists: the cluster waits, saying which Secret to create.
    name = make_cluster(tls={"caSecretName": "corp-ca"})
    missing = wait_condition(kube, name, namespace, "Degraded", "CertificateAuthorityMissing")
    assert "spec.tls.caSecretName names Secret corp-ca" in condition(missing, "Degraded")["message"]
    # Nothing that would hold data is made before the certificates and passwords are.
    assert [s.metadata.name for s in kube.list(StatefulSet, namespace=namespace)] == []  # type: ignore[union-attr]

    first = put_ca()
    served = wait_for(
        lambda: chained_to(first["tls.crt"]), what="certificates signed by corp-ca", timeout=90
    )
    intermediate = x509.load_pem_x509_certificate(first["tls.crt"])
    x509.load_pem_x509_certificate(served["tls.crt"]).verify_directly_issued_by(intermediate)
    # The intermediate travels with the certificate, for clients that trust only the root.
    assert x509.load_pem_x509_certificates(served["tls.crt"])[1:] == [intermediate]
    x509.load_pem_x509_certificate(served["replication.crt"]).verify_directly_issued_by(
        intermediate
    )
    # What clients trust: the intermediate and cert-manager's root beside it.
    assert x509.load_pem_x509_certificates(served["ca.crt"]) == [
        intermediate,
        x509.load_pem_x509_certificate(first["ca.crt"]),
    ]
    assert tls.ca_source(kube.get(Secret, f"{name}-ca", namespace=namespace).to_dict()) == (
        f"corp-ca/{kube.get(Secret, 'corp-ca', namespace=namespace).metadata.resourceVersion}"  # type: ignore[union-attr]
    )
    wait_phase(kube, name, namespace, "Ready", timeout=90)

    # cert-manager renews the CA (a new key): followed at the next resync at the latest.
    second = put_ca()
    renewed = wait_for(
        lambda: chained_to(second["tls.crt"]), what="certificates of the renewed CA", timeout=60
    )
    x509.load_pem_x509_certificate(renewed["tls.crt"]).verify_directly_issued_by(
        x509.load_pem_x509_certificate(second["tls.crt"])
    )
    assert any("CertificateAuthorityCopied" in e for e in events(kube, namespace, name))

    # Unset: a CA of the cluster's own again, and certificates it signed.
    patch_cluster(kube, name, namespace, {"spec": {"tls": {"caSecretName": None}}})

    def own_ca() -> bytes | None:
        ca = kube.get(Secret, f"{name}-ca", namespace=namespace).to_dict()
        return None if tls.ca_source(ca) else data(f"{name}-ca")["ca.crt"]

    own = wait_for(own_ca, what="a CA of the cluster's own", timeout=30)
    assert x509.load_pem_x509_certificate(own).subject != intermediate.subject
    wait_for(lambda: chained_to(own), what="certificates signed by the cluster's own CA")
    # The user's Secret is theirs: never changed, never deleted.
    assert data("corp-ca") == second
    # No private key reaches status, Events or the operator's log.
    visible = str(get_pgc(kube, name, namespace)) + " ".join(events(kube, namespace, name))
    visible += operator.log.read_text()
    for key in (first["tls.key"], second["tls.key"]):
        assert b"".join(key.splitlines()[1:-1]).decode()[:40] not in visible


def test_an_unusable_users_ca_is_a_condition_naming_the_secret_and_the_fix(
    kube: Client, namespace: str, make_cluster: MakeCluster
) -> None:
    own = pki.Authority.new("not a CA's certificate")
    leaf_key = own.issue(common_name="server", server=True)
    kube.create(
        Secret.from_dict(
            {
                "metadata": {"name": "leaf"},
                "data": {
                    "tls.crt": base64.b64encode(leaf_key.cert).decode(),
                    "tls.key": base64.b64encode(leaf_key.key).decode(),
                },
            }
        ),
        namespace=namespace,
    )
    name = make_cluster(tls={"caSecretName": "leaf"})
    found = wait_condition(kube, name, namespace, "Degraded", "CertificateAuthorityInvalid")
    message = condition(found, "Degraded")["message"]
    assert "Secret leaf (spec.tls.caSecretName) holds no usable CA" in message
    assert "not a CA's" in message
    # Nothing was issued with it.
    with pytest.raises(ApiError):
        kube.get(Secret, f"{name}-tls", namespace=namespace)


def test_a_users_serving_certificate_is_served_renewed_checked_and_given_back(
    kube: Client, namespace: str, make_cluster: MakeCluster, operator: OperatorProcess
) -> None:
    """spec.tls.serverSecretName, with the Secret cert-manager writes for a serving
    Certificate: the servers serve it and clients trust its root; a renewal is followed; a
    certificate for other names is refused and the current one kept; unset, the cluster's CA
    signs one again. Client certificates stay the cluster CA's, and only that CA is accepted
    from clients: the user's issuer never makes anyone the superuser."""

    def data(secret: str) -> dict[str, bytes]:
        try:
            found = kube.get(Secret, secret, namespace=namespace).data or {}
        except ApiError:
            return {}
        return {key: base64.b64decode(value) for key, value in found.items()}

    def put(hosts: tuple[str, ...]) -> dict[str, bytes]:
        secret, _ = certificates.cert_manager_server(hosts)
        body = certificates.tls_secret("web", secret)
        kube.apply(Secret.from_dict(body), namespace=namespace, field_manager="cert-manager")
        return secret

    def serving(secret: dict[str, bytes]) -> dict[str, bytes] | None:
        """NAME-tls once it serves ``secret`` and the app Secret trusts what it trusts."""
        served, app = data(f"{name}-tls"), data(f"{name}-app")
        if served.get("tls.crt") != secret["tls.crt"]:
            return None
        return served if app.get("ca.crt") == served["ca.crt"] else None

    name = make_cluster(tls={"serverSecretName": "web"})
    missing = wait_condition(kube, name, namespace, "Degraded", "ServerCertificateMissing")
    assert "spec.tls.serverSecretName names Secret web" in condition(missing, "Degraded")["message"]
    assert [s.metadata.name for s in kube.list(StatefulSet, namespace=namespace)] == []  # type: ignore[union-attr]

    host = f"{name}-primary.{namespace}.svc"
    first = put((host, f"{name}.example.com"))
    served = wait_for(lambda: serving(first), what="the user's certificate served", timeout=90)
    ca = data(f"{name}-ca")["ca.crt"]
    root = x509.load_pem_x509_certificate(first["ca.crt"])
    assert served["tls.key"] == first["tls.key"]
    assert x509.load_pem_x509_certificates(served["ca.crt"]) == [
        root,
        x509.load_pem_x509_certificate(ca),
    ]
    assert served["client-ca.crt"] == ca  # client certificates: the cluster's CA alone
    x509.load_pem_x509_certificate(served["superuser.crt"]).verify_directly_issued_by(
        x509.load_pem_x509_certificate(ca)
    )
    wait_phase(kube, name, namespace, "Ready", timeout=90)

    # cert-manager renews it: followed at the next resync at the latest.
    second = put((host,))
    wait_for(lambda: serving(second), what="the renewed certificate served", timeout=60)

    # A certificate for other names would break every verify-full client: refused, the
    # servers keep the one they serve, and the condition says what to fix.
    put(("somewhere.else",))
    invalid = wait_condition(kube, name, namespace, "Degraded", "ServerCertificateInvalid")
    message = condition(invalid, "Degraded")["message"]
    assert f"does not verify for {host}" in message and "Secret web" in message
    assert data(f"{name}-tls")["tls.crt"] == second["tls.crt"]

    # Unset: a certificate of the cluster's CA again; the user's Secret is left as it is.
    patch_cluster(kube, name, namespace, {"spec": {"tls": {"serverSecretName": None}}})

    def own() -> dict[str, bytes] | None:
        served, app = data(f"{name}-tls"), data(f"{name}-app")
        if tls.server_source(kube.get(Secret, f"{name}-tls", namespace=namespace).to_dict()):
            return None
        return served if served["ca.crt"] == app.get("ca.crt") == ca else None

    again = wait_for(own, what="a certificate of the cluster's CA again", timeout=60)
    x509.load_pem_x509_certificate(again["tls.crt"]).verify_directly_issued_by(
        x509.load_pem_x509_certificate(ca)
    )
    assert "web" in {s.metadata.name for s in kube.list(Secret, namespace=namespace)}  # type: ignore[union-attr]
    # No private key reaches status, Events or the operator's log.
    visible = str(get_pgc(kube, name, namespace)) + " ".join(events(kube, namespace, name))
    visible += operator.log.read_text()
    for key in (first["tls.key"], second["tls.key"]):
        assert b"".join(key.splitlines()[1:-1]).decode()[:40] not in visible
