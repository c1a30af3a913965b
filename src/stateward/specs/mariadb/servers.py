"""The children of a MySQL or MariaDB Database: a StatefulSet of servers, three Services, the
server configuration, the credentials. Pure: the model in, the objects out.

Every server starts read-only with binary logging and GTIDs on; the operator chooses the
primary, makes it writable and points the others at it (``controllers.mariadb``), and labels
the pods by role so the ``-primary`` and ``-replicas`` Services follow. A server that comes
back after losing its role (the old primary of a failover) is therefore never writable until
the operator says so.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Final

from stateward.api import v1alpha1
from stateward.specs import meta, network, pods, tls

PORT: Final = 3306
PORT_NAME: Final = "mysql"
CLONE_PORT: Final = 3307
"""MariaDB: where the primary streams a copy of its data (mariadb-backup) to new replicas,
over TLS to a client that shows a certificate of the Database's CA; on no Service."""
CONTAINER: Final = "database"
DATA_VOLUME: Final = "data"
CONFIG_VOLUME: Final = "config"
RUN_VOLUME: Final = "run"
TMP_VOLUME: Final = "tmp"
CONFIG_DIR: Final = "/etc/stateward"
TLS_VOLUME: Final = "tls"
TLS_DIR: Final = "/etc/stateward/tls"
CREDENTIALS_VOLUME: Final = "credentials"
CREDENTIALS_DIR: Final = "/etc/stateward/credentials"
"""The passwords as files (``_credentials_volume``); the scripts read them from here."""
"""MariaDB: the serving certificate, the CA and the replication client certificate
(``NAME-tls``, issued by the operator)."""
DATA_MOUNT: Final = "/var/lib/mysql"
RUN_DIR: Final = "/run/mysqld"
SOCKET: Final = f"{RUN_DIR}/mysqld.sock"
UID: Final = 999
"""The mysql user of both images (Debian's mariadb-server, the official MySQL image)."""
REPLICATION_USER: Final = "replicator"
APP_USER: Final = "app"
APP_DATABASE: Final = "app"
ROOT_PASSWORD_KEY: Final = "root-password"  # noqa: S105 - key names
REPLICATION_PASSWORD_KEY: Final = "replication-password"  # noqa: S105
APP_PASSWORD_KEY: Final = "password"  # noqa: S105
TERMINATION_GRACE_PERIOD_SECONDS: Final = 60
"""A clean shutdown flushes InnoDB; killed sooner, the server only runs crash recovery."""


def selector_labels(database: v1alpha1.Database) -> dict[str, str]:
    """The server pods of ``database`` and nothing else (immutable in the StatefulSet)."""
    return {
        meta.NAME_LABEL: database.spec.engine.value,
        meta.CLUSTER_LABEL: database.name,
        meta.COMPONENT_LABEL: meta.INSTANCE_COMPONENT,
    }


def _meta(database: v1alpha1.Database, name: str, *, component: str | None = None) -> meta.Object:
    return meta.object_meta(database, name, component=component, app=database.spec.engine.value)


# --- configuration ----------------------------------------------------------------------------

_COMMON = """\
bind-address = 0.0.0.0
port = {port}
socket = {socket}
skip-name-resolve
# Every server starts read-only: only the operator makes the primary writable.
read-only = ON
log-bin = binlog
binlog-format = ROW
max-connections = 200
innodb-buffer-pool-size = 128M
"""

SEMI_SYNC_TIMEOUT_MS: Final = 2**32 - 1
"""How long a MariaDB primary waits for a replica to acknowledge a commit: effectively
forever, so semi-synchronous replication never silently turns asynchronous."""

MARIADB_CONFIG = (
    "[mariadbd]\n"
    + _COMMON
    + f"""\
# TLS 1.3 only, and no connection over TCP without it (the socket stays open to root).
ssl-ca = {TLS_DIR}/client-ca.crt
ssl-cert = {TLS_DIR}/tls.crt
ssl-key = {TLS_DIR}/tls.key
tls-version = TLSv1.3
require-secure-transport = ON
log-slave-updates = ON
gtid-strict-mode = ON
# Semi-synchronous replication: a commit is acknowledged after a replica has it (received
# before the commit returns: AFTER_SYNC), so losing the primary loses no acknowledged write.
# The operator turns the waiting side on on the primary only, and only while the Database
# has replicas (a replica's applier would wait for acknowledgements nobody sends). The wait
# never gives up (about 49 days): a timeout would fall back to asynchronous replication, and
# a primary that acknowledged writes no replica had could lose them in a failover.
rpl-semi-sync-master-enabled = OFF
rpl-semi-sync-slave-enabled = ON
rpl-semi-sync-master-wait-point = AFTER_SYNC
rpl-semi-sync-master-timeout = {SEMI_SYNC_TIMEOUT_MS}
"""
)
MYSQL_CONFIG = (
    "[mysqld]\n"
    + _COMMON
    + """\
super-read-only = ON
gtid-mode = ON
enforce-gtid-consistency = ON
log-replica-updates = ON
skip-replica-start = ON
"""
)

METRICS_PORT: Final = 9104
"""mysqld_exporter's port, which dashboards and scrape configs expect."""
METRICS_PORT_NAME: Final = "metrics"
EXPORTER_USERNAME: Final = "stateward_exporter"
"""Each MariaDB server's own monitoring account (socket only, out of the binary log)."""
HAS_DATA_KEY: Final = "has-data"
"""The MariaDB ConfigMap's mark (``true``) that the Database has had a primary, so has data:
a new server then only ever copies the primary's data and never initializes an empty data
directory (``fill`` in the entrypoint). Set by the operator, never removed; outside the
configuration hash, so setting it rolls no server."""

MARIADB_ENTRYPOINT = """\
#!/bin/bash
# An empty data directory is filled once: with a copy of the primary's data (mariadb-backup,
# streamed from the primary, started at the copy's GTID position) when the Database has a
# primary; else, and only while the Database has never had one (no has-data mark in its
# ConfigMap), initialized empty (users and the application database, kept out of the binary
# log: every server of a new Database makes its own). A Database that has data waits for its
# primary, however long: never an empty server beside its data. Then the server runs
# read-only (the operator chooses the primary) with a server id from the pod's ordinal, and
# serves copies of its data to new replicas on the clone port.
set -euo pipefail
# The credentials are files (never the container's environment, which mariadbd and every
# child would carry): read into variables this script does not export.
ROOT_PASSWORD=$(< /etc/stateward/credentials/root-password)
REPLICATION_PASSWORD=$(< /etc/stateward/credentials/replication-password)
APP_PASSWORD=$(< /etc/stateward/credentials/app-password)
ordinal="${HOSTNAME##*-}"
datadir=/var/lib/mysql/data
config=/etc/stateward/my.cnf
local_socket=/run/mysqld/init.sock
tls=/etc/stateward/tls
has_data_mark=/etc/stateward/{has_data}
# The clone stream's TLS: each side shows its certificate and checks the other's chain.
server_tls="cert=$tls/tls.crt,key=$tls/tls.key,cafile=$tls/client-ca.crt,verify=1"
# connect-timeout: a peer whose packets are dropped (a partition, a policy not yet admitting
# this pod) is given up on in seconds, not after TCP's two minutes of retries.
client_tls="cert=$tls/replication.crt,key=$tls/replication.key,cafile=$tls/ca.crt,verify=1"
client_tls="$client_tls,connect-timeout=5"

watch_certificate() {  # the kubelet swaps in a renewed certificate: the server reloads it
  local seen now
  seen=$(cksum "$tls/tls.crt" "$tls/ca.crt" "$tls/client-ca.crt" 2>/dev/null || true)
  while sleep 30; do
    now=$(cksum "$tls/tls.crt" "$tls/ca.crt" "$tls/client-ca.crt" 2>/dev/null) || continue
    [ "$now" = "$seen" ] && continue
    MYSQL_PWD="${ROOT_PASSWORD}" mariadb --socket=/run/mysqld/mysqld.sock --user=root \\
      -e 'FLUSH SSL' && seen=$now && echo "reloaded the renewed certificate" >&2
  done
}

serve_metrics() {  # Prometheus metrics on ${METRICS_PORT}: mysqld_exporter on the socket
  # Its account is this server's own (out of the binary log), with monitoring privileges
  # only, and a new random password at every start in a file only this container reads: no
  # Secret to keep, and the exporter never logs in as root.
  local cnf=/tmp/exporter.cnf password
  until MYSQL_PWD="${ROOT_PASSWORD}" mariadb-admin --socket=/run/mysqld/mysqld.sock \\
      --user=root ping >/dev/null 2>&1; do
    sleep 1
  done
  password=$(head -c 32 /dev/urandom | base64 | tr -dc 'A-Za-z0-9')
  MYSQL_PWD="${ROOT_PASSWORD}" mariadb --socket=/run/mysqld/mysqld.sock --user=root <<SQL \\
    || { echo "metrics: the exporter's account was not made" >&2; return; }
SET sql_log_bin = 0;
CREATE USER IF NOT EXISTS '{exporter}'@'localhost' WITH MAX_USER_CONNECTIONS 3;
ALTER USER '{exporter}'@'localhost' IDENTIFIED BY '${password}';
GRANT PROCESS, REPLICATION CLIENT, SLAVE MONITOR ON *.* TO '{exporter}'@'localhost';
SQL
  (umask 077 && printf '[client]\\nuser={exporter}\\npassword=%s\\nsocket=%s\\n' \\
    "$password" /run/mysqld/mysqld.sock > "$cnf")
  while true; do  # the database matters more than its metrics: restarted, never fatal
    prometheus-mysqld-exporter --config.my-cnf="$cnf" \\
      --web.listen-address=":${METRICS_PORT}" --log.level=warn || true
    sleep 2
  done
}

start_local() {  # the server on a socket only, no network, no binary log
  mariadbd --defaults-file="$config" --datadir="$1" --skip-networking --skip-log-bin \\
    --socket="$local_socket" &
  server=$!
  until mariadb-admin --socket="$local_socket" ping >/dev/null 2>&1; do
    kill -0 "$server" || exit 1  # the server died: fail, the kubelet restarts the container
    sleep 0.5
  done
}

initialize() {
  mariadb-install-db --defaults-file="$config" --datadir="$datadir" \\
    --auth-root-authentication-method=normal --skip-test-db --skip-name-resolve --force
  start_local "$datadir"
  mariadb --socket="$local_socket" --user=root <<SQL
SET sql_log_bin = 0;
-- mariadb-install-db also made root@127.0.0.1, @::1 and @HOSTNAME without a password:
-- root logs in on the socket only (the operator has its own account, users.sql).
DELETE FROM mysql.global_priv WHERE User = 'root' AND Host <> 'localhost';
FLUSH PRIVILEGES;
ALTER USER 'root'@'localhost' IDENTIFIED BY '${ROOT_PASSWORD}';
CREATE USER 'replicator'@'%' IDENTIFIED BY '${REPLICATION_PASSWORD}';
GRANT REPLICATION SLAVE, REPLICATION CLIENT, SLAVE MONITOR ON *.* TO 'replicator'@'%';
CREATE DATABASE app;
CREATE USER 'app'@'%' IDENTIFIED BY '${APP_PASSWORD}';
GRANT ALL ON app.* TO 'app'@'%';
SHUTDOWN;
SQL
  wait "$server"
}

fail() {  # inside clone, which runs left of ||, where errexit does not apply
  echo "clone: $1; exiting to be retried" >&2
  exit 1
}

clone() {  # 1: no primary to copy from; other failures exit (the kubelet retries)
  # The primary is whichever server of the Database says so: each is asked by its address,
  # over TLS, showing the replication certificate, and must show a certificate of the
  # Database's CA for the primary Service's name. No primary: 1 (fill decides what then).
  # A primary whose copy fails: exit and be retried, never start empty beside its data.
  local peer role found=""
  for peer in $(getent ahostsv4 "${PEERS_HOST}" | awk '{print $1}' | sort -u); do
    role=$(printf '%s\\nrole\\n' "${REPLICATION_PASSWORD}" | socat -t 30 - \\
      "OPENSSL:${peer}:${CLONE_PORT},${client_tls},commonname=${PRIMARY_NAME}" 2>/dev/null) \\
      || true  # socat's status says little (an unclean TLS end): the answer decides
    if [ "$role" = primary ]; then found=$peer; break; fi
  done
  [ -n "$found" ] || return 1
  rm -rf "$datadir.clone" && mkdir -p "$datadir.clone"
  printf '%s\\ncopy\\n' "${REPLICATION_PASSWORD}" | socat -t 120 - \\
    "OPENSSL:${found}:${CLONE_PORT},${client_tls},commonname=${PRIMARY_NAME}" \\
    | mbstream --extract --directory="$datadir.clone" || true  # judged by what arrived:
  # its binary log position, written last (mariadb-backup 10.11 still names it xtrabackup_*),
  # and a prepare that checks every page.
  info=$(ls "$datadir.clone"/*_binlog_info 2>/dev/null | head -n 1)
  [ -n "$info" ] || fail "no copy came from ${found}"
  mariabackup --prepare --target-dir="$datadir.clone" || fail "the copy did not prepare"
  gtid=$(awk '{print $3}' "$info")
  start_local "$datadir.clone"
  MYSQL_PWD="${ROOT_PASSWORD}" mariadb --socket="$local_socket" --user=root <<SQL
SET GLOBAL gtid_slave_pos = '${gtid}';
SHUTDOWN;
SQL
  [ $? = 0 ] || fail "the copy's GTID position was not set"
  wait "$server" || fail "the copy's server did not stop cleanly"
  mv "$datadir.clone" "$datadir" || fail "the copy could not be moved into place"
  echo "cloned from ${found} at GTID ${gtid:-(empty)}" >&2
}

fill() {  # an empty data directory: a copy of the primary's data, or new only in a new Database
  local waited=0
  until clone; do
    if [ "$(cat "$has_data_mark" 2>/dev/null)" != true ]; then
      initialize
      return
    fi
    # The Database has data (the operator marked it when it first had a primary): a server
    # started empty here would be a second, empty history beside it. Ask again until the
    # primary answers (a failover in progress, a partition, a policy not yet admitting us).
    if [ $((waited % 60)) = 0 ]; then
      echo "clone: the Database has data and no primary answered on port ${CLONE_PORT} after" \\
        "${waited} s; waiting for one (this server never starts empty beside the data)" >&2
    fi
    sleep 5
    waited=$((waited + 5))
  done
}

if [ ! -d "$datadir/mysql" ]; then
  fill
fi
# -t 60: the client has sent everything (EOF) before this side answers; socat's default
# 0.5 s of silence after that would end the connection before mariadb-backup starts.
socat -t 60 "OPENSSL-LISTEN:${CLONE_PORT},reuseaddr,fork,${server_tls}" \\
  EXEC:"bash /etc/stateward/serve-clone.sh" &
watch_certificate &
serve_metrics &
exec mariadbd --defaults-file="$config" --datadir="$datadir" --server-id=$((ordinal + 1)) \\
  --init-file=/etc/stateward/users.sql
""".replace("{exporter}", EXPORTER_USERNAME).replace("{has_data}", HAS_DATA_KEY)

MARIADB_SERVE_CLONE = """\
#!/bin/bash
# Over TLS to a client that showed a certificate of the Database's CA (socat checked it) and
# then sends the replication password and a request, one line each: "role" (is this server
# the primary?) or "copy" (one copy of its data, streamed by mariadb-backup). Only the
# primary copies: a new server must start from the primary's data, never a lagging or
# diverged replica's.
read -r -t 5 token || exit 1
[ "$token" = "$(< /etc/stateward/credentials/replication-password)" ] \
  || { echo "clone: wrong password" >&2; exit 1; }
read -r -t 5 request || exit 1
MYSQL_PWD=$(< /etc/stateward/credentials/root-password)
export MYSQL_PWD  # for the local client below only
read_only=$(mariadb --socket=/run/mysqld/mysqld.sock --user=root --batch --skip-column-names \\
  -e 'SELECT @@read_only') || exit 1
if [ "$request" = role ]; then
  if [ "$read_only" = 0 ]; then echo primary; else echo replica; fi
  exit 0
fi
[ "$request" = copy ] && [ "$read_only" = 0 ] || exit 1
work=$(mktemp -d)  # copies for two new servers at once must not share their files
exec mariabackup --backup --stream=xbstream --user=root --socket=/run/mysqld/mysqld.sock \\
  --target-dir="$work" 2>>/tmp/clone.log
"""

MARIADB_USERS = """\
SET sql_log_bin = 0;
CREATE USER IF NOT EXISTS '{operator}'@'%' REQUIRE SUBJECT '/CN={operator}';
GRANT ALL ON *.* TO '{operator}'@'%' WITH GRANT OPTION;
DROP USER IF EXISTS 'root'@'%';
ALTER USER '{replicator}'@'%' REQUIRE SUBJECT '/CN={replicator}';
""".format(operator=tls.MARIADB_OPERATOR_USERNAME, replicator=tls.MARIADB_CLIENTS["replication"])
"""Run by every MariaDB server at every start (``--init-file``), kept out of the binary log:
the operator's account, which logs in only with its certificate; no root but on the socket;
the replication user needs its certificate beside its password. Also what a server made
before these rules gets on its next start."""

MARIADB_READY = """\
#!/bin/bash
# Ready: the primary (writable), or a replica whose two replication threads both run.
MYSQL_PWD=$(< /etc/stateward/credentials/root-password)
export MYSQL_PWD  # for the local client below only
client=(mariadb --socket=/run/mysqld/mysqld.sock --user=root --batch)
read_only=$("${client[@]}" --skip-column-names -e 'SELECT @@read_only') || exit 1
[ "$read_only" = 0 ] && exit 0
status=$("${client[@]}" -e 'SHOW SLAVE STATUS\\G') || exit 1
grep -q 'Slave_IO_Running: Yes' <<<"$status" && grep -q 'Slave_SQL_Running: Yes' <<<"$status"
"""

MYSQL_READY = """\
#!/bin/bash
# Ready: the primary (writable), or a replica whose two replication threads both run.
MYSQL_PWD=$(< /etc/stateward/credentials/root-password)
export MYSQL_PWD  # for the local client below only
client=(mysql --socket=/run/mysqld/mysqld.sock --user=root --batch)
read_only=$("${client[@]}" --skip-column-names -e 'SELECT @@read_only') || exit 1
[ "$read_only" = 0 ] && exit 0
status=$("${client[@]}" -e 'SHOW REPLICA STATUS\\G') || exit 1
grep -q 'Replica_IO_Running: Yes' <<<"$status" && grep -q 'Replica_SQL_Running: Yes' <<<"$status"
"""

MYSQL_INIT = """\
#!/bin/bash
# Run once by the official image's entrypoint on an empty data directory: the replication
# user (the root and application users come from its MYSQL_*_FILE variables).
MYSQL_PWD=$(< /etc/stateward/credentials/root-password)
export MYSQL_PWD  # for the local client below only
mysql --protocol=socket -uroot <<SQL
SET sql_log_bin = 0;
CREATE USER 'replicator'@'%' IDENTIFIED BY '$(< /etc/stateward/credentials/replication-password)';
GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO 'replicator'@'%';
SQL
"""


def config_files(database: v1alpha1.Database) -> dict[str, str]:
    """The ConfigMap's files: the server configuration and the start-up script."""
    if database.spec.engine is v1alpha1.Engine.MARIADB:
        return {
            "my.cnf": MARIADB_CONFIG.format(port=PORT, socket=SOCKET),
            "entrypoint.sh": MARIADB_ENTRYPOINT,
            "serve-clone.sh": MARIADB_SERVE_CLONE,
            "users.sql": MARIADB_USERS,
            "ready.sh": MARIADB_READY,
        }
    return {
        "my.cnf": MYSQL_CONFIG.format(port=PORT, socket=SOCKET),
        "replication.sh": MYSQL_INIT,
        "ready.sh": MYSQL_READY,
    }


def config_hash(files: dict[str, str]) -> str:
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(f"{name}\0{files[name]}\0".encode())
    return digest.hexdigest()[:16]


def config_map(
    database: v1alpha1.Database, files: dict[str, str], *, has_data: bool = False
) -> meta.Object:
    """``NAME-config``: the files, and (MariaDB) the :data:`HAS_DATA_KEY` mark once the
    Database has data."""
    data = dict(files)
    if has_data and database.spec.engine is v1alpha1.Engine.MARIADB:
        data[HAS_DATA_KEY] = "true"
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(database, database.config_map_name),
        "data": data,
    }


def has_data_marked(config_map: meta.Object | None) -> bool:
    """Whether an observed ``NAME-config`` carries the :data:`HAS_DATA_KEY` mark."""
    return ((config_map or {}).get("data") or {}).get(HAS_DATA_KEY) == "true"


# --- credentials ----------------------------------------------------------------------------


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def credentials_secret(
    database: v1alpha1.Database, *, root_password: str, replication_password: str
) -> meta.Object:
    """``NAME-credentials``: the root and replication passwords, for the servers and the
    operator only."""
    if not root_password or not replication_password:
        raise ValueError(f"Secret {database.credentials_secret_name!r}: empty password")
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(database, database.credentials_secret_name),
        "type": "Opaque",
        "data": {
            "root-user": _b64("root"),
            ROOT_PASSWORD_KEY: _b64(root_password),
            "replication-user": _b64(REPLICATION_USER),
            REPLICATION_PASSWORD_KEY: _b64(replication_password),
        },
    }


def app_secret(database: v1alpha1.Database, *, password: str) -> meta.Object:
    """``NAME-app``: what an application needs to connect to the primary."""
    if not password:
        raise ValueError(f"Secret {database.app_secret_name!r}: empty password")
    host = f"{database.primary_service_name}.{database.namespace}.svc"
    scheme = "mariadb" if database.spec.engine is v1alpha1.Engine.MARIADB else "mysql"
    # The password is URL-safe base64 and the names plain identifiers: nothing to escape.
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(database, database.app_secret_name),
        "type": "kubernetes.io/basic-auth",
        "data": {
            "username": _b64(APP_USER),
            APP_PASSWORD_KEY: _b64(password),
            "host": _b64(host),
            "port": _b64(str(PORT)),
            "dbname": _b64(APP_DATABASE),
            "user": _b64(APP_USER),
            "uri": _b64(f"{scheme}://{APP_USER}:{password}@{host}:{PORT}/{APP_DATABASE}"),
            "jdbc-uri": _b64(
                f"jdbc:{scheme}://{host}:{PORT}/{APP_DATABASE}?user={APP_USER}&password={password}"
            ),
        },
    }


# --- Services --------------------------------------------------------------------------------


def services(database: v1alpha1.Database) -> list[meta.Object]:
    """Headless (stable pod names, also before they are ready), primary (read-write) and
    replicas (read-only): the last two select on the role label the operator sets."""
    selector = selector_labels(database)
    port = {"name": PORT_NAME, "port": PORT}

    def service(name: str, selector: dict[str, str], **extra: object) -> meta.Object:
        return {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _meta(database, name),
            "spec": {**extra, "selector": selector, "ports": [port]},
        }

    return [
        service(
            database.headless_service_name,
            selector,
            clusterIP="None",
            publishNotReadyAddresses=True,
        ),
        # No Service carries MariaDB's clone port: new servers ask their peers directly.
        service(database.primary_service_name, {**selector, meta.ROLE_LABEL: meta.PRIMARY_ROLE}),
        service(database.replicas_service_name, {**selector, meta.ROLE_LABEL: meta.REPLICA_ROLE}),
    ]


def pod_disruption_budget(database: v1alpha1.Database) -> meta.Object:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(database, database.name, component=meta.INSTANCE_COMPONENT),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector_labels(database)},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


# --- the StatefulSet ---------------------------------------------------------------------------


def statefulset(database: v1alpha1.Database, *, config_hash: str) -> meta.Object:
    """``NAME``: the servers; ``config_hash`` marks the configuration they run."""
    volume_claim: meta.Object = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": database.spec.storage.size}},
    }
    if database.spec.storage.storage_class_name is not None:
        volume_claim["storageClassName"] = database.spec.storage.storage_class_name
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _meta(database, database.name, component=meta.INSTANCE_COMPONENT),
        "spec": {
            "replicas": database.spec.replicas,
            "serviceName": database.headless_service_name,
            "podManagementPolicy": "Parallel",
            # The operator replaces pods itself, replicas first.
            "updateStrategy": {"type": "OnDelete"},
            "selector": {"matchLabels": selector_labels(database)},
            "template": _pod_template(database, config_hash),
            "volumeClaimTemplates": [
                {
                    "metadata": {
                        "name": DATA_VOLUME,
                        "labels": meta.labels(
                            database,
                            component=meta.INSTANCE_COMPONENT,
                            app=database.spec.engine.value,
                        ),
                    },
                    "spec": volume_claim,
                }
            ],
        },
    }


def _pod_template(database: v1alpha1.Database, config_hash: str) -> meta.Object:
    labels = {
        **meta.labels(database, component=meta.INSTANCE_COMPONENT, app=database.spec.engine.value),
        **selector_labels(database),
    }
    return {
        "metadata": {
            "labels": labels,
            "annotations": {meta.CONFIG_HASH_ANNOTATION: config_hash},
        },
        "spec": {
            "enableServiceLinks": False,
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": TERMINATION_GRACE_PERIOD_SECONDS,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": UID,
                "runAsGroup": UID,
                "fsGroup": UID,
                "fsGroupChangePolicy": "OnRootMismatch",
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            # One server per node, required: a node lost to a fault must never take the
            # primary and a replica together (a replica may hold the only copy of commits it
            # acknowledged; cut off with the primary, the failover must wait for it). A
            # server re-made while its node is away waits for it rather than doubling up.
            "affinity": {
                "podAntiAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "labelSelector": {"matchLabels": selector_labels(database)},
                            "topologyKey": "kubernetes.io/hostname",
                        }
                    ]
                }
            },
            "containers": [_container(database)],
            "volumes": [
                {"name": CONFIG_VOLUME, "configMap": {"name": database.config_map_name}},
                pods.empty_dir(RUN_VOLUME),
                pods.empty_dir(TMP_VOLUME),
                _credentials_volume(database),
                *_tls_volumes(database),
            ],
        },
    }


def _credentials_volume(database: v1alpha1.Database) -> meta.Object:
    """The passwords as files under :data:`CREDENTIALS_DIR` (a projected volume: memory-backed,
    root-owned, readable by the mysql group only): ``root-password`` and
    ``replication-password`` from ``NAME-credentials``, ``app-password`` from ``NAME-app``."""
    return {
        "name": CREDENTIALS_VOLUME,
        "projected": {
            "defaultMode": 0o440,
            "sources": [
                {"secret": {"name": database.credentials_secret_name, "items": [
                    {"key": ROOT_PASSWORD_KEY, "path": "root-password"},
                    {"key": REPLICATION_PASSWORD_KEY, "path": "replication-password"},
                ]}},
                {"secret": {"name": database.app_secret_name, "items": [
                    {"key": APP_PASSWORD_KEY, "path": "app-password"},
                ]}},
            ],
        },
    }  # fmt: skip


def _tls_volumes(database: v1alpha1.Database) -> list[meta.Object]:
    """MariaDB: ``NAME-tls`` without the operator's client key (the servers never log in as
    the operator), readable by the mysql group only."""
    if database.spec.engine is not v1alpha1.Engine.MARIADB:
        return []
    files = [tls.CERT_KEY, tls.KEY_KEY, tls.CA_CERT_KEY, tls.CLIENT_CA_KEY,
             *tls.client_files("replication")]  # fmt: skip
    return [
        {
            "name": TLS_VOLUME,
            "secret": {
                "secretName": database.tls_secret_name,
                "defaultMode": 0o440,
                "items": [{"key": name, "path": name} for name in files],
            },
        }
    ]


def _container(database: v1alpha1.Database) -> meta.Object:
    env: list[meta.Object] = []  # credentials are files (CREDENTIALS_DIR), never variables
    mounts: list[meta.Object] = [
        {"name": DATA_VOLUME, "mountPath": DATA_MOUNT},
        {"name": RUN_VOLUME, "mountPath": RUN_DIR},
        {"name": TMP_VOLUME, "mountPath": "/tmp"},  # noqa: S108 - an emptyDir
    ]
    mounts.append({"name": CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": True})
    mounts.append({"name": CREDENTIALS_VOLUME, "mountPath": CREDENTIALS_DIR, "readOnly": True})
    ports = [{"name": PORT_NAME, "containerPort": PORT}]
    if database.spec.engine is v1alpha1.Engine.MARIADB:
        command = ["bash", f"{CONFIG_DIR}/entrypoint.sh"]
        env += [
            # A new server copies the primary's data from one of its peers (entrypoint.sh),
            # which must show a certificate for the primary Service's name.
            {"name": "PEERS_HOST",
             "value": f"{database.headless_service_name}.{database.namespace}.svc.cluster.local"},
            {"name": "PRIMARY_NAME",
             "value": f"{database.primary_service_name}.{database.namespace}.svc"},
            {"name": "CLONE_PORT", "value": str(CLONE_PORT)},
            {"name": "METRICS_PORT", "value": str(METRICS_PORT)},
        ]  # fmt: skip
        ports.append({"name": "clone", "containerPort": CLONE_PORT})
        ports.append({"name": METRICS_PORT_NAME, "containerPort": METRICS_PORT})
        mounts.append({"name": TLS_VOLUME, "mountPath": TLS_DIR, "readOnly": True})
        probe = ["mariadb-admin", f"--socket={SOCKET}", "ping"]
    else:
        # The official image's entrypoint initializes the data directory from MYSQL_*.
        command = [
            "bash",
            "-c",
            "exec docker-entrypoint.sh mysqld --defaults-extra-file=/etc/mysql/conf.d/my.cnf"
            " --datadir=/var/lib/mysql/data --server-id=$(( ${HOSTNAME##*-} + 1 ))",
        ]
        env += [
            # The official entrypoint reads each *_FILE variable's file.
            {"name": "MYSQL_ROOT_PASSWORD_FILE", "value": f"{CREDENTIALS_DIR}/root-password"},
            {"name": "MYSQL_DATABASE", "value": APP_DATABASE},
            {"name": "MYSQL_USER", "value": APP_USER},
            {"name": "MYSQL_PASSWORD_FILE", "value": f"{CREDENTIALS_DIR}/app-password"},
        ]
        mounts += [
            {"name": CONFIG_VOLUME, "mountPath": "/etc/mysql/conf.d/my.cnf", "subPath": "my.cnf",
             "readOnly": True},
            {"name": CONFIG_VOLUME, "mountPath": "/docker-entrypoint-initdb.d/replication.sh",
             "subPath": "replication.sh", "readOnly": True},
        ]  # fmt: skip
        probe = ["mysqladmin", f"--socket={SOCKET}", "ping"]
    return {
        "name": CONTAINER,
        "image": database.image,
        "command": command,
        "ports": ports,
        "env": env,
        "volumeMounts": mounts,
        "startupProbe": _exec_probe(probe, period=2, failures=150),
        "livenessProbe": _exec_probe(probe, period=10, failures=6),
        # Ready means serving its role: the primary, or a replica that replicates.
        "readinessProbe": _exec_probe(["bash", f"{CONFIG_DIR}/ready.sh"], period=2, failures=2),
        "securityContext": pods.container_security_context(),
    }


def _exec_probe(command: list[str], *, period: int, failures: int) -> meta.Object:
    return {
        "exec": {"command": command},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def network_policy(database: v1alpha1.Database, operator_namespace: str) -> list[meta.Object]:
    """The SQL port to the clients, the servers and the operator's namespace; MariaDB's clone
    port to the servers only, its metrics port to ``spec.networkPolicy.metrics``."""
    if not database.spec.network_policy.enabled:
        return []
    mariadb = database.spec.engine is v1alpha1.Engine.MARIADB
    return [
        network.network_policy(
            database.spec.network_policy,
            metadata=_meta(database, database.name),
            selector=selector_labels(database),
            client_ports=[PORT],
            member_ports=[PORT, CLONE_PORT] if mariadb else [PORT],
            operator_ports=[PORT],
            operator_namespace=operator_namespace,
            metrics_ports=[METRICS_PORT] if mariadb else [],
        )
    ]


def children(
    database: v1alpha1.Database,
    *,
    operator_namespace: str = meta.OPERATOR_NAMESPACE,
    has_data: bool = False,
) -> list[meta.Object]:
    """Every applied child, in apply order (the Secrets are created once, apart).
    ``has_data``: the Database has had a primary (see :data:`HAS_DATA_KEY`)."""
    files = config_files(database)
    return [
        config_map(database, files, has_data=has_data),
        *services(database),
        pod_disruption_budget(database),
        *network_policy(database, operator_namespace),
        statefulset(database, config_hash=config_hash(files)),
    ]
