"""The backup CronJob, the final backup Job and the backup repository."""

from __future__ import annotations

from typing import Any

import pytest

from stateward.api.v1alpha1 import PostgresCluster
from stateward.specs import backup, meta
from tests.support import clusters

pytestmark = pytest.mark.unit


def make_cluster(**spec: Any) -> PostgresCluster:
    return clusters.make_cluster(**{"storageSize": "10Gi", "backupSchedule": "0 3 * * *", **spec})


def test_cronjob() -> None:
    cluster = make_cluster()
    cronjob = backup.backup_cronjob(cluster)
    assert cronjob["apiVersion"] == "batch/v1"
    assert cronjob["kind"] == "CronJob"
    assert cronjob["metadata"] == {
        "name": "demo-backup",
        "namespace": "db",
        "labels": {
            **meta.labels(cluster, component="backup"),
            "stateward.io/backup": "scheduled",
        },
        "ownerReferences": [meta.owner_reference(cluster)],
    }
    spec = cronjob["spec"]
    assert spec["schedule"] == "0 3 * * *"
    assert spec["timeZone"] == "Etc/UTC"
    assert spec["concurrencyPolicy"] == "Forbid"
    assert spec["successfulJobsHistoryLimit"] == 3
    assert spec["failedJobsHistoryLimit"] == 3
    assert spec["startingDeadlineSeconds"] > 0
    assert spec["jobTemplate"]["spec"]["backoffLimit"] == 2
    # A stuck backup fails instead of blocking the next schedule forever.
    assert spec["jobTemplate"]["spec"]["activeDeadlineSeconds"] == backup.SCHEDULED_DEADLINE_SECONDS
    assert spec["jobTemplate"]["metadata"]["labels"]["stateward.io/backup"] == "scheduled"


def test_cronjob_needs_a_schedule() -> None:
    with pytest.raises(ValueError, match="backupSchedule"):
        backup.backup_cronjob(make_cluster(backupSchedule=None))


def test_final_backup_job() -> None:
    cluster = make_cluster(backupSchedule=None)
    job = backup.final_backup_job(cluster)
    assert job["apiVersion"] == "batch/v1"
    assert job["kind"] == "Job"
    assert job["metadata"] == {
        "name": "demo-final-backup",
        "namespace": "db",
        "labels": {**meta.labels(cluster, component="backup"), "stateward.io/backup": "final"},
        "ownerReferences": [meta.owner_reference(cluster)],
    }
    assert job["spec"]["backoffLimit"] == 3
    # A pod that never starts must not keep the cluster Terminating forever.
    assert job["spec"]["activeDeadlineSeconds"] == backup.FINAL_DEADLINE_SECONDS == 3600
    assert "ttlSecondsAfterFinished" not in job["spec"]
    assert job["spec"]["template"]["metadata"]["labels"]["stateward.io/backup"] == "final"


def pod_templates() -> list[dict[str, Any]]:
    cluster = make_cluster()
    return [
        backup.backup_cronjob(cluster)["spec"]["jobTemplate"]["spec"]["template"],
        backup.final_backup_job(cluster)["spec"]["template"],
    ]


def test_scheduled_and_final_backups_run_the_same_pod() -> None:
    scheduled, final = pod_templates()
    assert scheduled["spec"] == final["spec"]
    scheduled_labels = dict(scheduled["metadata"]["labels"])
    final_labels = dict(final["metadata"]["labels"])
    assert scheduled_labels.pop("stateward.io/backup") == "scheduled"
    assert final_labels.pop("stateward.io/backup") == "final"
    assert scheduled_labels == final_labels


@pytest.mark.parametrize("template", pod_templates())
def test_backup_pod(template: dict[str, Any]) -> None:
    cluster = make_cluster()
    labels = template["metadata"]["labels"]
    assert meta.labels(cluster, component="backup").items() <= labels.items()
    assert not meta.selector_labels(cluster).items() <= labels.items()
    spec = template["spec"]
    assert spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 999,
        "runAsGroup": 999,
        "fsGroup": 999,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert spec["volumes"] == [
        {"name": "backups", "persistentVolumeClaim": {"claimName": "demo-backups"}},
        {"name": "tmp", "emptyDir": {}},
    ]
    (container,) = spec["containers"]
    assert container["name"] == "backup"
    assert container["image"] == cluster.image
    assert container["command"][:4] == ["stateward-instance", "backup", "--cluster", "demo"]
    assert {"name": "backups", "mountPath": "/backups"} in container["volumeMounts"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


@pytest.mark.parametrize("template", pod_templates())
def test_backup_pod_connects_to_the_primary_with_secret_credentials(
    template: dict[str, Any],
) -> None:
    (container,) = template["spec"]["containers"]
    env = {variable["name"]: variable for variable in container["env"]}
    assert env["PGHOST"] == {"name": "PGHOST", "value": "demo-primary"}
    assert env["PGPORT"] == {"name": "PGPORT", "value": "5432"}
    assert env["PGUSER"]["valueFrom"] == {
        "secretKeyRef": {"name": "demo-superuser", "key": "username"}
    }
    assert env["PGPASSWORD"]["valueFrom"] == {
        "secretKeyRef": {"name": "demo-superuser", "key": "password"}
    }
    assert "value" not in env["PGPASSWORD"]


def test_backup_repository_is_not_owned() -> None:
    cluster = make_cluster(backupSchedule=None)
    pvc = backup.backup_repository_pvc(cluster)
    assert pvc["apiVersion"] == "v1"
    assert pvc["kind"] == "PersistentVolumeClaim"
    assert pvc["metadata"] == {
        "name": "demo-backups",
        "namespace": "db",
        "labels": {
            **meta.labels(cluster, component="backup"),
            "stateward.io/backup-repository": "true",
            # the lineage: which cluster's backups these are
            "stateward.io/cluster-uid": cluster.uid,
        },
    }
    assert "ownerReferences" not in pvc["metadata"]
    assert pvc["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "10Gi"}},
    }


def test_backup_repository_with_storage_class() -> None:
    pvc = backup.backup_repository_pvc(make_cluster(storageClassName="slow-hdd"))
    assert pvc["spec"]["storageClassName"] == "slow-hdd"
