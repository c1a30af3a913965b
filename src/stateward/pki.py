"""X.509 certificates in memory: a CA that issues client and serving certificates.

Two users, neither of which owns it: the local control plane (``local/pki.py`` keeps its CA
and every component's certificate on disk) and the operator's admission webhook
(``runtime/webhook.py`` keeps its CA and serving certificate in a Secret). Production code
must not import the dev cluster's package to make a certificate, and the dev cluster must
not import the runtime, so the builder lives here, below both. A leaf: it imports nothing
else of Stateward (an import-linter contract in ``pyproject.toml``).

Everything is PEM bytes in and out; where they are kept is the caller's business.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import ipaddress
import os
import ssl

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "VALIDITY",
    "Authority",
    "Issued",
    "client_context",
    "fingerprint",
    "key_matches",
    "not_after",
    "pem_chain",
    "rsa_key",
    "subject_alt_names",
]

VALIDITY = datetime.timedelta(days=365)
"""Validity of an issued certificate; a CA is valid ten times as long."""


@dataclasses.dataclass(frozen=True)
class Issued:
    """A certificate and its private key, PEM. The key never appears in a repr."""

    cert: bytes
    key: bytes = dataclasses.field(repr=False)


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common_name: str, groups: tuple[str, ...] = ()) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    attributes += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, group) for group in groups]
    return x509.Name(attributes)


_SigningKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


class Authority:
    """A CA held in memory: a self-signed one of our own (EC P-256), or one loaded from PEM
    (EC or RSA, self-signed or an intermediate)."""

    def __init__(
        self, cert: x509.Certificate, key: _SigningKey, chain: bytes | None = None
    ) -> None:
        self.certificate, self._key, self._chain = cert, key, chain

    @classmethod
    def new(cls, common_name: str, *, now: datetime.datetime | None = None) -> Authority:
        key = ec.generate_private_key(ec.SECP256R1())
        now = now or datetime.datetime.now(datetime.UTC)
        name = _name(common_name)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY * 10)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .sign(key, hashes.SHA256())
        )
        return cls(cert, key)

    @classmethod
    def load(cls, cert: bytes, key: bytes) -> Authority:
        """The CA whose certificate is the first in ``cert`` (PEM; a chain may follow) and
        whose unencrypted private key is ``key``. ValueError, saying what is wrong, unless
        the certificate may sign certificates and the key is its own."""
        # The parsers' own messages are replaced: they may be long, and they never help.
        try:
            private = serialization.load_pem_private_key(key, password=None)
        except TypeError:
            raise ValueError("the key is encrypted") from None
        except ValueError:
            raise ValueError("the key is not a PEM private key") from None
        if not isinstance(private, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
            raise ValueError("the CA key must be an EC or RSA key")
        try:
            certificate = x509.load_pem_x509_certificate(cert)
        except ValueError:
            raise ValueError("the certificate is not a PEM certificate") from None
        try:
            constraints = certificate.extensions.get_extension_for_class(x509.BasicConstraints)
            is_ca = constraints.value.ca
        except x509.ExtensionNotFound:
            is_ca = False
        if not is_ca:
            raise ValueError("the certificate is not a CA's (basicConstraints CA:TRUE)")
        try:
            usage = certificate.extensions.get_extension_for_class(x509.KeyUsage).value
        except x509.ExtensionNotFound:
            usage = None
        if usage is not None and not usage.key_cert_sign:
            raise ValueError("the CA certificate may not sign certificates (keyCertSign)")
        encoding, form = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        if certificate.public_key().public_bytes(encoding, form) != private.public_key(
        ).public_bytes(encoding, form):  # fmt: skip
            raise ValueError("the key is not the CA certificate's")
        return cls(certificate, private, pem_chain(cert))

    @property
    def not_after(self) -> datetime.datetime:
        return self.certificate.not_valid_after_utc

    @property
    def intermediates_pem(self) -> bytes:
        """The certificates a verifier that trusts only the root needs beside what this CA
        signs: those of its chain that a root did not issue to itself (none for our own)."""
        if not self._chain:
            return b""
        return b"".join(
            cert.public_bytes(serialization.Encoding.PEM)
            for cert in x509.load_pem_x509_certificates(self._chain)
            if cert.subject != cert.issuer
        )

    @property
    def trusted_pem(self) -> bytes:
        """What verifiers of its certificates trust: the CA's certificate and the chain it
        was loaded with (an intermediate's root)."""
        return self._chain or self.cert_pem

    @property
    def cert_pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return _key_pem(self._key)

    def issue(
        self,
        *,
        common_name: str,
        groups: tuple[str, ...] = (),
        hosts: tuple[str, ...] = (),
        server: bool = False,
        validity: datetime.timedelta = VALIDITY,
        now: datetime.datetime | None = None,
    ) -> Issued:
        """A client certificate (CN = user, O = groups, as kube-apiserver's x509
        authenticator reads them), or with ``server`` a serving one for ``hosts``."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = now or datetime.datetime.now(datetime.UTC)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name, groups))
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + validity)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            # Python 3.13's default TLS context verifies strictly (VERIFY_X509_STRICT) and
            # refuses a chain without key identifiers: Patroni on trixie is such a client.
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(
                    self.certificate.public_key()  # type: ignore[arg-type]
                ),
                False,
            )
        )
        if hosts:
            names: list[x509.GeneralName] = []
            for host in hosts:
                try:
                    names.append(x509.IPAddress(ipaddress.ip_address(host)))
                except ValueError:
                    names.append(x509.DNSName(host))
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def rsa_key() -> bytes:
    """A new RSA-2048 private key, PEM (service-account token signing)."""
    return _key_pem(rsa.generate_private_key(public_exponent=65537, key_size=2048))


def pem_chain(*pems: bytes) -> bytes:
    """The certificates of ``pems`` (PEM, each any number), in order, each once: one PEM
    bundle. ValueError when there is none, or a block is not a certificate."""
    seen: set[bytes] = set()
    out: list[bytes] = []
    for pem in pems:
        if not pem.strip():
            continue
        for cert in x509.load_pem_x509_certificates(pem):
            der = cert.public_bytes(serialization.Encoding.DER)
            if der not in seen:
                seen.add(der)
                out.append(cert.public_bytes(serialization.Encoding.PEM))
    if not out:
        raise ValueError("no certificate")
    return b"".join(out)


def fingerprint(cert: bytes) -> str:
    """SHA-256 of the certificate's DER form, hex: what ``openssl x509 -fingerprint -sha256``
    prints, without colons. Takes PEM or DER."""
    der = (
        x509.load_pem_x509_certificate(cert).public_bytes(serialization.Encoding.DER)
        if cert.lstrip().startswith(b"-----")
        else cert
    )
    return hashlib.sha256(der).hexdigest()


def not_after(cert: bytes) -> datetime.datetime:
    return x509.load_pem_x509_certificate(cert).not_valid_after_utc


def subject_alt_names(cert: bytes) -> set[str]:
    """The DNS names and IP addresses a PEM certificate is valid for."""
    parsed = x509.load_pem_x509_certificate(cert)
    try:
        names = parsed.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    covered = {str(n) for n in names.get_values_for_type(x509.DNSName)}
    covered |= {str(ip) for ip in names.get_values_for_type(x509.IPAddress)}
    return covered


def key_matches(cert: bytes, key: bytes) -> bool:
    """True when the PEM private key is the one the PEM certificate was issued for."""
    public = x509.load_pem_x509_certificate(cert).public_key()
    private = serialization.load_pem_private_key(key, password=None)
    encoding, form = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    return bool(
        public.public_bytes(encoding, form) == private.public_key().public_bytes(encoding, form)
    )


def client_context(*, ca: bytes, cert: bytes, key: bytes) -> ssl.SSLContext:
    """A TLS client context that shows ``cert`` and trusts only ``ca``, checking the chain
    but not the name (servers addressed by IP). The certificate and key are handed to
    OpenSSL through anonymous memory files: they never touch a disk."""
    context = ssl.create_default_context(cadata=ca.decode())
    context.check_hostname = False
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    cert_fd, key_fd = os.memfd_create("cert"), os.memfd_create("key")
    try:
        os.write(cert_fd, cert)
        os.write(key_fd, key)
        context.load_cert_chain(f"/proc/self/fd/{cert_fd}", f"/proc/self/fd/{key_fd}")
    finally:
        os.close(cert_fd)
        os.close(key_fd)
    return context
