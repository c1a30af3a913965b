"""A cluster's certificates: the CA and serving Secrets, and when the serving one is reissued."""

from __future__ import annotations

import base64
import datetime
import hashlib
import socket
import ssl
import tempfile
import threading
from typing import Any

import pytest
from cryptography import x509

from stateward import pki
from stateward.api.v1alpha1 import Database
from stateward.specs import tls
from tests.support.clusters import make_cluster

pytestmark = pytest.mark.unit

NOW = datetime.datetime(2026, 12, 4, 12, 0, tzinfo=datetime.UTC)


def decoded(body: dict[str, Any]) -> dict[str, bytes]:
    return {key: base64.b64decode(value) for key, value in body["data"].items()}


def serving(now: datetime.datetime = NOW, **cluster_spec: Any) -> tuple[dict[str, Any], bytes]:
    cluster = make_cluster(**cluster_spec)
    authority = pki.Authority.new(tls.ca_common_name(cluster), now=now)
    issued = authority.issue(
        common_name="demo", hosts=tls.server_names(cluster), server=True, now=now
    )
    clients = {
        stem: (client.cert, client.key)
        for stem, user in tls.CLIENTS.items()
        for client in (authority.issue(common_name=user, now=now),)
    }
    body = tls.server_secret(
        cluster, cert=issued.cert, key=issued.key, ca_cert=authority.cert_pem, clients=clients
    )
    return body, authority.cert_pem


def test_the_names_cover_every_service_and_every_pod_under_the_headless_one() -> None:
    names = set(tls.server_names(make_cluster()))
    for service in ("demo-primary", "demo-replicas", "demo-headless"):
        assert {
            service,
            f"{service}.db",
            f"{service}.db.svc",
            f"{service}.db.svc.cluster.local",
        } <= names
    # One wildcard for every pod, so scaling never reissues the certificate.
    assert {"*.demo-headless.db.svc", "*.demo-headless.db.svc.cluster.local"} <= names
    assert not any(name.startswith("demo-0") for name in names)


def test_the_serving_secret_holds_a_certificate_for_those_names_signed_by_the_ca() -> None:
    body, ca = serving()
    data = decoded(body)
    assert body["type"] == "kubernetes.io/tls"
    assert body["metadata"]["name"] == "demo-tls"
    assert set(data) == {
        "tls.crt", "tls.key", "ca.crt", "client-ca.crt",
        "superuser.crt", "superuser.key", "replication.crt", "replication.key",
        "pooler.crt", "pooler.key",
    }  # fmt: skip
    assert data["ca.crt"] == ca
    assert data["client-ca.crt"] == ca  # the servers accept client certificates of the CA
    assert pki.key_matches(data["tls.crt"], data["tls.key"])
    assert pki.subject_alt_names(data["tls.crt"]) == set(tls.server_names(make_cluster()))
    cert = x509.load_pem_x509_certificate(data["tls.crt"])
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca))
    annotations = body["metadata"]["annotations"]
    assert annotations["stateward.io/ca-fingerprint"] == pki.fingerprint(ca)
    assert annotations["stateward.io/not-after"] == "2027-12-04T12:00:00Z"


def test_the_ca_secret_holds_the_ca_and_its_fingerprint() -> None:
    cluster = make_cluster()
    authority = pki.Authority.new(tls.ca_common_name(cluster))
    body = tls.ca_secret(cluster, cert=authority.cert_pem, key=authority.key_pem)
    data = decoded(body)
    assert body["metadata"]["name"] == "demo-ca"
    assert body["metadata"]["ownerReferences"][0]["name"] == "demo"
    assert pki.Authority.load(data["ca.crt"], data["ca.key"]).cert_pem == authority.cert_pem
    assert body["metadata"]["annotations"] == {
        "stateward.io/ca-fingerprint": pki.fingerprint(authority.cert_pem),
        "stateward.io/not-after": authority.not_after.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    assert tls.recorded_ca_fingerprint(body) == pki.fingerprint(authority.cert_pem)
    assert tls.recorded_not_after(body) == authority.not_after.replace(microsecond=0)
    assert tls.ca_source(body) is None


@pytest.mark.parametrize(
    "secret",
    [
        None,
        {"metadata": {}},
        {"metadata": {"annotations": None}},
        {"metadata": {"annotations": {"stateward.io/ca-fingerprint": ""}}},
        {"metadata": {"annotations": {"other": "x"}}},
    ],
)
def test_a_secret_made_by_hand_records_no_ca_fingerprint(secret: dict[str, Any] | None) -> None:
    assert tls.recorded_ca_fingerprint(secret) is None


def test_a_good_certificate_is_kept() -> None:
    body, ca = serving()
    reason = tls.renewal_reason(
        make_cluster(), body, ca_fingerprint=pki.fingerprint(ca), now=NOW + datetime.timedelta(1)
    )
    assert reason is None


@pytest.mark.parametrize(
    ("days_later", "renewed"),
    [(300, False), (334, False), (335, True), (365, True), (400, True)],
)
def test_a_certificate_is_renewed_in_its_last_month(days_later: int, renewed: bool) -> None:
    body, ca = serving()
    reason = tls.renewal_reason(
        make_cluster(),
        body,
        ca_fingerprint=pki.fingerprint(ca),
        now=NOW + datetime.timedelta(days=days_later),
    )
    assert (reason is not None) is renewed
    if renewed:
        assert reason == "it expires at 2027-12-04T12:00:00Z"


def test_a_missing_certificate_is_issued() -> None:
    assert tls.renewal_reason(make_cluster(), None, ca_fingerprint="x", now=NOW) == (
        "it does not exist"
    )


def test_a_new_ca_reissues_the_certificate() -> None:
    body, _ca = serving()
    other = pki.Authority.new("another CA").cert_pem
    reason = tls.renewal_reason(
        make_cluster(), body, ca_fingerprint=pki.fingerprint(other), now=NOW
    )
    assert reason == "it was not signed by the cluster's current CA"


def test_other_names_reissue_the_certificate() -> None:
    body, ca = serving()
    renamed = make_cluster(metadata={"namespace": "elsewhere"})
    reason = tls.renewal_reason(renamed, body, ca_fingerprint=pki.fingerprint(ca), now=NOW)
    assert reason == "the names it must cover changed"


def test_a_secret_replaced_by_hand_is_reissued() -> None:
    body, ca = serving()
    del body["metadata"]["annotations"]["stateward.io/not-after"]
    reason = tls.renewal_reason(make_cluster(), body, ca_fingerprint=pki.fingerprint(ca), now=NOW)
    assert reason == "its expiry is unknown"


@pytest.mark.parametrize(
    ("stem", "user"), [("superuser", "postgres"), ("replication", "replicator")]
)
def test_the_client_certificates_name_their_role_and_are_signed_by_the_ca(
    stem: str, user: str
) -> None:
    body, ca = serving()
    data = decoded(body)
    cert = x509.load_pem_x509_certificate(data[f"{stem}.crt"])
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca))
    assert pki.key_matches(data[f"{stem}.crt"], data[f"{stem}.key"])
    # PostgreSQL's cert method matches the common name against the role logging in.
    (common_name,) = cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
    assert common_name.value == user
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [x509.ExtendedKeyUsageOID.CLIENT_AUTH]


def test_a_secret_without_the_client_certificates_is_reissued() -> None:
    body, ca = serving()
    cluster = make_cluster()
    servers_only = hashlib.sha256("\n".join(sorted(tls.server_names(cluster))).encode())
    body["metadata"]["annotations"]["stateward.io/names-digest"] = servers_only.hexdigest()
    reason = tls.renewal_reason(cluster, body, ca_fingerprint=pki.fingerprint(ca), now=NOW)
    assert reason == "the names it must cover changed"


def test_every_client_certificate_is_required() -> None:
    cluster = make_cluster()
    with pytest.raises(ValueError, match="client certificates"):
        tls.server_secret(cluster, cert=b"c", key=b"k", ca_cert=b"ca", clients={})


def test_a_mariadb_database_gets_the_operator_and_replication_client_certificates() -> None:
    database = Database.model_validate(
        {
            "apiVersion": "stateward.io/v1alpha1",
            "kind": "Database",
            "metadata": {"name": "shop", "namespace": "apps", "uid": "u"},
            "spec": {
                "engine": "mariadb",
                "version": "10.11",
                "replicas": 3,
                "storage": {"size": "1Gi"},
            },
        }
    )
    assert tls.clients_of(database) == {"operator": "stateward", "replication": "replicator"}
    assert tls.clients_of(make_cluster()) == tls.CLIENTS
    authority = pki.Authority.new(tls.ca_common_name(database))
    issued = authority.issue(common_name="x", hosts=tls.server_names(database), server=True)
    clients = {
        stem: (c.cert, c.key)
        for stem, user in tls.clients_of(database).items()
        for c in (authority.issue(common_name=user),)
    }
    body = tls.server_secret(
        database, cert=issued.cert, key=issued.key, ca_cert=authority.cert_pem, clients=clients
    )
    assert body["metadata"]["name"] == "shop-tls"
    assert {"operator.crt", "operator.key", "replication.crt", "replication.key"} <= set(
        body["data"]
    )
    assert "*.shop-headless.apps.svc.cluster.local" in tls.server_names(database)
    reason = tls.renewal_reason(
        database, body, ca_fingerprint=pki.fingerprint(authority.cert_pem), now=NOW
    )
    assert reason is None
    with pytest.raises(ValueError, match="operator"):
        tls.server_secret(
            database, cert=b"c", key=b"k", ca_cert=b"ca", clients={"replication": (b"c", b"k")}
        )


def test_the_operator_client_context_shows_its_certificate_and_checks_the_servers_chain() -> None:

    authority = pki.Authority.new("demo CA")
    server = authority.issue(common_name="db", hosts=("db",), server=True)
    client = authority.issue(common_name="stateward")
    context = pki.client_context(ca=authority.cert_pem, cert=client.cert, key=client.key)
    assert context.minimum_version is ssl.TLSVersion.TLSv1_3
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.verify_mode = ssl.CERT_REQUIRED
    server_context.load_verify_locations(cadata=authority.cert_pem.decode())
    with tempfile.TemporaryDirectory() as directory:
        cert_path, key_path = f"{directory}/tls.crt", f"{directory}/tls.key"
        with open(cert_path, "wb") as f:
            f.write(server.cert)
        with open(key_path, "wb") as f:
            f.write(server.key)
        server_context.load_cert_chain(cert_path, key_path)
    left, right = socket.socketpair()
    seen: list[object] = []

    def serve() -> None:
        with server_context.wrap_socket(left, server_side=True) as tls_server:
            seen.append(tls_server.getpeercert()["subject"])  # type: ignore[index]

    thread = threading.Thread(target=serve)
    thread.start()
    with context.wrap_socket(right, server_hostname="10.0.0.1") as tls_client:
        assert tls_client.version() == "TLSv1.3"
    thread.join(timeout=10)
    assert seen == [((("commonName", "stateward"),),)]
    with pytest.raises(ssl.SSLError):
        pki.client_context(ca=authority.cert_pem, cert=client.cert, key=b"not a key")
