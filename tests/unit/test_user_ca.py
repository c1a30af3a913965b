"""A user's own CA (``spec.tls.caSecretName``): which Secrets hold a usable one, what is
trusted, how long what it signs may last, and when its end is a problem."""

from __future__ import annotations

import base64
import datetime
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509 import DNSName
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

from stateward import pki
from stateward.api import v1alpha1
from stateward.specs import database as database_spec
from stateward.specs import tls
from tests.support.certificates import cert_manager_ca, certificate, pem, pem_key
from tests.support.clusters import make_cluster

pytestmark = pytest.mark.unit

NOW = datetime.datetime(2026, 12, 4, 12, 0, tzinfo=datetime.UTC)


def test_a_cert_manager_ca_secret_signs_and_its_root_is_trusted_beside_it() -> None:
    secret, root = cert_manager_ca()
    chain, key = tls.user_ca(secret)
    authority = pki.Authority.load(chain, key)
    assert authority.certificate.subject.rfc4514_string() == "CN=Example DB CA"
    # Everything that verifies the servers trusts the intermediate and the root.
    assert x509.load_pem_x509_certificates(authority.trusted_pem) == [
        x509.load_pem_x509_certificate(secret["tls.crt"]),
        root,
    ]
    issued = authority.issue(common_name="demo", hosts=("demo-primary",), server=True, now=NOW)
    leaf = x509.load_pem_x509_certificate(issued.cert)
    leaf.verify_directly_issued_by(authority.certificate)
    assert pki.fingerprint(authority.trusted_pem) == pki.fingerprint(secret["tls.crt"])


def test_what_an_intermediate_signs_verifies_against_the_root_alone() -> None:
    """A client that trusts only the organisation's root (sslmode=verify-full with its
    bundle) gets the intermediate from the server: the certificate file carries it."""
    secret, root = cert_manager_ca()
    authority = pki.Authority.load(*tls.user_ca(secret))
    assert authority.intermediates_pem == secret["tls.crt"]
    issued = authority.issue(common_name="demo", hosts=("demo-primary.db.svc",), server=True)
    served = x509.load_pem_x509_certificates(issued.cert + authority.intermediates_pem)
    verifier = (
        PolicyBuilder().store(Store([root])).build_server_verifier(DNSName("demo-primary.db.svc"))
    )
    verifier.verify(served[0], served[1:])
    with pytest.raises(VerificationError):
        verifier.verify(served[0], [])  # the leaf alone does not chain to the root
    # Our own CA is a root: nothing travels beside what it signs.
    assert pki.Authority.new("own").intermediates_pem == b""
    own = pki.Authority.new("own")
    assert pki.Authority.load(own.cert_pem, own.key_pem).intermediates_pem == b""


def test_a_ca_crt_and_ca_key_pair_is_taken_when_there_is_no_tls_pair() -> None:
    own = pki.Authority.new("mine")
    chain, key = tls.user_ca({"ca.crt": own.cert_pem, "ca.key": own.key_pem})
    assert pki.Authority.load(chain, key).cert_pem == own.cert_pem


def test_a_chain_in_tls_crt_keeps_each_certificate_once_with_the_signer_first() -> None:
    secret, root = cert_manager_ca()
    chain, _ = tls.user_ca({**secret, "tls.crt": secret["tls.crt"] + pem(root)})
    assert [c.subject.rfc4514_string() for c in x509.load_pem_x509_certificates(chain)] == [
        "CN=Example DB CA",
        "CN=Example Root",
    ]


@pytest.mark.parametrize(
    "keys", [set(), {"tls.crt"}, {"tls.key"}, {"ca.crt"}, {"ca.key"}, {"tls.crt", "ca.key"}]
)
def test_a_secret_without_a_certificate_and_key_pair_names_the_keys_it_needs(
    keys: set[str],
) -> None:
    secret, _ = cert_manager_ca()
    data = {key: secret.get(key, secret["tls.key"]) for key in keys}
    with pytest.raises(
        ValueError, match=r"neither tls\.crt and tls\.key .* nor ca\.crt and ca\.key"
    ):
        tls.user_ca(data)


def test_a_certificate_that_is_not_a_ca_is_refused() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = certificate("server", key, ca=False)
    with pytest.raises(ValueError, match="not a CA's"):
        pki.Authority.load(pem(leaf), pem_key(key))


def test_a_ca_that_may_not_sign_certificates_is_refused() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    with pytest.raises(ValueError, match="keyCertSign"):
        pki.Authority.load(pem(certificate("ca", key, sign=False)), pem_key(key))


def test_a_key_that_is_not_the_certificates_is_refused() -> None:
    secret, _ = cert_manager_ca()
    other = pem_key(ec.generate_private_key(ec.SECP256R1()))
    with pytest.raises(ValueError, match="not the CA certificate's"):
        pki.Authority.load(secret["tls.crt"], other)


@pytest.mark.parametrize(
    ("cert", "key", "problem"),
    [
        (b"ok", b"secret-key-material", "the key is not a PEM private key"),
        (b"-----BEGIN CERTIFICATE-----\nc2VjcmV0\n", None, "the certificate is not a PEM"),
        (None, "encrypted", "the key is encrypted"),
    ],
)
def test_what_cannot_be_parsed_is_named_without_quoting_it(
    cert: bytes | None, key: bytes | str | None, problem: str
) -> None:
    secret, _ = cert_manager_ca()
    own = ec.generate_private_key(ec.SECP256R1())
    if key == "encrypted":
        key = own.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"pass"),
        )
    with pytest.raises(ValueError, match=problem) as error:
        pki.Authority.load(
            secret["tls.crt"] if cert in (None, b"ok") else cert,  # type: ignore[arg-type]
            secret["tls.key"] if key is None else key,  # type: ignore[arg-type]
        )
    assert "secret-key-material" not in str(error.value)
    assert "c2VjcmV0" not in str(error.value)


def test_a_copy_of_the_users_ca_records_where_it_came_from() -> None:
    secret, _ = cert_manager_ca()
    chain, key = tls.user_ca(secret)
    body = tls.ca_secret(make_cluster(), cert=chain, key=key, source="corp-ca/42")
    assert tls.ca_source(body) == "corp-ca/42"
    assert tls.recorded_ca_fingerprint(body) == pki.fingerprint(secret["tls.crt"])
    data = {k: base64.b64decode(v) for k, v in body["data"].items()}
    assert data == {"ca.crt": chain, "ca.key": key}
    intermediate = x509.load_pem_x509_certificate(secret["tls.crt"])
    assert tls.recorded_not_after(body) == intermediate.not_valid_after_utc


def test_pem_chain_needs_a_certificate() -> None:
    with pytest.raises(ValueError, match="no certificate"):
        pki.pem_chain(b"", b"  \n")


@pytest.mark.parametrize(
    ("ca_days", "validity_days"), [(3650, 365), (400, 365), (100, 100), (0, 0), (-5, 0)]
)
def test_what_a_ca_signs_never_outlives_it(ca_days: int, validity_days: int) -> None:
    ca_end = NOW + datetime.timedelta(days=ca_days)
    assert tls.validity_under(ca_end, NOW) == datetime.timedelta(days=validity_days)


def serving_until(days: int) -> dict[str, Any]:
    end = (NOW + datetime.timedelta(days=days)).strftime("%Y-%m-%dT%H:%M:%SZ")
    cluster = make_cluster()
    return {
        "metadata": {
            "annotations": {
                tls.CA_FINGERPRINT_ANNOTATION: "f",
                tls.NOT_AFTER_ANNOTATION: end,
                tls.NAMES_ANNOTATION: tls.names_digest(tls.server_names(cluster), tls.CLIENTS),
            }
        }
    }


@pytest.mark.parametrize(
    ("cert_days", "ca_days", "reissued"),
    [
        (10, 3650, True),  # the CA lasts: renew
        (10, 10, False),  # it already ends with its CA: issuing again gains nothing
        (10, 9, False),
        (10, 200, True),  # a renewed CA: the certificate can last longer again
        (100, 100, False),  # not in its last month
    ],
)
def test_a_certificate_ending_with_its_ca_is_not_issued_again_and_again(
    cert_days: int, ca_days: int, reissued: bool
) -> None:
    reason = tls.renewal_reason(
        make_cluster(),
        serving_until(cert_days),
        ca_fingerprint="f",
        now=NOW,
        ca_not_after=NOW + datetime.timedelta(days=ca_days),
    )
    assert (reason is not None) is reissued


@pytest.mark.parametrize(
    ("ca_days", "expected"),
    [(3650, None), (31, None), (30, "expires at 2027-01-03T12:00:00Z"), (0, "expired at")],
)
def test_a_ca_in_its_last_month_is_a_problem_that_says_what_to_do(
    ca_days: int, expected: str | None
) -> None:
    problem = tls.ca_expiry_problem("demo-ca", NOW + datetime.timedelta(days=ca_days), NOW)
    if expected is None:
        assert problem is None
    else:
        assert problem is not None
        assert expected in problem
        assert "Secret demo-ca" in problem and "renew the CA" in problem


def test_an_unrecorded_ca_end_is_no_problem_yet() -> None:
    assert tls.ca_expiry_problem("demo-ca", None, NOW) is None
    assert tls.recorded_not_after({"metadata": {}}) is None
    assert tls.recorded_not_after(None) is None


def test_a_cluster_names_the_users_ca_secret() -> None:
    assert make_cluster().user_ca_secret_name is None
    assert make_cluster(tls={"caSecretName": "corp-ca"}).user_ca_secret_name == "corp-ca"


@pytest.mark.parametrize("name", ["Corp-CA", "-ca", "ca_1", "a" * 254, ""])
def test_a_ca_secret_name_must_be_a_secret_name(name: str) -> None:
    with pytest.raises(ValueError, match=r"caSecretName|ca_secret_name"):
        make_cluster(tls={"caSecretName": name})


def postgres_database(**spec: Any) -> v1alpha1.Database:
    return v1alpha1.Database.model_validate(
        {
            "metadata": {"name": "shop", "namespace": "db", "uid": "u-1"},
            "spec": {
                "engine": "postgres", "version": "16", "replicas": 3,
                "storage": {"size": "1Gi"}, **spec,
            },
        }
    )  # fmt: skip


def test_a_postgres_database_hands_its_ca_and_network_policy_to_its_cluster() -> None:
    peers = [{"podSelector": {"matchLabels": {"app": "web"}}}]
    cluster = database_spec.postgres_cluster(
        postgres_database(tls={"caSecretName": "corp-ca"}, networkPolicy={"clients": peers})
    )
    assert cluster["spec"]["tls"] == {"caSecretName": "corp-ca"}
    assert cluster["spec"]["networkPolicy"] == {"clients": peers}
    # Validates as the PostgresCluster's own spec.
    assert v1alpha1.PostgresClusterSpec.model_validate(cluster["spec"]).tls.ca_secret_name == (
        "corp-ca"
    )


def test_a_postgres_database_with_defaults_hands_over_nothing_more() -> None:
    spec = database_spec.postgres_cluster(postgres_database())["spec"]
    assert set(spec) == {"version", "replicas", "storageSize"}
    closed = database_spec.postgres_cluster(postgres_database(networkPolicy={"clients": []}))
    assert closed["spec"]["networkPolicy"] == {"clients": []}
