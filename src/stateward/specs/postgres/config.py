"""Patroni's configuration for a PostgresCluster, and the ConfigMap that carries it.

* ``patroni.yaml`` (:func:`configuration`, :func:`render`): how each instance runs Patroni
  and PostgreSQL, ``pg_hba`` and the parameters included; the text goes into the
  ``NAME-patroni`` ConfigMap and its hash into the pod template, so a change rolls the pods.
* The cluster-wide settings the operator keeps in Patroni's DCS (:func:`dynamic_configuration`,
  :func:`ha_settings`, :func:`synchronous_settings`): ``controllers.postgres.dataplane``
  sends them to Patroni's REST API, since Patroni reads ``bootstrap.dcs`` only once.

Pure: a cluster in, a document out. The names, ports and paths it writes are the pod's
(``instance.patroni``), so the pods need no API type to run on it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any, Final

from stateward.api import v1alpha1, validation
from stateward.instance import patroni, pooler
from stateward.specs import meta
from stateward.specs.postgres import backup

MAX_WAL_SENDERS: Final = int(validation.OPERATOR_PARAMETERS["max_wal_senders"])


OPERATOR_PARAMETERS: Final = validation.OPERATOR_PARAMETERS
"""Parameters the operator sets; applied after the user's, so they always win. Defined in the
API layer, where admission refuses them, so the two can never disagree."""


PATRONI_OWNED_PARAMETERS: Final = validation.PATRONI_OWNED_PARAMETERS
"""Parameters Patroni sets from its own configuration; a user value is dropped."""


PG_HBA: Final = (
    # The socket lives in a pod-private emptyDir: only processes of the instance container,
    # which already hold the superuser password, can reach it.
    "local all all trust",
    # Over the network only TLS: a connection without it is refused before authentication.
    "hostnossl all all all reject",
    # The superuser (pg_rewind, Patroni's checks of the leader) and the replication role
    # (streaming, base backups) log in over the network only with the client certificate
    # the cluster's CA issued for them (CN = the role), which only the instances hold: their
    # passwords alone open nothing from another pod.
    f"hostssl all {patroni.SUPERUSER_USERNAME} all cert",
    f"hostssl replication {patroni.REPLICATION_USERNAME} all cert",
    f"hostssl all {patroni.REPLICATION_USERNAME} all cert",
    # PgBouncer's own role (its auth_query), likewise: only the pooler pods hold its
    # certificate, and the role has no password.
    f"hostssl all {pooler.ROLE} all cert",
    # Nobody else streams WAL or takes base backups over the network.
    "hostssl replication all all reject",
    "hostssl all all all scram-sha-256",
)


PLAINTEXT_CLIENTS_HBA: Final = (
    # spec.tls.allowPlaintextClients: the application's logins by password without TLS too;
    # never the roles that log in by certificate, never replication.
    f"hostnossl all {patroni.SUPERUSER_USERNAME} all reject",
    f"hostnossl all {patroni.REPLICATION_USERNAME} all reject",
    f"hostnossl all {pooler.ROLE} all reject",
    "hostnossl replication all all reject",
    "hostnossl all all all scram-sha-256",
)


def pg_hba(cluster: v1alpha1.PostgresCluster) -> list[str]:
    """``PG_HBA``; with ``spec.tls.allowPlaintextClients`` its refusal of every connection
    without TLS becomes ``PLAINTEXT_CLIENTS_HBA``."""
    if not cluster.spec.tls.allow_plaintext_clients:
        return list(PG_HBA)
    refusal = PG_HBA.index("hostnossl all all all reject")
    return [*PG_HBA[:refusal], *PLAINTEXT_CLIENTS_HBA, *PG_HBA[refusal + 1 :]]


def parameters(cluster: v1alpha1.PostgresCluster) -> dict[str, str]:
    """The operator's defaults, overridden by the user's parameters, overridden by the
    operator's fixed ones; sorted by name.

    Names compare case-insensitively, as PostgreSQL's do: ``WAL_LEVEL`` cannot slip past.
    """
    user = {name.lower() for name in cluster.spec.postgresql.parameters}
    merged = {k: v for k, v in validation.DEFAULT_PARAMETERS.items() if k not in user}
    merged |= {
        name: value
        for name, value in cluster.spec.postgresql.parameters.items()
        if name.lower() not in PATRONI_OWNED_PARAMETERS | OPERATOR_PARAMETERS.keys()
    }
    merged.update(OPERATOR_PARAMETERS)
    merged["archive_command"] = backup.archive_command(cluster)
    return dict(sorted(merged.items()))


QUORUM_MODE: Final = "quorum"
"""Patroni's ``synchronous_mode`` for quorum commit (``ANY n (...)``, Patroni 4.0 and later)."""


SYNCHRONOUS_DEFAULTS: Final = {
    "synchronous_mode": False,
    "synchronous_mode_strict": False,
    "synchronous_node_count": 1,
}
"""Patroni's own defaults for the synchronous settings, for a configuration that omits them."""


FAILSAFE_MODE: Final = True
"""Patroni's failsafe mode: while the API server (its DCS) is unreachable, the primary keeps
running as long as every member answers its REST API, instead of demoting itself after
``retry_timeout``. A Kubernetes control-plane outage then costs no writes; a primary cut
off from its members still demotes (it cannot reach them either)."""


HA_DEFAULTS: Final = {**SYNCHRONOUS_DEFAULTS, "failsafe_mode": False}
"""Patroni's defaults for every setting :func:`ha_settings` manages."""


def synchronous_settings(cluster: v1alpha1.PostgresCluster) -> dict[str, Any]:
    """Patroni's synchronous replication settings for ``spec.synchronous``.

    Patroni, not the operator, picks the standbys and writes ``synchronous_standby_names``;
    it only promotes a standby that was synchronous (with ``quorum``: that enough of the
    others confirm is the most advanced), so an acknowledged commit survives.
    """
    sync = cluster.spec.synchronous
    enabled: bool | str = sync.mode != v1alpha1.SynchronousMode.OFF
    if enabled and sync.method == v1alpha1.SynchronousMethod.QUORUM:
        enabled = QUORUM_MODE
    return {
        "synchronous_mode": enabled,
        "synchronous_mode_strict": sync.mode == v1alpha1.SynchronousMode.REQUIRED,
        "synchronous_node_count": sync.number,
    }


def ha_settings(cluster: v1alpha1.PostgresCluster) -> dict[str, Any]:
    """The cluster-wide Patroni settings the operator keeps: synchronous replication and
    failsafe mode (parameters aside)."""
    return {**synchronous_settings(cluster), "failsafe_mode": FAILSAFE_MODE}


def dynamic_configuration(cluster: v1alpha1.PostgresCluster) -> dict[str, Any]:
    """Patroni's cluster-wide (DCS) configuration.

    Rendered into ``bootstrap.dcs``, which Patroni reads only when it initializes the
    cluster. Later changes (parameters such as max_connections must be equal on every member
    and are ignored in the local file) take effect when this document is sent to Patroni's
    ``PATCH /config``.
    """
    return {
        "ttl": patroni.TTL,
        "loop_wait": patroni.LOOP_WAIT,
        "retry_timeout": patroni.RETRY_TIMEOUT,
        "primary_start_timeout": patroni.PRIMARY_START_TIMEOUT,
        **ha_settings(cluster),
        "postgresql": {
            "use_pg_rewind": True,
            "use_slots": True,
            "parameters": parameters(cluster),
        },
    }


def configuration(
    cluster: v1alpha1.PostgresCluster,
    *,
    labels: Mapping[str, str],
) -> dict[str, Any]:
    """The whole Patroni configuration as a document.

    ``labels`` are the instance pods' selector labels: Patroni lists its members with them
    and puts them on the ConfigMaps it creates.
    """
    return {
        "scope": cluster.name,
        "kubernetes": {
            # ConfigMaps mode: Endpoints are deprecated upstream.
            "use_endpoints": False,
            "scope_label": patroni.SCOPE_LABEL,
            "labels": dict(labels),
            "role_label": patroni.ROLE_LABEL,
            "leader_label_value": patroni.PRIMARY_ROLE,
            "follower_label_value": patroni.REPLICA_ROLE,
            # A standby cluster's leader serves the primary Service (read-only).
            "standby_leader_label_value": patroni.PRIMARY_ROLE,
        },
        "restapi": {
            # connect_address comes from PATRONI_RESTAPI_CONNECT_ADDRESS (the pod IP);
            # authentication from the mounted NAME-patroni-api Secret (``with_credentials``).
            "listen": f"0.0.0.0:{patroni.RESTAPI_PORT}",
            # HTTPS with the cluster's certificate; SIGHUP reloads a renewed one.
            "certfile": patroni.TLS_CERT,
            "keyfile": patroni.TLS_KEY,
        },
        # How members call each other's REST API (failsafe, the leader race, switchover
        # checks): by pod IP, so the chain is verified against the cluster's CA and the name
        # is not (Patroni: a client certificate plus ``insecure`` keeps verification on and
        # turns only the hostname check off).
        "ctl": {
            "insecure": True,
            "certfile": patroni.TLS_CERT,
            "keyfile": patroni.TLS_KEY,
            "cacert": patroni.TLS_CA,
        },
        "bootstrap": bootstrap_configuration(cluster),
        "postgresql": {
            # connect_address from PATRONI_POSTGRESQL_CONNECT_ADDRESS; credentials from the
            # mounted Secrets at start (``with_credentials``), never this ConfigMap.
            "listen": f"0.0.0.0:{patroni.POSTGRES_PORT}",
            "data_dir": patroni.DATA_DIR,
            "bin_dir": patroni.bin_dir(cluster.spec.major_version),
            "pgpass": patroni.PGPASS_FILE,
            "use_unix_socket": True,
            "pg_hba": pg_hba(cluster),
            # Merged with each user's name and password at start (``with_credentials``): every
            # connection a member makes to another is TLS, the server checked against the CA.
            "authentication": {
                user: {
                    "sslmode": patroni.PEER_SSLMODE,
                    "sslrootcert": patroni.TLS_CA,
                    "sslcert": patroni.client_certificate(user)[0],
                    "sslkey": patroni.client_certificate(user)[1],
                }
                for user in ("superuser", "replication")
            },
            # A new replica copies the primary with pg_basebackup, which by default waits
            # for a *spread* checkpoint: 95 s measured for an empty database. Fast makes it
            # seconds; the checkpoint's I/O burst is small next to the copy itself.
            "basebackup": [{"checkpoint": "fast"}],
        },
        # Pods have no /dev/watchdog; "automatic" would only log that on every start.
        "watchdog": {"mode": "off"},
    }


RESTORE_METHOD: Final = "pgbackrest"


def bootstrap_configuration(cluster: v1alpha1.PostgresCluster) -> dict[str, Any]:
    """How the first instance initializes the cluster: initdb, or with
    ``spec.bootstrap.restore`` a pgBackRest restore (Patroni's custom bootstrap: it runs the
    command, starts PostgreSQL on what pgBackRest wrote, recovery settings included, and
    waits for the promotion at the end of recovery). Either way the post-bootstrap hook then
    makes the application role and database, or gives the restored ones this cluster's
    password."""
    document: dict[str, Any] = {
        "dcs": dynamic_configuration(cluster),
        "initdb": [{"encoding": "UTF8"}, "data-checksums"],
        "post_bootstrap": patroni.POST_BOOTSTRAP,
    }
    command = backup.restore_command(cluster)
    if command is not None:
        document["method"] = RESTORE_METHOD
        document[RESTORE_METHOD] = {
            "command": command,
            "no_params": True,
            "keep_existing_recovery_conf": True,
        }
    return document


# --- the ConfigMap ------------------------------------------------------------------------

HASH_LENGTH = 16


@dataclasses.dataclass(frozen=True)
class PatroniConfig:
    """``patroni.yaml`` for one cluster, built once per reconcile and passed along: the text
    goes into the ConfigMap, the hash into the pod template."""

    text: str
    hash: str


def patroni_config(cluster: v1alpha1.PostgresCluster) -> PatroniConfig:
    """The instances' Patroni configuration (members listed by the instance selector labels),
    from one :func:`configuration` document."""
    document = configuration(cluster, labels=meta.selector_labels(cluster))
    return PatroniConfig(text=patroni.dump(document), hash=_hash(document))


def render(cluster: v1alpha1.PostgresCluster, *, labels: Mapping[str, str] | None = None) -> str:
    """``patroni.yaml``, with Patroni listing its members by ``labels`` (the instance selector
    labels unless given); deterministic for one input."""
    selector = meta.selector_labels(cluster) if labels is None else labels
    return patroni.dump(configuration(cluster, labels=selector))


def config_map(cluster: v1alpha1.PostgresCluster, *, patroni_yaml: str) -> meta.Object:
    """``patroni_yaml`` is :attr:`PatroniConfig.text` of :func:`patroni_config`."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        # No component label: Patroni lists ConfigMaps by the instance selector labels and
        # must not see (or ever delete) this one.
        "metadata": meta.object_meta(cluster, cluster.patroni_config_map_name),
        "data": {patroni.CONFIG_FILE_NAME: patroni_yaml},
    }


def config_hash(cluster: v1alpha1.PostgresCluster) -> str:
    """:attr:`PatroniConfig.hash` of :func:`patroni_config`."""
    return patroni_config(cluster).hash


def _hash(document: Mapping[str, Any]) -> str:
    """Short sha256 of the configuration a running instance reads, for the pod template
    annotation: a change rolls the pods. ``bootstrap.dcs`` (the PostgreSQL parameters among
    it) is left out: Patroni reads it only to initialize a new cluster, and the operator
    applies later changes through Patroni's ``PATCH /config`` without restarting anything."""
    bootstrap = {k: v for k, v in document["bootstrap"].items() if k != "dcs"}
    canonical = json.dumps(
        {**document, "bootstrap": bootstrap}, sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(canonical.encode()).hexdigest()[:HASH_LENGTH]


def fencing_config_map(cluster: v1alpha1.PostgresCluster, instances: list[str]) -> meta.Object:
    """The fenced instances of ``cluster`` (a JSON list, ``["*"]`` for all), watched by each
    instance pod's supervisor: listed, its PostgreSQL stops and the pod stays."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        # No component label, like NAME-patroni: Patroni's selector must not list it.
        "metadata": meta.object_meta(cluster, cluster.fencing_config_map_name),
        "data": {"instances": json.dumps(sorted(instances))},
    }
