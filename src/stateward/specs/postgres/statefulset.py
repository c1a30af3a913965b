"""The StatefulSet of instance pods, each running Patroni supervising PostgreSQL."""

from __future__ import annotations

from typing import Final

from stateward.api import v1alpha1
from stateward.instance import metrics, patroni, queries
from stateward.specs import meta, pods
from stateward.specs.postgres import backup, secrets, services

CONTAINER_NAME = pods.INSTANCE_CONTAINER
DATA_VOLUME = "pgdata"
CONFIG_VOLUME = "config"
SOCKET_VOLUME = "run"
TMP_VOLUME = "tmp"
SHM_VOLUME = "shm"
TLS_VOLUME = "tls"
CREDENTIALS_VOLUME = "credentials"
TLS_FILE_MODE = 0o440
"""Read-only for the owner (root) and the pod's fsGroup (postgres): PostgreSQL accepts a key
file owned by root and readable by its group, and refuses one anyone else can read."""
SHM_MOUNT = "/dev/shm"  # noqa: S108 - a memory-backed emptyDir

TERMINATION_GRACE_PERIOD_SECONDS = 120
"""Patroni stops PostgreSQL in fast mode; a primary first waits for the shutdown checkpoint
to reach the replicas. Killing it sooner only costs crash recovery, never data."""


def statefulset(cluster: v1alpha1.PostgresCluster, *, config_hash: str) -> meta.Object:
    """``NAME``: ``replicas`` instance pods; ``config_hash`` marks the configuration they run."""
    spec: meta.Object = {
        "replicas": cluster.spec.replicas,
        "serviceName": cluster.headless_service_name,
        # Parallel: Patroni settles bootstrap races through the DCS leader lock, so pods
        # need not start one by one, and a stuck pod-0 does not block the others.
        # Immutable once created.
        "podManagementPolicy": "Parallel",
        # The operator rolls pods itself: replicas first, switchover, primary last.
        "updateStrategy": {"type": "OnDelete"},
        "selector": {"matchLabels": meta.selector_labels(cluster)},
        "template": _pod_template(cluster, config_hash=config_hash),
        "volumeClaimTemplates": [_data_volume_claim_template(cluster)],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": meta.object_meta(cluster, cluster.name, component=meta.INSTANCE_COMPONENT),
        "spec": spec,
    }


def _pod_template(cluster: v1alpha1.PostgresCluster, *, config_hash: str) -> meta.Object:
    # No role label here: Patroni sets it once the pod has a role.
    return {
        "metadata": {
            "labels": {
                **meta.labels(cluster, component=meta.INSTANCE_COMPONENT),
                **meta.selector_labels(cluster),
                meta.TLS_LABEL: meta.TLS_GENERATION,
            },
            "annotations": {meta.CONFIG_HASH_ANNOTATION: config_hash},
        },
        "spec": {
            "serviceAccountName": cluster.instance_account_name,
            # Service links would inject variables named after every Service in the
            # namespace, PATRONI_* ones included, which Patroni would read as settings.
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": TERMINATION_GRACE_PERIOD_SECONDS,
            "securityContext": pods.pod_security_context(),
            "affinity": _anti_affinity(cluster),
            "containers": [_postgres_container(cluster)],
            "volumes": [
                {"name": CONFIG_VOLUME, "configMap": {"name": cluster.patroni_config_map_name}},
                pods.empty_dir(SOCKET_VOLUME),
                # Memory-backed: Patroni's configuration with the credentials and its pgpass.
                pods.empty_dir(TMP_VOLUME, memory=True),
                _credentials_volume(cluster),
                # The runtime's default /dev/shm (64 MiB) is too small for parallel queries.
                pods.empty_dir(SHM_VOLUME, memory=True),
                {
                    "name": TLS_VOLUME,
                    "secret": {
                        "secretName": cluster.tls_secret_name,
                        "defaultMode": TLS_FILE_MODE,
                    },
                },
                *backup.instance_volumes(cluster),
                *_queries_volumes(cluster),
            ],
        },
    }


QUERIES_VOLUME: Final = "custom-queries"


def _queries_volumes(cluster: v1alpha1.PostgresCluster) -> list[meta.Object]:
    """The custom metric queries (``spec.monitoring.customQueriesConfigMap``), each key a
    file of :data:`queries.DIRECTORY`; optional, so a ConfigMap made later (or never) does
    not hold the instance back. None without queries: the template stays as it was."""
    sources = cluster.spec.monitoring.custom_queries_config_map
    if not sources:
        return []
    return [
        {
            "name": QUERIES_VOLUME,
            "projected": {
                "sources": [
                    {
                        "configMap": {
                            "name": source.name,
                            "optional": True,
                            "items": [{"key": source.key, "path": f"{i}-{source.name}.yaml"}],
                        }
                    }
                    for i, source in enumerate(sources)
                ],
            },
        }
    ]


def _postgres_container(cluster: v1alpha1.PostgresCluster) -> meta.Object:
    container: meta.Object = {
        "name": CONTAINER_NAME,
        "image": cluster.image,
        "command": ["stateward-instance", "run", "--config", patroni.CONFIG_FILE],
        "ports": [
            {"name": services.POSTGRES_PORT_NAME, "containerPort": patroni.POSTGRES_PORT},
            {"name": services.PATRONI_PORT_NAME, "containerPort": patroni.RESTAPI_PORT},
            {"name": metrics.PORT_NAME, "containerPort": metrics.PORT},
        ],
        "env": _env(cluster),
    }
    resources = _resources(cluster)
    if resources:
        container["resources"] = resources
    container.update(
        {
            "volumeMounts": [
                {"name": DATA_VOLUME, "mountPath": patroni.DATA_MOUNT},
                {"name": CONFIG_VOLUME, "mountPath": patroni.CONFIG_DIR, "readOnly": True},
                {"name": SOCKET_VOLUME, "mountPath": patroni.SOCKET_DIR},
                {"name": TMP_VOLUME, "mountPath": patroni.TMP_DIR},
                {"name": SHM_VOLUME, "mountPath": SHM_MOUNT},
                {"name": TLS_VOLUME, "mountPath": patroni.TLS_DIR, "readOnly": True},
                {
                    "name": CREDENTIALS_VOLUME,
                    "mountPath": patroni.CREDENTIALS_DIR,
                    "readOnly": True,
                },
                *backup.instance_mounts(cluster),
                *(
                    [{"name": QUERIES_VOLUME, "mountPath": queries.DIRECTORY, "readOnly": True}]
                    if cluster.spec.monitoring.custom_queries_config_map
                    else []
                ),
            ],
            # Until the REST API answers (Patroni start-up); Patroni's loop keeps running
            # during a long base backup, so this need not cover cloning.
            "startupProbe": _probe("/liveness", period=5, timeout=3, failures=60),
            # Restarting the container kills PostgreSQL: only for a loop hung for a minute,
            # well after a failover (TTL) would have happened anyway.
            "livenessProbe": _probe("/liveness", period=10, timeout=5, failures=6),
            # Leader, or a replica that is streaming: what the Services may route to.
            "readinessProbe": _probe("/readiness", period=5, timeout=3, failures=3),
            "securityContext": pods.container_security_context(),
        }
    )
    return container


def _env(cluster: v1alpha1.PostgresCluster) -> list[meta.Object]:
    """Per-pod values and credentials; everything static is in ``patroni.yaml``.

    Order matters: ``$(PATRONI_KUBERNETES_POD_IP)`` refers to a variable defined above it.
    """
    pod_ip = "$(PATRONI_KUBERNETES_POD_IP)"
    return [
        pods.field_env("PATRONI_NAME", field_path="metadata.name"),
        pods.field_env("PATRONI_KUBERNETES_NAMESPACE", field_path="metadata.namespace"),
        pods.field_env("PATRONI_KUBERNETES_POD_IP", field_path="status.podIP"),
        {"name": "PATRONI_RESTAPI_CONNECT_ADDRESS", "value": f"{pod_ip}:{patroni.RESTAPI_PORT}"},
        {
            "name": "PATRONI_POSTGRESQL_CONNECT_ADDRESS",
            "value": f"{pod_ip}:{patroni.POSTGRES_PORT}",
        },
        # Credentials are files (CREDENTIALS_VOLUME), never variables.
        # The application role and database, made once by `stateward-instance post-bootstrap`.
        {"name": patroni.APP_DATABASE_ENV, "value": cluster.spec.bootstrap.database},
        {"name": patroni.APP_OWNER_ENV, "value": cluster.spec.bootstrap.owner},
        # `patronictl` in the pod (kubectl exec) finds the configuration (credentials
        # included, for the REST API) without flags.
        {"name": "PATRONICTL_CONFIG_FILE", "value": patroni.RUNTIME_CONFIG_FILE},
        # pgBackRest (archive_command, the backup Jobs' exec): the repository's options.
        *backup.instance_env(cluster),
    ]


def _credentials_volume(cluster: v1alpha1.PostgresCluster) -> meta.Object:
    """The credential Secrets as files under ``patroni.CREDENTIALS_DIR``: ``ROLE/username``
    and ``ROLE/password`` of Patroni's users, ``app/password`` for the post-bootstrap hook.
    A projected volume is memory-backed; root-owned, readable by the postgres group only."""
    basic_auth = {
        "superuser": cluster.superuser_secret_name,
        "replication": cluster.replication_secret_name,
        "restapi": cluster.restapi_secret_name,
    }
    sources: list[meta.Object] = [
        {
            "secret": {
                "name": secret,
                "items": [
                    {"key": key, "path": f"{role}/{key}"}
                    for key in (secrets.USERNAME_KEY, secrets.PASSWORD_KEY)
                ],
            }
        }
        for role, secret in basic_auth.items()
    ]
    sources.append(
        {
            "secret": {
                "name": cluster.app_secret_name,
                "items": [{"key": secrets.PASSWORD_KEY, "path": "app/password"}],
            }
        }
    )
    return {
        "name": CREDENTIALS_VOLUME,
        "projected": {"sources": sources, "defaultMode": TLS_FILE_MODE},
    }


def _resources(cluster: v1alpha1.PostgresCluster) -> meta.Object:
    wanted = cluster.spec.resources
    return {
        key: dict(value)
        for key, value in (("requests", wanted.requests), ("limits", wanted.limits))
        if value
    }


def _probe(path: str, *, period: int, timeout: int, failures: int) -> meta.Object:
    return {
        # Patroni serves HTTPS; the kubelet does not verify the certificate of a probe.
        "httpGet": {"path": path, "port": patroni.RESTAPI_PORT, "scheme": "HTTPS"},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
    }


def _anti_affinity(cluster: v1alpha1.PostgresCluster) -> meta.Object:
    """One instance per place (``spec.placement``): required by default, so a node lost to a
    fault cannot take the primary and its synchronous standby together; preferred when the
    user chose it for a cluster larger than its nodes."""
    placement = cluster.spec.placement
    term = {
        "labelSelector": {"matchLabels": meta.selector_labels(cluster)},
        "topologyKey": placement.topology_key,
    }
    if placement.anti_affinity == v1alpha1.AntiAffinity.REQUIRED:
        return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    return {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 100, "podAffinityTerm": term}
            ]
        }
    }


def _data_volume_claim_template(cluster: v1alpha1.PostgresCluster) -> meta.Object:
    return {
        "metadata": {
            "name": DATA_VOLUME,
            "labels": meta.labels(cluster, component=meta.INSTANCE_COMPONENT),
        },
        "spec": pods.volume_claim_spec(cluster),
    }
