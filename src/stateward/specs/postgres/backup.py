"""Backups: the scheduled CronJob, the final Job of the finalizer, and pgBackRest's settings
in the instance pods.

Both Jobs run the same pod: the instance image's ``stateward-instance backup``, which runs
pgBackRest in the primary's container through the API server (``instance.backup``). The
repository is ``spec.backup.repository``; pgBackRest's options reach the instance pods as
environment variables (:func:`pgbackrest_options`; the pod's side of pgBackRest is
``instance.pgbackrest``).
"""

from __future__ import annotations

from stateward.api import v1alpha1
from stateward.instance import patroni, pgbackrest
from stateward.specs import meta, pods

SCHEDULED = "scheduled"
FINAL = "final"
CONTAINER_NAME = "backup"
TMP_VOLUME = "tmp"
CA_VOLUME = "backup-ca"

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


def backup_cronjob(cluster: v1alpha1.PostgresCluster, *, image: str | None = None) -> meta.Object:
    """``NAME-backup``; only for a cluster with a ``backupSchedule`` (and so a repository)."""
    schedule = cluster.spec.backup_schedule
    if schedule is None or cluster.spec.backup is None:
        raise ValueError(f"PostgresCluster {cluster.name!r} has no backupSchedule or backup")
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
                    "template": _pod_template(cluster, SCHEDULED, image),
                },
            },
        },
    }


def final_backup_job(cluster: v1alpha1.PostgresCluster, *, image: str | None = None) -> meta.Object:
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
            "template": _pod_template(cluster, FINAL, image),
        },
    }


ON_DEMAND = "on-demand"
ON_DEMAND_TTL_SECONDS = 24 * 3600
"""A requested backup's Job (and the log of its pod) stays a day; status keeps its result."""
REQUEST_ANNOTATION = "stateward.io/backup-request"


def on_demand_backup_job(
    cluster: v1alpha1.PostgresCluster, request: str, *, image: str | None = None
) -> meta.Object:
    """The Job of one ``stateward.io/backup`` request: the scheduled backup's pod, once."""
    name = cluster.on_demand_backup_job_name(request)
    meta_ = meta.object_meta(
        cluster, name, component=meta.BACKUP_COMPONENT, extra_labels={meta.BACKUP_LABEL: ON_DEMAND}
    )
    meta_["annotations"] = {REQUEST_ANNOTATION: request}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta_,
        "spec": {
            "backoffLimit": 2,
            "activeDeadlineSeconds": SCHEDULED_DEADLINE_SECONDS,
            "ttlSecondsAfterFinished": ON_DEMAND_TTL_SECONDS,
            "template": _pod_template(cluster, ON_DEMAND, image),
        },
    }


def _labels(cluster: v1alpha1.PostgresCluster, kind: str) -> dict[str, str]:
    return {
        **meta.labels(cluster, component=meta.BACKUP_COMPONENT),
        meta.BACKUP_LABEL: kind,
    }


def _pod_template(cluster: v1alpha1.PostgresCluster, kind: str, image: str | None) -> meta.Object:
    """The backup pod, shared by the scheduled and the final backup: it runs pgBackRest in
    the primary's container (``stateward-instance backup``) and needs nothing but its
    identity; the data and the repository's credentials stay in the instance pods.

    ``image``: the operator's own (which holds ``stateward-instance`` too), so that the pod
    that may exec into the cluster's instances never runs a ``spec.image`` a user chose;
    the cluster's instance image only when the operator does not know its own."""
    container: meta.Object = {
        "name": CONTAINER_NAME,
        "image": image or cluster.image,
        "command": [
            "stateward-instance",
            "backup",
            "--cluster",
            cluster.name,
            "--container",
            pods.INSTANCE_CONTAINER,
            "--stanza",
            cluster.backup_stanza,
            "--type",
            "full",
        ],
        "volumeMounts": [{"name": TMP_VOLUME, "mountPath": patroni.TMP_DIR}],
        "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}},
        # The summary (or the error) the operator reads, also when the log is gone.
        "terminationMessagePolicy": "File",
        "securityContext": pods.container_security_context(),
    }
    return {
        "metadata": {"labels": _labels(cluster, kind)},
        "spec": {
            "restartPolicy": "Never",
            "serviceAccountName": cluster.backup_account_name,
            "automountServiceAccountToken": True,
            "enableServiceLinks": False,
            "securityContext": pods.pod_security_context(),
            "containers": [container],
            "volumes": [pods.empty_dir(TMP_VOLUME)],
        },
    }


# --- pgBackRest in the instance pods ---------------------------------------------------------


def instance_env(cluster: v1alpha1.PostgresCluster) -> list[meta.Object]:
    """pgBackRest's options for the instance container (none without ``spec.backup``). The
    keys are files (:func:`instance_volumes`), never variables."""
    if cluster.spec.backup is None:
        return []
    options = pgbackrest_options(
        cluster,
        data_dir=patroni.DATA_DIR,
        socket_dir=patroni.SOCKET_DIR,
        port=patroni.POSTGRES_PORT,
    )
    env: list[meta.Object] = [{"name": k, "value": v} for k, v in options.items()]
    env.append({"name": "PGBACKREST_CONFIG_INCLUDE_PATH", "value": pgbackrest.INCLUDE_DIR})
    return env


def instance_volumes(cluster: v1alpha1.PostgresCluster) -> list[meta.Object]:
    """The repository's Secret as files: the S3 keys (``stateward-instance run`` hands them
    to pgBackRest in a private file) and the store's CA certificate when ``caKey`` names one.
    Optional: a missing Secret or key must not keep PostgreSQL from starting (archiving
    fails and the operator reports it). Readable by the postgres group only."""
    backup = cluster.spec.backup
    if backup is None:
        return []
    s3 = backup.repository.s3
    directory = pgbackrest.CA_DIR + "/"
    items = [
        {"key": pgbackrest.ACCESS_KEY_KEY, "path": pgbackrest.KEY_FILE.removeprefix(directory)},
        {"key": pgbackrest.SECRET_KEY_KEY,
         "path": pgbackrest.KEY_SECRET_FILE.removeprefix(directory)},
    ]  # fmt: skip
    if s3.ca_key is not None:
        items.append({"key": s3.ca_key, "path": pgbackrest.CA_FILE_NAME})
    return [
        {
            "name": CA_VOLUME,
            "secret": {
                "secretName": s3.credentials_secret,
                "items": items,
                "optional": True,
                "defaultMode": 0o440,
            },
        }
    ]


def instance_mounts(cluster: v1alpha1.PostgresCluster) -> list[meta.Object]:
    if not instance_volumes(cluster):
        return []
    return [{"name": CA_VOLUME, "mountPath": pgbackrest.CA_DIR, "readOnly": True}]


# --- pgBackRest for this cluster ----------------------------------------------------------


def archive_command(cluster: v1alpha1.PostgresCluster) -> str:
    if cluster.spec.backup is None:
        return pgbackrest.ARCHIVE_DISABLED
    return f"pgbackrest --stanza={cluster.backup_stanza} archive-push %p"


def pgbackrest_options(
    cluster: v1alpha1.PostgresCluster, *, data_dir: str, socket_dir: str, port: int
) -> dict[str, str]:
    """Every pgBackRest option but the keys, as environment variables (sorted)."""
    backup = cluster.spec.backup
    if backup is None:
        return {}
    s3 = backup.repository.s3
    path = cluster.backup_repository_path
    assert path is not None
    values = {
        "PGBACKREST_STANZA": cluster.backup_stanza,
        "PGBACKREST_PG1_PATH": data_dir,
        "PGBACKREST_PG1_PORT": str(port),
        "PGBACKREST_PG1_SOCKET_PATH": socket_dir,
        "PGBACKREST_PG1_USER": "postgres",
        "PGBACKREST_REPO1_TYPE": "s3",
        "PGBACKREST_REPO1_PATH": path,
        "PGBACKREST_REPO1_S3_ENDPOINT": s3.host,
        "PGBACKREST_REPO1_S3_BUCKET": s3.bucket,
        "PGBACKREST_REPO1_S3_REGION": s3.region,
        "PGBACKREST_REPO1_S3_URI_STYLE": s3.uri_style.value.lower(),
        "PGBACKREST_REPO1_RETENTION_FULL": str(backup.retention.full),
        "PGBACKREST_COMPRESS_TYPE": pgbackrest.COMPRESS_TYPE,
        # The console (the pod's log, the Job's log) is enough; the root filesystem is
        # read-only and /var/log/pgbackrest does not exist.
        "PGBACKREST_LOG_LEVEL_FILE": "off",
        "PGBACKREST_LOCK_PATH": pgbackrest.LOCK_PATH,
        # Per I/O, not per transfer: a slow upload still progresses within it. pgBackRest
        # retries an I/O up to 8 times, so the default (60 s) took 8 minutes to report an
        # unreachable store, holding the archive lock meanwhile.
        "PGBACKREST_IO_TIMEOUT": str(pgbackrest.IO_TIMEOUT_SECONDS),
    }
    if s3.port is not None:
        values["PGBACKREST_REPO1_STORAGE_PORT"] = str(s3.port)
    if s3.ca_key is not None:
        values["PGBACKREST_REPO1_STORAGE_CA_FILE"] = pgbackrest.CA_FILE
    return dict(sorted(values.items()))


def restore_command(cluster: v1alpha1.PostgresCluster) -> str | None:
    """Patroni's custom bootstrap command for ``spec.bootstrap.restore`` (None without)."""
    restore = cluster.spec.bootstrap.restore
    path = cluster.restore_source_path
    if restore is None or path is None:
        return None
    # Every value is validated against a pattern without spaces or quotes (the API).
    words = ["stateward-instance", "restore", "--stanza", restore.cluster, "--path", path]
    if restore.target_time is not None:
        words += ["--target-time", restore.target_time]
    elif restore.restore_point is not None:
        words += ["--restore-point", restore.restore_point]
    return " ".join(words)
