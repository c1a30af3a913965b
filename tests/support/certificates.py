"""Certificates as another PKI makes them (cert-manager, an enterprise CA), for tests of a
user's own CA (``spec.tls.caSecretName``) and serving certificate (``serverSecretName``)."""

from __future__ import annotations

import base64
import datetime
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

NOW = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
Key = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


def pem_key(key: Key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def certificate(
    name: str,
    key: Key,
    *,
    issuer: tuple[x509.Certificate, Key] | None = None,
    ca: bool = True,
    sign: bool = True,
    days: int = 3650,
) -> x509.Certificate:
    """A certificate as another PKI (cert-manager, an enterprise CA) would make it."""
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    signer_cert, signer_key = issuer if issuer else (None, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(signer_cert.subject if signer_cert else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - datetime.timedelta(days=1))
        .not_valid_after(NOW + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=sign,
                crl_sign=sign, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )  # fmt: skip
    return builder.sign(signer_key, hashes.SHA256())


def pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def cert_manager_ca(days: int = 3650) -> tuple[dict[str, bytes], x509.Certificate]:
    """What cert-manager writes for a Certificate with isCA: true issued by a root CA
    issuer (RSA, its default): tls.crt the intermediate, tls.key its key, ca.crt the root."""
    root_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    root = certificate("Example Root", root_key)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    intermediate = certificate("Example DB CA", key, issuer=(root, root_key), days=days)
    secret = {"tls.crt": pem(intermediate), "tls.key": pem_key(key), "ca.crt": pem(root)}
    return secret, root


def leaf(
    name: str,
    issuer: tuple[x509.Certificate, Key],
    *,
    hosts: tuple[str, ...] = (),
    client: bool = False,
    days: int = 90,
    start: datetime.datetime = NOW,
) -> tuple[x509.Certificate, Key]:
    """An end-entity certificate as cert-manager issues one (RSA, 90 days by default): a
    server's for ``hosts``, or with ``client`` a client's whose common name is ``name``."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    signer, signer_key = issuer
    usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(signer.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start - datetime.timedelta(hours=1))
        .not_valid_after(start + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(signer_key.public_key()), False
        )
    )
    if hosts:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(h) for h in hosts]), critical=False
        )
    return builder.sign(signer_key, hashes.SHA256()), key


def cert_manager_server(
    hosts: tuple[str, ...], *, days: int = 90, start: datetime.datetime = NOW
) -> tuple[dict[str, bytes], tuple[x509.Certificate, Key]]:
    """What cert-manager writes for a serving Certificate issued by a CA issuer:
    ``tls.crt`` the certificate, ``tls.key`` its key, ``ca.crt`` the issuer's root; and
    that root with its key (to issue more, e.g. a client certificate)."""
    root_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    root = certificate("Example Web Root", root_key)
    cert, key = leaf(hosts[0], (root, root_key), hosts=hosts, days=days, start=start)
    secret = {"tls.crt": pem(cert), "tls.key": pem_key(key), "ca.crt": pem(root)}
    return secret, (root, root_key)


def tls_secret(name: str, data: dict[str, bytes]) -> dict[str, Any]:
    """The ``kubernetes.io/tls`` Secret cert-manager would write with ``data``."""
    return {
        "metadata": {"name": name},
        "type": "kubernetes.io/tls",
        "data": {key: base64.b64encode(value).decode() for key, value in data.items()},
    }
