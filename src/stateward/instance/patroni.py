"""The Patroni configuration of an instance, rendered from the PostgresCluster model.

Patroni supervises PostgreSQL in each instance pod and keeps its state in the Kubernetes
DCS (ConfigMaps mode: ``NAME-leader``, ``NAME-config``, ``NAME-sync``, ``NAME-failover``).
Everything static lives in the YAML rendered here (mounted from a ConfigMap whose hash rolls
the pods); per-pod values (name, namespace, IP) and credentials come from the environment,
so no secret is ever rendered into the file.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Final

import yaml

from stateward.api import v1alpha1, validation
from stateward.instance import pgbackrest, pooler

# --- the contract between Patroni and the operator's Services ---------------------------

ROLE_LABEL: Final = "stateward.io/role"
"""Pod label Patroni keeps current; the primary and replicas Services select on it."""
PRIMARY_ROLE: Final = "primary"
REPLICA_ROLE: Final = "replica"
SCOPE_LABEL: Final = "stateward.io/cluster"
"""Patroni adds ``{scope_label: scope}`` to its label selector; we make it our cluster label
(scope = cluster name), so Patroni needs no extra ``cluster-name`` label on the pods."""

SUPERUSER_USERNAME: Final = "postgres"
REPLICATION_USERNAME: Final = "replicator"
RESTAPI_USERNAME: Final = "stateward"
"""Patroni's REST API asks for it (HTTP basic, ``restapi.authentication``) on every request
that changes something: ``PATCH /config``, ``POST /switchover`` and ``/failover``,
``/restart``, ``/reload`` ... The password comes from the Secret ``NAME-patroni-api``
(:data:`CREDENTIALS_DIR`); members send it to each other, the operator reads it from the Secret.
Without it, any pod that reached :8008 could ``PATCH /config`` an ``archive_command``: a
shell on the primary. Reads (``/patroni``, ``/cluster``, the probes) stay open."""

# --- ports and paths inside the instance container --------------------------------------

POSTGRES_PORT: Final = 5432
RESTAPI_PORT: Final = 8008
CONFIG_DIR: Final = "/etc/patroni"
CONFIG_FILE_NAME: Final = "patroni.yaml"
CONFIG_FILE: Final = f"{CONFIG_DIR}/{CONFIG_FILE_NAME}"
DATA_MOUNT: Final = "/var/lib/postgresql/data"
DATA_DIR: Final = f"{DATA_MOUNT}/pgdata"
"""A subdirectory of the volume: initdb refuses a non-empty directory (lost+found)."""
SOCKET_DIR: Final = validation.SOCKET_DIR
TMP_DIR: Final = "/tmp"  # noqa: S108 - an emptyDir private to the container
PGPASS_FILE: Final = f"{TMP_DIR}/pgpass"
"""Patroni writes a pgpass file; the root filesystem is read-only, /tmp is an emptyDir."""

TLS_DIR: Final = validation.TLS_DIR
"""The cluster's ``NAME-tls`` Secret (``specs.tls``): read-only, root-owned, group-readable
by the postgres group (fsGroup), as PostgreSQL accepts a key file."""
TLS_CERT: Final = f"{TLS_DIR}/tls.crt"
TLS_KEY: Final = f"{TLS_DIR}/tls.key"
TLS_CA: Final = f"{TLS_DIR}/ca.crt"


def client_certificate(stem: str) -> tuple[str, str]:
    """The mounted client certificate and key of ``stem`` (``superuser``, ``replication``),
    which the operator issues beside the serving certificate (``specs.tls.CLIENTS``)."""
    return f"{TLS_DIR}/{stem}.crt", f"{TLS_DIR}/{stem}.key"


PEER_SSLMODE: Final = "verify-ca"
"""How members connect to each other (replication, base backups, pg_rewind): encrypted, and
the server's certificate signed by the cluster's CA. Not ``verify-full``: members address
each other by pod IP, which no certificate issued before the pod existed can name."""

CREDENTIALS_DIR: Final = "/etc/stateward/credentials"
"""The cluster's credential Secrets as files (a projected volume: memory-backed, read-only,
root-owned, readable by the postgres group): ``ROLE/username`` and ``ROLE/password`` for
each of :data:`CREDENTIALS`, and ``app/password``. Not environment variables: those every
child of Patroni (PostgreSQL, its archive_command, pgBackRest) would inherit, and
``/proc/PID/environ`` would show."""
CREDENTIALS: Final = {
    "superuser": ("postgresql", "authentication", "superuser"),
    "replication": ("postgresql", "authentication", "replication"),
    "restapi": ("restapi", "authentication"),
}
"""Each credential directory and where in Patroni's configuration its username and password
go (merged at start by ``stateward-instance run`` into :data:`RUNTIME_CONFIG_FILE`)."""
APP_PASSWORD_FILE: Final = f"{CREDENTIALS_DIR}/app/password"
RUNTIME_CONFIG_FILE: Final = f"{TMP_DIR}/patroni.yaml"
"""What Patroni runs with: :data:`CONFIG_FILE` plus the credentials, written by
``stateward-instance run`` with mode 0600 into the memory-backed /tmp."""
APP_DATABASE_ENV: Final = "STATEWARD_APP_DATABASE"
APP_OWNER_ENV: Final = "STATEWARD_APP_OWNER"
POST_BOOTSTRAP: Final = "stateward-instance post-bootstrap"
"""Patroni runs it once after initdb, with a superuser connection string appended."""

# --- failover timing ---------------------------------------------------------------------

TTL: Final = 20
"""Leader lock lifetime; Patroni refuses less than 20. Node-loss failover ~ TTL + LOOP_WAIT."""
LOOP_WAIT: Final = 2
"""Seconds between HA cycles: every cycle renews the lock, one API write per cluster."""
RETRY_TIMEOUT: Final = 5
"""DCS and PostgreSQL hiccups shorter than this do not demote the primary."""
PRIMARY_START_TIMEOUT: Final = 10
"""A crashed primary gets this long to come back before a failover (default 300 s)."""

# --- PostgreSQL parameters ---------------------------------------------------------------

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
    f"hostssl all {SUPERUSER_USERNAME} all cert",
    f"hostssl replication {REPLICATION_USERNAME} all cert",
    f"hostssl all {REPLICATION_USERNAME} all cert",
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
    f"hostnossl all {SUPERUSER_USERNAME} all reject",
    f"hostnossl all {REPLICATION_USERNAME} all reject",
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


def state_config_maps(scope: str) -> frozenset[str]:
    """The ConfigMaps Patroni keeps its cluster state in (ConfigMaps mode); status and
    history are annotations on ``SCOPE-leader`` and ``SCOPE-config``."""
    return frozenset(f"{scope}-{key}" for key in ("leader", "config", "failover", "sync"))


def bin_dir(major_version: int) -> str:
    """PostgreSQL binaries of one major version (Debian layout of the instance image)."""
    return f"/usr/lib/postgresql/{major_version}/bin"


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
    merged["archive_command"] = pgbackrest.archive_command(cluster)
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
        "ttl": TTL,
        "loop_wait": LOOP_WAIT,
        "retry_timeout": RETRY_TIMEOUT,
        "primary_start_timeout": PRIMARY_START_TIMEOUT,
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
            "scope_label": SCOPE_LABEL,
            "labels": dict(labels),
            "role_label": ROLE_LABEL,
            "leader_label_value": PRIMARY_ROLE,
            "follower_label_value": REPLICA_ROLE,
            # A standby cluster's leader serves the primary Service (read-only).
            "standby_leader_label_value": PRIMARY_ROLE,
        },
        "restapi": {
            # connect_address comes from PATRONI_RESTAPI_CONNECT_ADDRESS (the pod IP);
            # authentication from the mounted NAME-patroni-api Secret (``with_credentials``).
            "listen": f"0.0.0.0:{RESTAPI_PORT}",
            # HTTPS with the cluster's certificate; SIGHUP reloads a renewed one.
            "certfile": TLS_CERT,
            "keyfile": TLS_KEY,
        },
        # How members call each other's REST API (failsafe, the leader race, switchover
        # checks): by pod IP, so the chain is verified against the cluster's CA and the name
        # is not (Patroni: a client certificate plus ``insecure`` keeps verification on and
        # turns only the hostname check off).
        "ctl": {
            "insecure": True,
            "certfile": TLS_CERT,
            "keyfile": TLS_KEY,
            "cacert": TLS_CA,
        },
        "bootstrap": bootstrap_configuration(cluster),
        "postgresql": {
            # connect_address from PATRONI_POSTGRESQL_CONNECT_ADDRESS; credentials from the
            # mounted Secrets at start (``with_credentials``), never this ConfigMap.
            "listen": f"0.0.0.0:{POSTGRES_PORT}",
            "data_dir": DATA_DIR,
            "bin_dir": bin_dir(cluster.spec.major_version),
            "pgpass": PGPASS_FILE,
            "use_unix_socket": True,
            "pg_hba": pg_hba(cluster),
            # Merged with each user's name and password at start (``with_credentials``): every
            # connection a member makes to another is TLS, the server checked against the CA.
            "authentication": {
                user: {
                    "sslmode": PEER_SSLMODE,
                    "sslrootcert": TLS_CA,
                    "sslcert": client_certificate(user)[0],
                    "sslkey": client_certificate(user)[1],
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
        "post_bootstrap": POST_BOOTSTRAP,
    }
    command = pgbackrest.restore_command(cluster)
    if command is not None:
        document["method"] = RESTORE_METHOD
        document[RESTORE_METHOD] = {
            "command": command,
            "no_params": True,
            "keep_existing_recovery_conf": True,
        }
    return document


def render(cluster: v1alpha1.PostgresCluster, *, labels: Mapping[str, str]) -> str:
    """``patroni.yaml`` for the instances of ``cluster``; deterministic for one input."""
    return dump(configuration(cluster, labels=labels))


def dump(document: Mapping[str, Any]) -> str:
    """A :func:`configuration` document as ``patroni.yaml`` text."""
    # libyaml's emitter: rendering runs in every reconcile, and the pure-Python one was 90% of
    # a reconcile's CPU. Both emit the same text for this plain data.
    return yaml.dump(dict(document), Dumper=_DUMPER, sort_keys=False, default_flow_style=False)


_DUMPER: type[yaml.SafeDumper] = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def with_credentials(
    document: Mapping[str, Any], credentials: Mapping[str, tuple[str, str]]
) -> dict[str, Any]:
    """``document`` (Patroni's configuration) with each of :data:`CREDENTIALS`' username and
    password, ``credentials[name] = (username, password)``, at its place; a deep copy."""
    merged: dict[str, Any] = copy.deepcopy(dict(document))
    for name, path in CREDENTIALS.items():
        username, password = credentials[name]
        node = merged
        for key in path:
            if not isinstance(node.get(key), dict):
                node[key] = {}
            node = node[key]
        node.update({"username": username, "password": password})
    return merged
