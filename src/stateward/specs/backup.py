"""Backups: the scheduled CronJob, the final Job of the finalizer, and their repository.

Both run the same pod: the instance image's ``stateward-instance backup`` command, connected
to the primary Service as the superuser, writing into the repository volume.
"""

from __future__ import annotations

from stateward.api import v1alpha1
from stateward.instance import patroni
from stateward.specs import meta, pods, secrets

SCHEDULED = "scheduled"
FINAL = "final"
REPOSITORY_MOUNT = "/backups"
CONTAINER_NAME = "backup"
REPOSITORY_VOLUME = "backups"
TMP_VOLUME = "tmp"

CRONJOB_TIME_ZONE = "Etc/UTC"
"""``backupSchedule`` is documented as UTC, whatever the controller manager's zone."""
STARTING_DEADLINE_SECONDS = 3600
"""A backup that starts up to an hour late is still worth taking; later, wait for the next."""
SCHEDULED_DEADLINE_SECONDS = 6 * 3600
"""A scheduled backup still running after six hours is stuck (a pod that never starts, a
primary that never answers): it fails, and the next schedule tries again."""
FINAL_DEADLINE_SECONDS = 3600
"""One attempt of the final backup gets an hour; then it fails and the finalizer retries
with backoff, reporting why. Without a deadline a pod stuck Pending or in ImagePullBackOff
would keep the cluster Terminating forever with nothing saying so."""


def backup_cronjob(cluster: v1alpha1.PostgresCluster) -> meta.Object:
    """``NAME-backup``; only for a cluster with a ``backupSchedule``."""
    schedule = cluster.spec.backup_schedule
    if schedule is None:
        raise ValueError(f"PostgresCluster {cluster.name!r} has no backupSchedule")
    job_labels = _labels(cluster, SCHEDULED)
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": meta.object_meta(
            cluster,
            cluster.backup_cronjob_name,
            component=meta.BACKUP_COMPONENT,
            extra_labels={meta.BACKUP_LABEL: SCHEDULED},
        ),
        "spec": {
            "schedule": schedule,
            "timeZone": CRONJOB_TIME_ZONE,
            "concurrencyPolicy": "Forbid",
            # Explicit, so that the reconciler's suspension (a foreign repository) is undone
            # by applying this again.
            "suspend": False,
            "startingDeadlineSeconds": STARTING_DEADLINE_SECONDS,
            "successfulJobsHistoryLimit": 3,
            "failedJobsHistoryLimit": 3,
            "jobTemplate": {
                "metadata": {"labels": job_labels},
                "spec": {
                    "backoffLimit": 2,
                    "activeDeadlineSeconds": SCHEDULED_DEADLINE_SECONDS,
                    "template": _pod_template(cluster, SCHEDULED),
                },
            },
        },
    }


def final_backup_job(cluster: v1alpha1.PostgresCluster) -> meta.Object:
    """``NAME-final-backup``, created by the finalizer; deletion waits for it to succeed."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta.object_meta(
            cluster,
            cluster.final_backup_job_name,
            component=meta.BACKUP_COMPONENT,
            extra_labels={meta.BACKUP_LABEL: FINAL},
        ),
        # No ttlSecondsAfterFinished: the finalizer reads the outcome.
        "spec": {
            "backoffLimit": 3,
            "activeDeadlineSeconds": FINAL_DEADLINE_SECONDS,
            "template": _pod_template(cluster, FINAL),
        },
    }


def backup_repository_pvc(cluster: v1alpha1.PostgresCluster) -> meta.Object:
    """``NAME-backups``: NOT owned by the cluster, a backup must outlive what it backs up.

    Sized like one instance volume: a base backup is at most the size of the data directory.
    """
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": meta.object_meta(
            cluster,
            cluster.backup_repository_name,
            component=meta.BACKUP_COMPONENT,
            extra_labels={
                meta.BACKUP_REPOSITORY_LABEL: "true",
                meta.CLUSTER_UID_LABEL: cluster.uid,
            },
            owned=False,
        ),
        "spec": pods.volume_claim_spec(cluster),
    }


def _labels(cluster: v1alpha1.PostgresCluster, kind: str) -> dict[str, str]:
    return {
        **meta.labels(cluster, component=meta.BACKUP_COMPONENT),
        meta.BACKUP_LABEL: kind,
    }


def _pod_template(cluster: v1alpha1.PostgresCluster, kind: str) -> meta.Object:
    """The backup pod, shared by the scheduled and the final backup."""
    container: meta.Object = {
        "name": CONTAINER_NAME,
        "image": cluster.image,
        "command": [
            "stateward-instance",
            "backup",
            "--cluster",
            cluster.name,
            "--repository",
            REPOSITORY_MOUNT,
        ],
        # libpq's own variables: pg_basebackup and psql read them as they are.
        "env": [
            {"name": "PGHOST", "value": cluster.primary_service_name},
            {"name": "PGPORT", "value": str(patroni.POSTGRES_PORT)},
            pods.secret_env(
                "PGUSER", secret=cluster.superuser_secret_name, key=secrets.USERNAME_KEY
            ),
            pods.secret_env(
                "PGPASSWORD", secret=cluster.superuser_secret_name, key=secrets.PASSWORD_KEY
            ),
        ],
        "volumeMounts": [
            {"name": REPOSITORY_VOLUME, "mountPath": REPOSITORY_MOUNT},
            {"name": TMP_VOLUME, "mountPath": patroni.TMP_DIR},
        ],
        "securityContext": pods.container_security_context(),
    }
    return {
        "metadata": {"labels": _labels(cluster, kind)},
        "spec": {
            "restartPolicy": "Never",
            # The backup talks to PostgreSQL only, never to the Kubernetes API.
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "securityContext": pods.pod_security_context(),
            "containers": [container],
            "volumes": [
                {
                    "name": REPOSITORY_VOLUME,
                    "persistentVolumeClaim": {"claimName": cluster.backup_repository_name},
                },
                pods.empty_dir(TMP_VOLUME),
            ],
        },
    }
