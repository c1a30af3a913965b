"""Patroni in the instance pod: the contract between the pod, Patroni and the operator.

Patroni supervises PostgreSQL in each instance pod and keeps its state in the Kubernetes
DCS (ConfigMaps mode: ``NAME-leader``, ``NAME-config``, ``NAME-sync``, ``NAME-failover``).
This module holds what both sides must agree on — labels, usernames, ports, paths, the
credential files, the failover timing — and the few helpers the pod uses to run Patroni
(``dump``, ``with_credentials``). What the configuration says for a given PostgresCluster is
built by the operator (``specs.postgres.config``), rendered into a ConfigMap whose hash rolls the
pods; per-pod values (name, namespace, IP) and credentials come from the environment and
the mounted Secrets, so no secret is ever rendered into the file. It imports no API type:
the pods run on what the ConfigMap says, not on the PostgresCluster model.
"""

from __future__ import annotations

import copy
import shlex
from collections.abc import Mapping
from typing import Any, Final

import yaml

from stateward.instance import localsql

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
SOCKET_DIR: Final = localsql.SOCKET_DIR
"""Where PostgreSQL puts its Unix socket (an emptyDir private to the container)."""
TMP_DIR: Final = "/tmp"  # noqa: S108 - an emptyDir private to the container
PGPASS_FILE: Final = f"{TMP_DIR}/pgpass"
"""Patroni writes a pgpass file; the root filesystem is read-only, /tmp is an emptyDir."""

TLS_DIR: Final = "/etc/stateward/tls"
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

STANDBY_ACK_TIMEOUT_MS: Final = 1000
"""How long a primary's walsender waits for the TCP acknowledgement of WAL it sent to a
standby before it drops the connection (``tcp_user_timeout`` of the walsender's socket). A
standby whose node lost power or its network acknowledges nothing, and every commit waits for
it while it is a synchronous standby; this ends the wait after 1 s of unacknowledged data
instead of ``wal_sender_timeout`` (5 s), and Patroni names another standby in its next loop.
A live standby's kernel acknowledges within milliseconds however busy its process is; only a
standby that stops reading for this long while its receive buffer is full (megabytes behind)
is dropped, and it reconnects. A hung (frozen) node's kernel still acknowledges: that case
keeps ``wal_sender_timeout``."""
POSTGRES_WRAPPER: Final = f"{TMP_DIR}/stateward-postgres"
"""What Patroni starts as ``postgres`` (``postgresql.bin_name.postgres``): the image's
``postgres`` with :data:`STANDBY_ACK_TIMEOUT_MS` in ``PGOPTIONS``."""

# --- running Patroni ---------------------------------------------------------------------


def state_config_maps(scope: str) -> frozenset[str]:
    """The ConfigMaps Patroni keeps its cluster state in (ConfigMaps mode); status and
    history are annotations on ``SCOPE-leader`` and ``SCOPE-config``."""
    return frozenset(f"{scope}-{key}" for key in ("leader", "config", "failover", "sync"))


def bin_dir(major_version: int) -> str:
    """PostgreSQL binaries of one major version (Debian layout of the instance image)."""
    return f"/usr/lib/postgresql/{major_version}/bin"


def dump(document: Mapping[str, Any]) -> str:
    """A configuration document (``specs.postgres.config.configuration``) as ``patroni.yaml``
    text."""
    # libyaml's emitter: rendering runs in every reconcile, and the pure-Python one was 90% of
    # a reconcile's CPU. Both emit the same text for this plain data.
    return yaml.dump(dict(document), Dumper=_DUMPER, sort_keys=False, default_flow_style=False)


_DUMPER: type[yaml.SafeDumper] = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def postgres_wrapper(postgres: str, ack_timeout_ms: int = STANDBY_ACK_TIMEOUT_MS) -> str:
    """The script Patroni runs as ``postgres``: ``postgres`` itself (``exec``, so the pid
    Patroni records is the postmaster's), with ``tcp_user_timeout`` put in ``PGOPTIONS``.

    A standby's WAL receiver is a child of the postmaster and connects with libpq, which sends
    ``PGOPTIONS`` to the primary in the startup packet; a physical walsender applies only those
    options (not the role's settings, and Patroni's ``primary_conninfo`` takes no ``options``).
    So only connections this server's processes open to other servers carry the timeout: not
    Patroni's base backups and ``pg_rewind`` (a full disk buffer for a second must not end a
    copy of hours) and not the server's own clients. A ``PGOPTIONS`` of the pod comes after,
    and so wins."""
    options = f"-c tcp_user_timeout={ack_timeout_ms}"
    return (
        "#!/bin/sh\n"
        "# Written by stateward-instance run; see stateward.instance.patroni.postgres_wrapper.\n"
        f'PGOPTIONS="{options}${{PGOPTIONS:+ $PGOPTIONS}}"\n'
        "export PGOPTIONS\n"
        f'exec {shlex.quote(postgres)} "$@"\n'
    )


def with_postgres_wrapper(document: Mapping[str, Any], wrapper: str) -> dict[str, Any]:
    """``document`` with Patroni told to start ``wrapper`` as ``postgres`` (an absolute
    ``bin_name`` replaces ``bin_dir``'s, as Patroni joins the two paths); a deep copy."""
    merged: dict[str, Any] = copy.deepcopy(dict(document))
    postgresql = merged.setdefault("postgresql", {})
    postgresql["bin_name"] = {**(postgresql.get("bin_name") or {}), "postgres": wrapper}
    return merged


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
