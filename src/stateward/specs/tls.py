"""The certificates of a cluster (a PostgresCluster or a MariaDB Database): its CA, the
servers' serving certificate and the client certificates of the roles that may log in over
the network only with one.

Every cluster gets its own certificate authority (``NAME-ca``, made once by the operator;
only the operator reads it) and a serving certificate signed by it (``NAME-tls``, a
``kubernetes.io/tls`` Secret the instance pods mount). PostgreSQL serves it on :5432 and
Patroni on :8008; members verify each other's chain against ``ca.crt``, applications verify
the Services' names too (``sslmode=verify-full``).

The serving certificate is reissued when it comes within :data:`RENEW_BEFORE` of its end,
when the names it must cover change, or when the CA changes; the instances reload it without
a restart (``instance.supervisor``). Whether to reissue is read from the Secret's
annotations, which the operator's store keeps (it keeps no Secret data), so the check costs
no API call.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import hashlib
from collections.abc import Mapping
from typing import Final, Protocol

from cryptography import x509
from cryptography.x509 import verification

from stateward import pki, rfc3339
from stateward.api import v1alpha1
from stateward.instance import patroni, pooler
from stateward.specs import meta

CA_CERT_KEY: Final = "ca.crt"
"""In ``NAME-tls`` and the app Secret: what clients trust to verify the servers."""
CLIENT_CA_KEY: Final = "client-ca.crt"
"""In ``NAME-tls``: the CA the servers accept client certificates from — the cluster's CA
alone, even when the servers serve the user's own certificate (``ca.crt`` then also holds
the user's root, which must never let anyone log in as a certificate-only role)."""
CA_KEY_KEY: Final = "ca.key"
CERT_KEY: Final = "tls.crt"
KEY_KEY: Final = "tls.key"
TLS_TYPE: Final = "kubernetes.io/tls"

CA_FINGERPRINT_ANNOTATION: Final = "stateward.io/ca-fingerprint"
"""On the CA Secret: its certificate's SHA-256; on the serving Secret and the app Secret:
the CA they were made with (a different one means: reissue, or update ``ca.crt``)."""
NOT_AFTER_ANNOTATION: Final = "stateward.io/not-after"
CA_SOURCE_ANNOTATION: Final = "stateward.io/ca-source"
"""On ``NAME-ca`` copied from the user's CA Secret (``spec.tls.caSecretName``): that Secret's
``NAME/resourceVersion``; a different one means: copy again."""
SERVER_SOURCE_ANNOTATION: Final = "stateward.io/server-source"
"""On ``NAME-tls`` serving the user's certificate (``spec.tls.serverSecretName``): that
Secret's ``NAME/resourceVersion``; a different one means: copy again."""
SERVER_NOT_AFTER_ANNOTATION: Final = "stateward.io/server-not-after"
"""On ``NAME-tls`` serving the user's certificate: when that certificate ends (renewing it
is the user's; the operator warns before)."""
NAMES_ANNOTATION: Final = "stateward.io/names-digest"
"""SHA-256 over the names the certificate covers and the client identities beside it: a change
of either (a Secret made before the clients existed) reissues."""

CLIENTS: Final = {
    "superuser": patroni.SUPERUSER_USERNAME,
    "replication": patroni.REPLICATION_USERNAME,
    pooler.CLIENT_STEM: pooler.ROLE,
}
"""The client certificates beside the serving one (``superuser.crt``/``.key``, ...), by file
stem, each for the role its common name says: the only way these roles may log in over the
network (``pg_hba`` ``cert``), so their passwords alone open nothing from another pod."""

MARIADB_OPERATOR_USERNAME: Final = "stateward"
MARIADB_CLIENTS: Final = {"operator": MARIADB_OPERATOR_USERNAME, "replication": "replicator"}
"""MariaDB's client certificates: the operator's account (``stateward``, every privilege) logs
in over the network only with its certificate (``REQUIRE SUBJECT``), and the replication user
needs its certificate beside its password; root logs in only on the server's socket."""


class Served(meta.Owner, Protocol):
    """What the certificates need of their owner: its Services and the Secrets' names."""

    @property
    def primary_service_name(self) -> str: ...

    @property
    def replicas_service_name(self) -> str: ...

    @property
    def headless_service_name(self) -> str: ...

    @property
    def ca_secret_name(self) -> str: ...

    @property
    def tls_secret_name(self) -> str: ...

    @property
    def user_ca_secret_name(self) -> str | None: ...

    @property
    def user_server_secret_name(self) -> str | None: ...


def clients_of(owner: Served) -> Mapping[str, str]:
    """The client certificates an owner's Secret carries: file stem to common name."""
    return MARIADB_CLIENTS if isinstance(owner, v1alpha1.Database) else CLIENTS


RENEW_BEFORE: Final = datetime.timedelta(days=30)
"""A serving certificate is valid a year (``pki.VALIDITY``); the last month is for renewal,
so a month of operator downtime is survivable."""

CLUSTER_DOMAIN: Final = "cluster.local"


def server_names(cluster: Served) -> tuple[str, ...]:
    """Every name a client may use for the cluster: each Service short, with its namespace,
    ``.svc`` and the cluster domain, and every instance pod under the headless Service (one
    wildcard, so scaling never reissues). Pods are also addressed by IP (Patroni's members,
    the operator); those clients verify the chain, not the name. A PostgresCluster's also
    cover its pooler's Service (``NAME-pooler``), whether or not it has one yet: adding a
    pooler reissues nothing."""
    namespace = cluster.namespace
    names: list[str] = []
    services = [
        cluster.primary_service_name,
        cluster.replicas_service_name,
        cluster.headless_service_name,
    ]
    if isinstance(cluster, v1alpha1.PostgresCluster):
        services.append(cluster.pooler_name)
    for service in services:
        names += [
            service,
            f"{service}.{namespace}",
            f"{service}.{namespace}.svc",
            f"{service}.{namespace}.svc.{CLUSTER_DOMAIN}",
        ]
    headless = f"{cluster.headless_service_name}.{namespace}.svc"
    names += [f"*.{headless}", f"*.{headless}.{CLUSTER_DOMAIN}", "localhost"]
    return tuple(names)


def names_digest(names: tuple[str, ...], clients_by_stem: Mapping[str, str] = CLIENTS) -> str:
    """Over the names, the client identities and the Secret's layout (a Secret made before
    ``client-ca.crt`` existed is reissued with it)."""
    clients = [f"client:{stem}={user}" for stem, user in sorted(clients_by_stem.items())]
    layout = [f"key:{CLIENT_CA_KEY}"]
    return hashlib.sha256("\n".join([*sorted(names), *clients, *layout]).encode()).hexdigest()


def client_files(stem: str) -> tuple[str, str]:
    """The Secret's keys of one client certificate and its key."""
    return f"{stem}.crt", f"{stem}.key"


def ca_common_name(cluster: Served) -> str:
    return f"{cluster.name}.{cluster.namespace} CA (Stateward)"


def ca_secret(
    cluster: Served, *, cert: bytes, key: bytes, source: str | None = None
) -> meta.Object:
    """``NAME-ca``: the CA's certificate (first; a chain to the root may follow: everything
    that peers and clients trust) and key. No data depends on it: if it is deleted, the
    operator makes a new CA (or copies the user's again) and reissues the serving
    certificate. ``source``: the user's Secret it copies, as :func:`ca_source` names it."""
    body: meta.Object = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta.object_meta(cluster, cluster.ca_secret_name),
        "type": "Opaque",
        "data": {CA_CERT_KEY: _b64(cert), CA_KEY_KEY: _b64(key)},
    }
    annotations = {
        CA_FINGERPRINT_ANNOTATION: pki.fingerprint(cert),
        NOT_AFTER_ANNOTATION: rfc3339.format(pki.not_after(cert)),
    }
    if source is not None:
        annotations[CA_SOURCE_ANNOTATION] = source
    body["metadata"]["annotations"] = annotations
    return body


def ca_source(secret: meta.Object | None) -> str | None:
    """The user's Secret ``NAME/resourceVersion`` a ``NAME-ca`` was copied from; None for
    the cluster's own CA."""
    if secret is None:
        return None
    return (secret["metadata"].get("annotations") or {}).get(CA_SOURCE_ANNOTATION) or None


def user_ca(data: Mapping[str, bytes]) -> tuple[bytes, bytes]:
    """The CA certificate chain and key in a user's CA Secret (decoded data): ``tls.crt``
    and ``tls.key`` as cert-manager writes them, whose ``ca.crt`` (the root) is trusted
    beside them, or else ``ca.crt`` and ``ca.key``. The chain starts with the signing
    certificate, each certificate once. ValueError naming the keys when neither pair is
    there (the message carries no data)."""
    if data.get(CERT_KEY) and data.get(KEY_KEY):
        chain, key = [data[CERT_KEY], data.get(CA_CERT_KEY, b"")], data[KEY_KEY]
    elif data.get(CA_CERT_KEY) and data.get(CA_KEY_KEY):
        chain, key = [data[CA_CERT_KEY]], data[CA_KEY_KEY]
    else:
        raise ValueError(
            f"holds neither {CERT_KEY} and {KEY_KEY} (cert-manager's CA Certificate) nor"
            f" {CA_CERT_KEY} and {CA_KEY_KEY}"
        )
    return pki.pem_chain(*chain), key


def recorded_ca_fingerprint(secret: meta.Object | None) -> str | None:
    """The CA fingerprint a Secret carries in its annotation (the store keeps annotations,
    so no certificate is parsed to learn it); None on a Secret made by hand."""
    if secret is None:
        return None
    return (secret["metadata"].get("annotations") or {}).get(CA_FINGERPRINT_ANNOTATION) or None


def server_secret(
    cluster: Served,
    *,
    cert: bytes,
    key: bytes,
    ca_cert: bytes,
    clients: Mapping[str, tuple[bytes, bytes]],
    server: ServerCertificate | None = None,
) -> meta.Object:
    """``NAME-tls``: the serving certificate for :func:`server_names` and its key, the CA
    (``ca_cert``, which signed them and the clients'), and a client certificate and key for
    each of :data:`CLIENTS` (``clients``: stem to PEMs). With ``server`` (the user's own,
    :func:`user_server`, whose chain and key are ``cert`` and ``key``), clients trust its
    root beside the CA."""
    wanted = clients_of(cluster)
    if set(clients) != set(wanted):
        raise ValueError(f"client certificates for {sorted(wanted)} are needed")
    trusted = ca_cert if server is None else pki.pem_chain(server.roots, ca_cert)
    data = {
        CERT_KEY: _b64(cert),
        KEY_KEY: _b64(key),
        CA_CERT_KEY: _b64(trusted),
        CLIENT_CA_KEY: _b64(ca_cert),
    }
    for stem, (client_cert, client_key) in sorted(clients.items()):
        cert_file, key_file = client_files(stem)
        data |= {cert_file: _b64(client_cert), key_file: _b64(client_key)}
    body: meta.Object = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta.object_meta(cluster, cluster.tls_secret_name),
        "type": TLS_TYPE,
        "data": data,
    }
    annotations = {
        CA_FINGERPRINT_ANNOTATION: pki.fingerprint(ca_cert),
        # What the operator renews: its own serving certificate, or the clients' beside the
        # user's (the user's end is recorded apart; renewing it is the user's).
        NOT_AFTER_ANNOTATION: rfc3339.format(
            pki.not_after(cert)
            if server is None
            else min(pki.not_after(c) for c, _ in clients.values())
        ),
        NAMES_ANNOTATION: names_digest(server_names(cluster), wanted),
    }
    if server is not None:
        annotations[SERVER_SOURCE_ANNOTATION] = server.source
        annotations[SERVER_NOT_AFTER_ANNOTATION] = rfc3339.format(server.not_after)
    body["metadata"]["annotations"] = annotations
    return body


@dataclasses.dataclass(frozen=True)
class ServerCertificate:
    """A user's serving certificate (``spec.tls.serverSecretName``), checked."""

    chain: bytes
    """The certificate, then its intermediates (PEM)."""
    key: bytes = dataclasses.field(repr=False)
    roots: bytes
    """What clients trust to verify it: the Secret's ``ca.crt``."""
    not_after: datetime.datetime
    source: str
    """The Secret's ``NAME/resourceVersion``."""


def user_server(
    cluster: Served, data: Mapping[str, bytes], *, source: str, now: datetime.datetime
) -> ServerCertificate:
    """The user's serving certificate from their Secret's decoded data: ``tls.crt`` (the
    certificate, intermediates may follow), ``tls.key`` and ``ca.crt``, as cert-manager
    writes them. ValueError saying what is wrong (never quoting the data) unless the key is
    the certificate's and the chain verifies, now, under ``ca.crt`` for the primary
    Service's name (the app Secret's host), as a client with ``verify-full`` checks it."""
    missing = [k for k in (CERT_KEY, KEY_KEY, CA_CERT_KEY) if not data.get(k)]
    if missing:
        raise ValueError(f"it holds no {' and no '.join(missing)}")
    try:
        certs = x509.load_pem_x509_certificates(data[CERT_KEY])
        roots = x509.load_pem_x509_certificates(data[CA_CERT_KEY])
    except ValueError:
        raise ValueError(f"{CERT_KEY} or {CA_CERT_KEY} is not PEM certificates") from None
    try:
        matches = pki.key_matches(data[CERT_KEY], data[KEY_KEY])
    except (ValueError, TypeError):
        raise ValueError(f"{KEY_KEY} is not an unencrypted PEM private key") from None
    if not matches:
        raise ValueError(f"{KEY_KEY} is not the key of the certificate in {CERT_KEY}")
    for host in required_names(cluster):
        verifier = (
            verification.PolicyBuilder()
            .store(verification.Store(roots))
            .time(now)
            .build_server_verifier(x509.DNSName(host))
        )
        try:
            verifier.verify(certs[0], certs[1:])
        except verification.VerificationError as error:
            raise ValueError(
                f"the certificate in {CERT_KEY} does not verify for {host} under the root in"
                f" {CA_CERT_KEY} now ({error})"
            ) from None
    return ServerCertificate(
        chain=pki.pem_chain(data[CERT_KEY]),
        key=data[KEY_KEY],
        roots=pki.pem_chain(data[CA_CERT_KEY]),
        not_after=certs[0].not_valid_after_utc,
        source=source,
    )


def required_names(cluster: Served) -> tuple[str, ...]:
    """The names a user's serving certificate must be valid for: the primary Service's, the
    app Secret's host; for MariaDB also the servers' own names under the headless Service
    (``*.NAME-headless.NAMESPACE.svc.cluster.local``), by which replicas verify their source.
    PostgreSQL's members verify each other's chain only (they meet by pod address). With a
    pooler (``spec.pooler``), which serves the same certificate, also its Service's name."""
    names = [f"{cluster.primary_service_name}.{cluster.namespace}.svc"]
    if isinstance(cluster, v1alpha1.PostgresCluster) and cluster.spec.pooler is not None:
        names.append(cluster.pooler_host)
    if isinstance(cluster, v1alpha1.Database):
        headless = f"{cluster.headless_service_name}.{cluster.namespace}.svc.{CLUSTER_DOMAIN}"
        names.append(f"{cluster.name}-0.{headless}")
    return tuple(names)


def server_source(secret: meta.Object | None) -> str | None:
    """The user's Secret ``NAME/resourceVersion`` a ``NAME-tls`` serves; None when it
    serves a certificate of the cluster's CA."""
    if secret is None:
        return None
    return (secret["metadata"].get("annotations") or {}).get(SERVER_SOURCE_ANNOTATION) or None


def server_expiry_problem(
    name: str, secret: meta.Object | None, now: datetime.datetime
) -> str | None:
    """A message for Degraded when the user's serving certificate that ``NAME-tls`` serves
    (from Secret ``name``) ends within :data:`SERVER_WARN_BEFORE`; None otherwise."""
    if secret is None:
        return None
    annotations = secret["metadata"].get("annotations") or {}
    ends = rfc3339.parse(annotations.get(SERVER_NOT_AFTER_ANNOTATION))
    if ends is None or ends - now > SERVER_WARN_BEFORE:
        return None
    verb = "expired" if ends <= now else "expires"
    return (
        f"the serving certificate in Secret {name} (spec.tls.serverSecretName) {verb} at"
        f" {rfc3339.format(ends)}: renew it (cert-manager renews its Certificate before its"
        " end), or unset serverSecretName and the cluster's CA signs one"
    )


SERVER_WARN_BEFORE: Final = datetime.timedelta(days=7)
"""cert-manager renews a certificate a third of its life before the end (30 days of 90):
a user's certificate a week from its end has missed its renewal."""


def renewal_reason(
    cluster: Served,
    observed: Mapping[str, object] | None,
    *,
    ca_fingerprint: str,
    now: datetime.datetime,
    ca_not_after: datetime.datetime | None = None,
    server: str | None = None,
) -> str | None:
    """Why the serving certificate must be (re)issued, or None while it is good: missing,
    made with another CA, covering other names, not the user's certificate ``server`` (their
    Secret's ``NAME/resourceVersion``, :func:`server_source`; None: the cluster's CA signs
    it), or within :data:`RENEW_BEFORE` of its end (or of unknown end: a Secret someone
    replaced by hand) — unless the CA ends no later than it does (``ca_not_after``): a new
    certificate could not last longer, so it is not issued again and again
    (:func:`ca_expiry_problem` says what to do). With ``server``, the end is the client
    certificates'; the user's own is the user's to renew."""
    if observed is None:
        return "it does not exist"
    metadata = observed.get("metadata")
    annotations = (metadata.get("annotations") if isinstance(metadata, dict) else None) or {}
    if annotations.get(CA_FINGERPRINT_ANNOTATION) != ca_fingerprint:
        return "it was not signed by the cluster's current CA"
    if annotations.get(NAMES_ANNOTATION) != names_digest(
        server_names(cluster), clients_of(cluster)
    ):
        return "the names it must cover changed"
    serving = annotations.get(SERVER_SOURCE_ANNOTATION) or None
    if server is not None and serving != server:
        name = server.rsplit("/", 1)[0]
        return f"Secret {name} (spec.tls.serverSecretName) changed"
    if server is None and serving is not None:
        return "spec.tls.serverSecretName is unset"
    not_after = rfc3339.parse(annotations.get(NOT_AFTER_ANNOTATION))
    if not_after is None:
        return "its expiry is unknown"
    if not_after - now <= RENEW_BEFORE:
        if ca_not_after is not None and ca_not_after <= not_after + CA_END_SLACK:
            return None
        return f"it expires at {rfc3339.format(not_after)}"
    return None


CA_END_SLACK: Final = datetime.timedelta(hours=1)
"""A certificate that ends within this of its CA's end already lasts as long as it can."""


def validity_under(ca_not_after: datetime.datetime, now: datetime.datetime) -> datetime.timedelta:
    """How long a certificate issued now may be valid: a year (``pki.VALIDITY``), but never
    past the end of the CA that signs it (a chain is only as valid as its CA)."""
    return max(min(pki.VALIDITY, ca_not_after - now), datetime.timedelta(0))


def ca_expiry_problem(
    ca_name: str, ca_not_after: datetime.datetime | None, now: datetime.datetime
) -> str | None:
    """A message for Degraded when the CA comes within :data:`RENEW_BEFORE` of its end (the
    certificates it signed end with it); None otherwise."""
    if ca_not_after is None or ca_not_after - now > RENEW_BEFORE:
        return None
    stamp = rfc3339.format(ca_not_after)
    if ca_not_after <= now:
        return (
            f"the CA in Secret {ca_name} expired at {stamp}: no client can verify the servers;"
            " renew the CA (cert-manager renews its Certificate), or delete it when it is the"
            " cluster's own, and every certificate is reissued"
        )
    return (
        f"the CA in Secret {ca_name} expires at {stamp}, and the servers' certificates with it:"
        " renew the CA (cert-manager renews its Certificate), or delete it when it is the"
        " cluster's own, and every certificate is reissued"
    )


def recorded_not_after(secret: meta.Object | None) -> datetime.datetime | None:
    """The end of validity a Secret records in its annotation (None: unrecorded)."""
    if secret is None:
        return None
    return rfc3339.parse((secret["metadata"].get("annotations") or {}).get(NOT_AFTER_ANNOTATION))


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")
