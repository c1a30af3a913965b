"""A user's own serving certificate (``spec.tls.serverSecretName``): which Secrets can be
served, what ``NAME-tls`` then holds (the user's certificate served, its root trusted, client
certificates accepted from the cluster's CA alone), and when it is copied again."""

from __future__ import annotations

import base64
import datetime
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import rsa

from stateward import pki
from stateward.api import v1alpha1
from stateward.specs import tls
from tests.support.certificates import cert_manager_server, certificate, leaf, pem, pem_key
from tests.support.clusters import make_cluster

pytestmark = pytest.mark.unit

NOW = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
HOST = "demo-primary.db.svc"
"""The primary Service of ``make_cluster()`` (name demo, namespace db): the app Secret's host."""


def decoded(body: dict[str, Any]) -> dict[str, bytes]:
    return {key: base64.b64decode(value) for key, value in body["data"].items()}


def served_by_user(
    secret: dict[str, bytes], cluster: Any = None
) -> tuple[dict[str, Any], pki.Authority]:
    """``NAME-tls`` serving the user's certificate beside the cluster's own CA's clients."""
    cluster = cluster or make_cluster(tls={"serverSecretName": "web"})
    server = tls.user_server(cluster, secret, source="web/7", now=NOW)
    authority = pki.Authority.new(tls.ca_common_name(cluster))
    clients = {
        stem: (client.cert, client.key)
        for stem, user in tls.clients_of(cluster).items()
        for client in (authority.issue(common_name=user),)
    }
    body = tls.server_secret(
        cluster,
        cert=server.chain,
        key=server.key,
        ca_cert=authority.trusted_pem,
        clients=clients,
        server=server,
    )
    return body, authority


def test_the_users_certificate_is_served_its_root_trusted_and_only_the_ca_admits_clients() -> None:
    secret, (root, _) = cert_manager_server((HOST, "db.example.com"))
    body, authority = served_by_user(secret)
    data = decoded(body)
    assert data["tls.crt"] == secret["tls.crt"] and data["tls.key"] == secret["tls.key"]
    # Clients verify the servers with the user's root (and the cluster's CA, which signed
    # what was served before: a reload on one pod never strands the others).
    trusted = x509.load_pem_x509_certificates(data["ca.crt"])
    assert trusted == [root, authority.certificate]
    # A client certificate is accepted only from the cluster's CA: anyone the user's issuer
    # serves could otherwise be the superuser.
    assert data["client-ca.crt"] == authority.cert_pem
    for stem in ("superuser", "replication"):
        x509.load_pem_x509_certificate(data[f"{stem}.crt"]).verify_directly_issued_by(
            authority.certificate
        )
    annotations = body["metadata"]["annotations"]
    assert annotations["stateward.io/server-source"] == "web/7"
    ends = x509.load_pem_x509_certificate(secret["tls.crt"]).not_valid_after_utc
    assert annotations["stateward.io/server-not-after"] == ends.strftime("%Y-%m-%dT%H:%M:%SZ")
    # What the operator renews is the clients' certificates (a year), not the user's (90 days).
    client_end = x509.load_pem_x509_certificate(data["superuser.crt"]).not_valid_after_utc
    assert annotations["stateward.io/not-after"] == client_end.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_an_intermediate_in_tls_crt_travels_with_the_certificate() -> None:
    _, (root, root_key) = cert_manager_server((HOST,))
    middle_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    middle = certificate("Example Issuing CA", middle_key, issuer=(root, root_key))
    cert, key = leaf(HOST, (middle, middle_key), hosts=(HOST,))
    server = tls.user_server(
        make_cluster(),
        {"tls.crt": pem(cert) + pem(middle), "tls.key": pem_key(key), "ca.crt": pem(root)},
        source="web/1",
        now=NOW,
    )
    assert x509.load_pem_x509_certificates(server.chain) == [cert, middle]
    # Without the intermediate, a client trusting the root could not verify it: refused.
    with pytest.raises(ValueError, match="does not verify"):
        tls.user_server(
            make_cluster(),
            {"tls.crt": pem(cert), "tls.key": pem_key(key), "ca.crt": pem(root)},
            source="web/1",
            now=NOW,
        )


@pytest.mark.parametrize(
    ("dropped", "named"),
    [("tls.crt", "tls.crt"), ("tls.key", "tls.key"), ("ca.crt", "ca.crt")],
)
def test_a_secret_missing_a_key_names_it(dropped: str, named: str) -> None:
    secret, _ = cert_manager_server((HOST,))
    del secret[dropped]
    with pytest.raises(ValueError, match=f"holds no {named}"):
        tls.user_server(make_cluster(), secret, source="web/1", now=NOW)


def test_a_key_that_is_not_the_certificates_is_refused() -> None:
    secret, _ = cert_manager_server((HOST,))
    other, _ = cert_manager_server((HOST,))
    with pytest.raises(ValueError, match=r"tls\.key is not the key of the certificate"):
        tls.user_server(
            make_cluster(), {**secret, "tls.key": other["tls.key"]}, source="w/1", now=NOW
        )


def test_garbage_is_named_without_quoting_it() -> None:
    secret, _ = cert_manager_server((HOST,))
    with pytest.raises(ValueError, match=r"tls\.key is not an unencrypted PEM") as raised:
        tls.user_server(
            make_cluster(), {**secret, "tls.key": b"s3cr3t-not-a-key"}, source="w/1", now=NOW
        )
    assert "s3cr3t" not in str(raised.value)
    with pytest.raises(ValueError, match="not PEM certificates"):
        tls.user_server(make_cluster(), {**secret, "ca.crt": b"nope"}, source="w/1", now=NOW)


def test_a_certificate_for_other_names_is_refused_naming_the_one_it_needs() -> None:
    secret, _ = cert_manager_server(("db.example.com",))
    with pytest.raises(ValueError, match=f"does not verify for {HOST}"):
        tls.user_server(make_cluster(), secret, source="web/1", now=NOW)


def test_a_certificate_of_another_root_is_refused() -> None:
    secret, _ = cert_manager_server((HOST,))
    other, _ = cert_manager_server((HOST,))
    with pytest.raises(ValueError, match=r"under the root in ca\.crt"):
        tls.user_server(
            make_cluster(), {**secret, "ca.crt": other["ca.crt"]}, source="web/1", now=NOW
        )


@pytest.mark.parametrize(
    "start", [NOW - datetime.timedelta(days=100), NOW + datetime.timedelta(days=2)]
)
def test_an_expired_or_not_yet_valid_certificate_is_refused(start: datetime.datetime) -> None:
    secret, _ = cert_manager_server((HOST,), start=start)
    with pytest.raises(ValueError, match="does not verify"):
        tls.user_server(make_cluster(), secret, source="web/1", now=NOW)


def test_a_mariadb_servers_certificate_must_cover_the_names_replicas_verify() -> None:
    database = v1alpha1.Database.model_validate(
        {
            "apiVersion": "stateward.io/v1alpha1",
            "kind": "Database",
            "metadata": {"name": "shop", "namespace": "db"},
            "spec": {
                "engine": "mariadb",
                "version": "10.11",
                "replicas": 3,
                "storage": {"size": "1Gi"},
                "tls": {"serverSecretName": "w"},
            },
        }
    )
    primary = f"{database.primary_service_name}.db.svc"
    members = f"*.{database.headless_service_name}.db.svc.cluster.local"
    assert tls.required_names(database) == (
        primary,
        f"shop-0.{database.headless_service_name}.db.svc.cluster.local",
    )
    only_primary, _ = cert_manager_server((primary,))
    with pytest.raises(ValueError, match="does not verify for shop-0"):
        tls.user_server(database, only_primary, source="w/1", now=NOW)
    both, _ = cert_manager_server((primary, members))
    assert tls.user_server(database, both, source="w/1", now=NOW).source == "w/1"


def test_the_served_copy_follows_the_users_secret() -> None:
    secret, _ = cert_manager_server((HOST,))
    cluster = make_cluster(tls={"serverSecretName": "web"})
    body, authority = served_by_user(secret, cluster)
    ca = pki.fingerprint(authority.trusted_pem)
    now = datetime.datetime.now(datetime.UTC)
    assert tls.server_source(body) == "web/7"
    assert tls.renewal_reason(cluster, body, ca_fingerprint=ca, now=now, server="web/7") is None
    # cert-manager renewed it (a new resourceVersion): copied again.
    assert (
        tls.renewal_reason(cluster, body, ca_fingerprint=ca, now=now, server="web/8")
        == "Secret web (spec.tls.serverSecretName) changed"
    )
    # serverSecretName unset: the cluster's CA signs a serving certificate again.
    assert (
        tls.renewal_reason(cluster, body, ca_fingerprint=ca, now=now)
        == "spec.tls.serverSecretName is unset"
    )
    # A certificate of the cluster's CA is replaced by the user's once it is asked for.
    own = tls.server_secret(
        cluster,
        cert=authority.issue(common_name="x", hosts=(HOST,), server=True).cert,
        key=b"k",
        ca_cert=authority.trusted_pem,
        clients={s: (b, b"k") for s, b in ((s, body_cert(body, s)) for s in tls.CLIENTS)},
    )
    assert tls.server_source(own) is None
    assert (
        tls.renewal_reason(cluster, own, ca_fingerprint=ca, now=now, server="web/7")
        == "Secret web (spec.tls.serverSecretName) changed"
    )
    # The clients' certificates are still renewed in their last month.
    late = now + datetime.timedelta(days=340)
    assert "expires" in str(
        tls.renewal_reason(cluster, body, ca_fingerprint=ca, now=late, server="web/7")
    )


def body_cert(body: dict[str, Any], stem: str) -> bytes:
    return decoded(body)[f"{stem}.crt"]


@pytest.mark.parametrize(
    ("days_left", "problem"), [(30, None), (8, None), (6, "expires at"), (-1, "expired at")]
)
def test_a_users_certificate_near_its_end_is_a_problem_that_says_what_to_do(
    days_left: int, problem: str | None
) -> None:
    secret, _ = cert_manager_server((HOST,))
    body, _ = served_by_user(secret)
    ends = x509.load_pem_x509_certificate(secret["tls.crt"]).not_valid_after_utc
    now = ends - datetime.timedelta(days=days_left)
    message = tls.server_expiry_problem("web", body, now)
    if problem is None:
        assert message is None
    else:
        assert message is not None and problem in message
        assert "spec.tls.serverSecretName" in message and "renew it" in message
    assert tls.server_expiry_problem("web", None, now) is None


def test_a_server_secret_name_must_be_a_secret_name() -> None:
    assert make_cluster().user_server_secret_name is None
    assert make_cluster(tls={"serverSecretName": "web"}).user_server_secret_name == "web"
    with pytest.raises(ValueError, match=r"serverSecretName|server_secret_name"):
        make_cluster(tls={"serverSecretName": "Not_A_Name"})
