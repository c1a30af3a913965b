"""Certificates and keys for the local control plane, kept on disk.

One self-signed CA signs the API server's serving certificate and a client certificate per
component (CN = user name, O = groups, as kube-apiserver's x509 authenticator reads them).
A separate RSA key signs service-account tokens. The certificates themselves are made by
:mod:`stateward.pki`, which the operator's webhook uses too; this module only decides where
the files go.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from stateward import pki

VALIDITY = pki.VALIDITY
CA_NAME = "stateward-local-ca"


@dataclasses.dataclass(frozen=True)
class CertPair:
    cert: Path
    key: Path


def _write_key(path: Path, key: bytes) -> None:
    path.write_bytes(key)
    path.chmod(0o600)


class Authority:
    """A certificate authority kept on disk as ``ca.crt``/``ca.key`` in ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.cert_path = directory / "ca.crt"
        key_path = directory / "ca.key"
        if self.cert_path.exists() and key_path.exists():
            self._authority = pki.Authority.load(self.cert_path.read_bytes(), key_path.read_bytes())
            return
        directory.mkdir(parents=True, exist_ok=True)
        self._authority = pki.Authority.new(CA_NAME)
        _write_key(key_path, self._authority.key_pem)
        self.cert_path.write_bytes(self._authority.cert_pem)

    def issue(
        self,
        stem: str,
        *,
        common_name: str,
        groups: tuple[str, ...] = (),
        hosts: tuple[str, ...] = (),
        server: bool = False,
    ) -> CertPair:
        """Issue ``<stem>.crt``/``<stem>.key``: a client certificate, or a serving one."""
        issued = self._authority.issue(
            common_name=common_name, groups=groups, hosts=hosts, server=server
        )
        pair = CertPair(self.directory / f"{stem}.crt", self.directory / f"{stem}.key")
        pair.cert.write_bytes(issued.cert)
        _write_key(pair.key, issued.key)
        return pair


def service_account_key(path: Path) -> Path:
    """An RSA key whose private half signs service-account tokens and public half checks them."""
    _write_key(path, pki.rsa_key())
    return path
