"""The backup CronJob, the final backup Job, and pgBackRest in the instance pods."""

from __future__ import annotations

from typing import Any

import pytest

from stateward.api.v1alpha1 import PostgresCluster
from stateward.specs import meta
from stateward.specs.postgres import backup
from tests.support import clusters

pytestmark = pytest.mark.unit


def make_cluster(**spec: Any) -> PostgresCluster:
    return clusters.make_cluster(
        **{
            "storageSize": "10Gi",
            "backupSchedule": "0 3 * * *",
            "backup": clusters.BACKUP,
            **spec,
        }
    )


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


def test_cronjob_needs_a_schedule_and_a_repository() -> None:
    with pytest.raises(ValueError, match="backupSchedule"):
        backup.backup_cronjob(make_cluster(backupSchedule=None))
    with pytest.raises(ValueError, match="backup"):
        backup.backup_cronjob(make_cluster(backup=None))


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
def test_backup_pod_runs_pgbackrest_in_the_primary_with_its_own_identity(
    template: dict[str, Any],
) -> None:
    cluster = make_cluster()
    labels = template["metadata"]["labels"]
    assert meta.labels(cluster, component="backup").items() <= labels.items()
    assert not meta.selector_labels(cluster).items() <= labels.items()
    spec = template["spec"]
    assert spec["restartPolicy"] == "Never"
    # It finds the primary and execs pgBackRest there: the API with its own account.
    assert spec["serviceAccountName"] == "demo-backup"
    assert spec["automountServiceAccountToken"] is True
    assert spec["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 999,
        "runAsGroup": 999,
        "fsGroup": 999,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    # No data, no repository, no credentials: those stay in the instance pods.
    assert spec["volumes"] == [{"name": "tmp", "emptyDir": {}}]
    (container,) = spec["containers"]
    assert "env" not in container
    assert container["name"] == "backup"
    assert container["image"] == cluster.image
    assert container["command"] == [
        "stateward-instance",
        "backup",
        "--cluster",
        "demo",
        "--container",
        "postgres",
        "--stanza",
        "demo",
        "--type",
        "full",
    ]
    assert container["terminationMessagePolicy"] == "File"
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def env_of(cluster: PostgresCluster) -> dict[str, dict[str, Any]]:
    return {variable["name"]: variable for variable in backup.instance_env(cluster)}


def test_instance_env_configures_pgbackrest_for_the_repository() -> None:
    env = env_of(make_cluster())
    values = {name: v.get("value") for name, v in env.items()}
    assert values["PGBACKREST_STANZA"] == "demo"
    assert values["PGBACKREST_REPO1_TYPE"] == "s3"
    assert values["PGBACKREST_REPO1_PATH"] == "/db/demo"
    assert values["PGBACKREST_REPO1_S3_ENDPOINT"] == "s3.example.com"
    assert values["PGBACKREST_REPO1_S3_BUCKET"] == "backups"
    assert values["PGBACKREST_REPO1_S3_REGION"] == "us-east-1"
    assert values["PGBACKREST_REPO1_S3_URI_STYLE"] == "path"
    assert values["PGBACKREST_REPO1_RETENTION_FULL"] == "2"
    assert values["PGBACKREST_PG1_PATH"] == "/var/lib/postgresql/data/pgdata"
    assert values["PGBACKREST_PG1_SOCKET_PATH"] == "/var/run/postgresql"
    assert "PGBACKREST_REPO1_STORAGE_PORT" not in values
    assert "PGBACKREST_REPO1_STORAGE_CA_FILE" not in values


def test_the_keys_are_files_from_the_secret_never_variables() -> None:
    cluster = make_cluster()
    env = env_of(cluster)
    assert not [name for name, v in env.items() if "valueFrom" in v or "S3_KEY" in name]
    assert env["PGBACKREST_CONFIG_INCLUDE_PATH"]["value"] == "/tmp/pgbackrest-conf.d"
    # Optional: a missing Secret must not keep PostgreSQL from starting.
    assert backup.instance_volumes(cluster) == [
        {
            "name": "backup-ca",
            "secret": {
                "secretName": "s3-credentials",
                "items": [
                    {"key": "accessKeyId", "path": "s3-key"},
                    {"key": "secretAccessKey", "path": "s3-key-secret"},
                ],
                "optional": True,
                "defaultMode": 0o440,
            },
        }
    ]
    assert backup.instance_mounts(cluster) == [
        {"name": "backup-ca", "mountPath": "/etc/stateward/backup", "readOnly": True}
    ]


def test_instance_env_with_port_path_ca_and_host_style() -> None:
    repository = {
        "s3": {
            **clusters.REPOSITORY["s3"],
            "endpoint": "minio.storage:9000",
            "path": "/prod/orders",
            "caKey": "ca.crt",
            "uriStyle": "Host",
        }
    }
    cluster = make_cluster(backup={"repository": repository, "retention": {"full": 7}})
    values = {name: v.get("value") for name, v in env_of(cluster).items()}
    assert values["PGBACKREST_REPO1_S3_ENDPOINT"] == "minio.storage"
    assert values["PGBACKREST_REPO1_STORAGE_PORT"] == "9000"
    assert values["PGBACKREST_REPO1_PATH"] == "/prod/orders"
    assert values["PGBACKREST_REPO1_S3_URI_STYLE"] == "host"
    assert values["PGBACKREST_REPO1_RETENTION_FULL"] == "7"
    assert values["PGBACKREST_REPO1_STORAGE_CA_FILE"] == "/etc/stateward/backup/ca.crt"
    assert backup.instance_volumes(cluster) == [
        {
            "name": "backup-ca",
            "secret": {
                "secretName": "s3-credentials",
                "items": [
                    {"key": "accessKeyId", "path": "s3-key"},
                    {"key": "secretAccessKey", "path": "s3-key-secret"},
                    {"key": "ca.crt", "path": "ca.crt"},
                ],
                "optional": True,
                "defaultMode": 0o440,
            },
        }
    ]
    assert backup.instance_mounts(cluster) == [
        {"name": "backup-ca", "mountPath": "/etc/stateward/backup", "readOnly": True}
    ]


def test_no_pgbackrest_without_a_repository() -> None:
    cluster = make_cluster(backup=None, backupSchedule=None)
    assert backup.instance_env(cluster) == []
    assert backup.instance_volumes(cluster) == []
    assert backup.instance_mounts(cluster) == []


def test_a_requested_backup_runs_the_same_pod_once_per_request() -> None:
    cluster = make_cluster()
    job = backup.on_demand_backup_job(cluster, "2026-12-02T10:00:00Z")
    again = backup.on_demand_backup_job(cluster, "2026-12-02T10:00:00Z")
    other = backup.on_demand_backup_job(cluster, "2026-12-02T11:00:00Z")
    assert job == again
    assert job["metadata"]["name"].startswith("demo-backup-")
    assert job["metadata"]["name"] != other["metadata"]["name"]
    assert job["metadata"]["labels"]["stateward.io/backup"] == "on-demand"
    assert job["metadata"]["annotations"] == {"stateward.io/backup-request": "2026-12-02T10:00:00Z"}
    assert job["spec"]["ttlSecondsAfterFinished"] == 24 * 3600
    scheduled = backup.backup_cronjob(cluster)["spec"]["jobTemplate"]["spec"]["template"]
    assert job["spec"]["template"]["spec"] == scheduled["spec"]


def test_job_names_fit_kubernetes_limits_for_long_cluster_names() -> None:
    cluster = clusters.make_cluster(metadata={"name": "x" * 63}, backup=clusters.BACKUP)
    assert len(cluster.on_demand_backup_job_name("r")) <= 63


def test_backup_pods_run_the_operators_image_never_a_users_spec_image() -> None:
    # The backup pod may exec into the cluster's instances: it runs the operator's own image
    # (which holds stateward-instance too), not whatever spec.image names.
    operator = "ghcr.io/stateward/stateward@sha256:" + "ab" * 32
    cluster = make_cluster(image="registry.example/my-postgres:15")
    jobs = [
        backup.backup_cronjob(cluster, image=operator)["spec"]["jobTemplate"],
        backup.final_backup_job(cluster, image=operator),
        backup.on_demand_backup_job(cluster, "now", image=operator),
    ]
    for job in jobs:
        (container,) = job["spec"]["template"]["spec"]["containers"]
        assert container["image"] == operator
        assert container["command"][:2] == ["stateward-instance", "backup"]
    # An operator that does not know its image (run outside a pod without --operator-image)
    # falls back to the cluster's instance image, as before.
    (container,) = backup.final_backup_job(cluster)["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "registry.example/my-postgres:15"
