"""The PgBouncer pooler of a PostgresCluster (``spec.pooler``): its configuration, its
Deployment, its Service and its NetworkPolicy, all named ``NAME-pooler``.

PgBouncer points at the primary Service, so a failover or switchover needs no new
configuration: its next server connection reaches the new primary. How applications log in
through it, and why no file holds a password, is told in :mod:`stateward.instance.pooler`.
"""

from __future__ import annotations

import hashlib
from typing import Final

from stateward.api import v1alpha1
from stateward.instance import patroni, pooler
from stateward.specs import meta, network, pods, tls

COMPONENT: Final = "pooler"
CONTAINER: Final = "pgbouncer"
PORT_NAME: Final = "pgbouncer"
CONFIG_VOLUME: Final = "config"
TLS_VOLUME: Final = "tls"
HASH_LENGTH: Final = 16
TERMINATION_GRACE_PERIOD_SECONDS: Final = 60
"""PgBouncer's safe shutdown waits for the transactions running; a minute covers those an
application should run through a pooler."""
SERVER_LOGIN_RETRY: Final = 1
"""Seconds before PgBouncer tries the primary again after a failed login (default 15): the
primary Service has no endpoint for a moment during a failover or switchover."""

TLS_FILES: Final = (
    tls.CERT_KEY,
    tls.KEY_KEY,
    tls.CA_CERT_KEY,
    tls.CLIENT_CA_KEY,
    *tls.client_files(pooler.CLIENT_STEM),
)
"""What the pooler pods see of ``NAME-tls``: the serving certificate, what the servers are
verified with, the CA client certificates must come from (the operator's, for the console),
and PgBouncer's own client certificate; never the superuser's or the replication role's."""
HBA_FILE: Final = "pg_hba.conf"
USERS_FILE: Final = "userlist.txt"
HBA: Final = (
    # The console, to the operator's certificate alone; its name opens nothing else.
    f"hostssl pgbouncer {pooler.ADMIN_ROLE} 0.0.0.0/0 cert",
    f"hostssl pgbouncer {pooler.ADMIN_ROLE} ::/0 cert",
    f"hostssl all {pooler.ADMIN_ROLE} 0.0.0.0/0 reject",
    f"hostssl all {pooler.ADMIN_ROLE} ::/0 reject",
    "hostssl pgbouncer all 0.0.0.0/0 reject",
    "hostssl pgbouncer all ::/0 reject",
    # Applications: their SCRAM password, checked against PostgreSQL's verifier.
    "hostssl all all 0.0.0.0/0 scram-sha-256",
    "hostssl all all ::/0 scram-sha-256",
)
"""PgBouncer's own pg_hba (``auth_type = hba``); TLS is required before any of it."""
USERS: Final = f'"{pooler.ADMIN_ROLE}" ""\n'
"""PgBouncer must know the console's user to let it in; it has no password (its hba line
asks for the certificate), and no other user is listed: applications are looked up."""


def selector_labels(cluster: v1alpha1.PostgresCluster) -> dict[str, str]:
    """The pooler pods of ``cluster`` and nothing else (never an instance pod: the
    component differs)."""
    return {
        meta.NAME_LABEL: meta.APP_NAME,
        meta.CLUSTER_LABEL: cluster.name,
        meta.COMPONENT_LABEL: COMPONENT,
    }


def pgbouncer_ini(cluster: v1alpha1.PostgresCluster) -> str:
    """PgBouncer's whole configuration. No secret in it: it may live in a ConfigMap."""
    wanted = cluster.spec.pooler
    if wanted is None:
        raise ValueError(f"{cluster.name} has no spec.pooler")
    primary = f"{cluster.primary_service_name}.{cluster.namespace}.svc"
    files = pooler.TLS_DIR
    settings = {
        "listen_addr": "0.0.0.0",  # noqa: S104 - the pod's address; the NetworkPolicy decides who reaches it
        "listen_port": str(pooler.PORT),
        "unix_socket_dir": "",
        "auth_type": "hba",
        "auth_hba_file": f"{pooler.CONFIG_DIR}/{HBA_FILE}",
        "auth_file": f"{pooler.CONFIG_DIR}/{USERS_FILE}",
        "admin_users": pooler.ADMIN_ROLE,
        "auth_user": pooler.ROLE,
        "auth_query": pooler.AUTH_QUERY,
        "auth_dbname": pooler.AUTH_DATABASE,
        "pool_mode": wanted.pool_mode.value,
        "default_pool_size": str(wanted.default_pool_size),
        "max_client_conn": str(wanted.max_client_connections),
        # Clients: TLS or nothing, as PostgreSQL itself.
        "client_tls_sslmode": "require",
        "client_tls_cert_file": f"{files}/{tls.CERT_KEY}",
        "client_tls_key_file": f"{files}/{tls.KEY_KEY}",
        # Client certificates (the console's) only from the cluster's CA.
        "client_tls_ca_file": f"{files}/{tls.CLIENT_CA_KEY}",
        "client_tls_protocols": "tlsv1.3",
        # The primary: its name verified, PgBouncer's role proven by its certificate.
        "server_tls_sslmode": "verify-full",
        "server_tls_ca_file": f"{files}/{tls.CA_CERT_KEY}",
        "server_tls_cert_file": f"{files}/{tls.client_files(pooler.CLIENT_STEM)[0]}",
        "server_tls_key_file": f"{files}/{tls.client_files(pooler.CLIENT_STEM)[1]}",
        "server_tls_protocols": "tlsv1.3",
        "server_login_retry": str(SERVER_LOGIN_RETRY),
        "server_connect_timeout": "5",
        # Drivers send these; PgBouncer would refuse a client that sets what it cannot pool.
        "ignore_startup_parameters": "extra_float_digits,options",
        # One line per connection would drown the log of a busy pooler; errors still show.
        "log_connections": "0",
        "log_disconnections": "0",
    }
    lines = [
        f"; PgBouncer of PostgresCluster {cluster.namespace}/{cluster.name}, rendered by",
        "; Stateward from spec.pooler: edits here are replaced.",
        "[databases]",
        f"* = host={primary} port={patroni.POSTGRES_PORT}",
        "",
        "[pgbouncer]",
        *(f"{key} = {value}" for key, value in settings.items()),
        "",
    ]
    return "\n".join(lines)


def config_map(cluster: v1alpha1.PostgresCluster) -> meta.Object:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta.object_meta(cluster, cluster.pooler_name, component=COMPONENT),
        "data": {
            "pgbouncer.ini": pgbouncer_ini(cluster),
            HBA_FILE: "\n".join(HBA) + "\n",
            USERS_FILE: USERS,
        },
    }


def deployment(cluster: v1alpha1.PostgresCluster) -> meta.Object:
    """``spec.pooler.instances`` PgBouncer pods; a changed configuration rolls them one at a
    time, a new one ready before an old one goes."""
    wanted = cluster.spec.pooler
    if wanted is None:
        raise ValueError(f"{cluster.name} has no spec.pooler")
    rendered = pgbouncer_ini(cluster) + "\n".join(HBA) + USERS
    digest = hashlib.sha256(rendered.encode()).hexdigest()[:HASH_LENGTH]
    selector = selector_labels(cluster)
    container = {
        "name": CONTAINER,
        "image": cluster.pooler_image,
        "command": ["stateward-instance", "pooler", "--config", pooler.CONFIG_FILE],
        "ports": [{"name": PORT_NAME, "containerPort": pooler.PORT}],
        "volumeMounts": [
            {"name": CONFIG_VOLUME, "mountPath": pooler.CONFIG_DIR, "readOnly": True},
            {"name": TLS_VOLUME, "mountPath": pooler.TLS_DIR, "readOnly": True},
        ],
        "readinessProbe": {
            "tcpSocket": {"port": pooler.PORT},
            "periodSeconds": 5,
            "timeoutSeconds": 3,
            "failureThreshold": 2,
        },
        "livenessProbe": {
            "tcpSocket": {"port": pooler.PORT},
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 6,
        },
        "securityContext": pods.container_security_context(),
    }
    template = {
        "metadata": {
            "labels": {**meta.labels(cluster, component=COMPONENT), **selector},
            "annotations": {meta.CONFIG_HASH_ANNOTATION: digest},
        },
        "spec": {
            # PgBouncer calls no Kubernetes API: no token in its pods.
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": TERMINATION_GRACE_PERIOD_SECONDS,
            "securityContext": pods.pod_security_context(),
            "affinity": {
                "podAntiAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "weight": 100,
                            "podAffinityTerm": {
                                "labelSelector": {"matchLabels": selector},
                                "topologyKey": "kubernetes.io/hostname",
                            },
                        }
                    ]
                }
            },
            "containers": [container],
            "volumes": [
                {"name": CONFIG_VOLUME, "configMap": {"name": cluster.pooler_name}},
                {
                    "name": TLS_VOLUME,
                    "secret": {
                        "secretName": cluster.tls_secret_name,
                        "defaultMode": 0o440,
                        "items": [{"key": key, "path": key} for key in TLS_FILES],
                    },
                },
            ],
        },
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta.object_meta(cluster, cluster.pooler_name, component=COMPONENT),
        "spec": {
            "replicas": wanted.instances,
            "selector": {"matchLabels": selector},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
            },
            "template": template,
        },
    }


def service(cluster: v1alpha1.PostgresCluster) -> meta.Object:
    """``NAME-pooler``: PostgreSQL's port, PgBouncer behind it."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta.object_meta(cluster, cluster.pooler_name, component=COMPONENT),
        "spec": {
            "selector": selector_labels(cluster),
            "ports": [
                {
                    "name": PORT_NAME,
                    "port": v1alpha1.POOLER_PORT,
                    "targetPort": PORT_NAME,
                }
            ],
        },
    }


def network_policy(
    cluster: v1alpha1.PostgresCluster, operator_namespace: str = meta.OPERATOR_NAMESPACE
) -> meta.Object:
    """PgBouncer's port to the clients ``spec.networkPolicy`` names (by default every pod
    of the namespace) and to the operator's namespace (the console), nothing else in."""
    clients = network.client_peers(cluster.spec.network_policy)
    port = network.ports([pooler.PORT])
    operator = {
        "namespaceSelector": {"matchLabels": {network.NAMESPACE_NAME_LABEL: operator_namespace}}
    }
    rules = [{"from": clients, "ports": port}] if clients else []
    rules.append({"from": [operator], "ports": port})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta.object_meta(cluster, cluster.pooler_name, component=COMPONENT),
        "spec": {
            "podSelector": {"matchLabels": selector_labels(cluster)},
            "policyTypes": ["Ingress"],
            "ingress": rules,
        },
    }


def children(
    cluster: v1alpha1.PostgresCluster, operator_namespace: str = meta.OPERATOR_NAMESPACE
) -> list[meta.Object]:
    """The pooler's objects, in apply order (none without ``spec.pooler``)."""
    if cluster.spec.pooler is None:
        return []
    objects = [config_map(cluster), service(cluster)]
    if cluster.spec.network_policy.enabled:
        objects.append(network_policy(cluster, operator_namespace))
    objects.append(deployment(cluster))
    return objects


KINDS: Final = ("ConfigMap", "Service", "NetworkPolicy", "Deployment")
"""What :func:`children` may make, all named ``NAME-pooler``: what removing the pooler
deletes."""
