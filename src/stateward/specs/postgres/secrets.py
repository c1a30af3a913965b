"""The credential Secrets of a PostgresCluster, created once by the controller.

Builders take the password as an argument (``specs.passwords`` makes them). Values go to
``data`` (base64) rather than ``stringData``, which the API server folds into ``data``, so an
apply compares cleanly.
"""

from __future__ import annotations

import base64

from stateward import pki
from stateward.api import v1alpha1
from stateward.instance import patroni
from stateward.specs import meta, tls

USERNAME_KEY = "username"
PASSWORD_KEY = "password"  # noqa: S105 - the key name, not a password
BASIC_AUTH_TYPE = "kubernetes.io/basic-auth"
SSLMODE = "verify-full"
"""What the app Secret's URLs ask of the client: TLS, and the server's name checked against
its certificate (the primary Service's name is in it, ``specs.tls.server_names``)."""


def superuser_secret(cluster: v1alpha1.PostgresCluster, *, password: str) -> meta.Object:
    return _basic_auth(
        cluster,
        cluster.superuser_secret_name,
        username=patroni.SUPERUSER_USERNAME,
        password=password,
    )


def replication_secret(cluster: v1alpha1.PostgresCluster, *, password: str) -> meta.Object:
    return _basic_auth(
        cluster,
        cluster.replication_secret_name,
        username=patroni.REPLICATION_USERNAME,
        password=password,
    )


def restapi_secret(cluster: v1alpha1.PostgresCluster, *, password: str) -> meta.Object:
    """Patroni's REST API credentials (``patroni.RESTAPI_USERNAME``)."""
    return _basic_auth(
        cluster,
        cluster.restapi_secret_name,
        username=patroni.RESTAPI_USERNAME,
        password=password,
    )


def app_secret(cluster: v1alpha1.PostgresCluster, *, password: str, ca_cert: bytes) -> meta.Object:
    """Everything an application needs to connect to the primary: the Service's DNS name,
    port, database, user, password, the same as a URI (libpq) and a JDBC URL, and the
    cluster's CA (``ca.crt``). Both URLs ask for ``sslmode=verify-full``: encrypted, and the
    server proven to be the cluster's by its certificate. Mount the Secret and point
    ``sslrootcert`` (``PGSSLROOTCERT``) at its ``ca.crt``."""
    body = _basic_auth(
        cluster, cluster.app_secret_name, username=cluster.spec.bootstrap.owner, password=password
    )
    host = f"{cluster.primary_service_name}.{cluster.namespace}.svc"
    port = patroni.POSTGRES_PORT
    user, database = cluster.spec.bootstrap.owner, cluster.spec.bootstrap.database
    # The password is URL-safe base64 and the names are plain identifiers: nothing to escape.
    body["data"].update(
        {
            "host": _b64(host),
            "port": _b64(str(port)),
            "dbname": _b64(database),
            "user": _b64(user),
            "uri": _b64(
                f"postgresql://{user}:{password}@{host}:{port}/{database}?sslmode={SSLMODE}"
            ),
            "jdbc-uri": _b64(
                f"jdbc:postgresql://{host}:{port}/{database}?user={user}&password={password}"
                f"&sslmode={SSLMODE}"
            ),
            tls.CA_CERT_KEY: base64.b64encode(ca_cert).decode("ascii"),
        }
    )
    body["metadata"]["annotations"] = {tls.CA_FINGERPRINT_ANNOTATION: pki.fingerprint(ca_cert)}
    return body


def _basic_auth(
    cluster: v1alpha1.PostgresCluster,
    name: str,
    *,
    username: str,
    password: str,
) -> meta.Object:
    if not password:
        raise ValueError(f"Secret {name!r}: the password must not be empty")
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta.object_meta(cluster, name),
        "type": BASIC_AUTH_TYPE,
        "data": {
            USERNAME_KEY: _b64(username),
            PASSWORD_KEY: _b64(password),
        },
    }


def _b64(value: str) -> str:
    return base64.b64encode(value.encode()).decode("ascii")
