"""The local cluster's S3 object store: versitygw over a directory, for backups.

With real nodes, ``local up`` runs versitygw (an S3 gateway whose posix backend keeps each
bucket as a directory and each object as a file) on the host's bridge address, serving TLS
with a certificate from the local CA. Pods reach it as an ordinary Service,
``https://stateward-objectstore.kube-system.svc``, whose EndpointSlice points at the host
(the ``kubernetes`` Service reaches the API server the same way). Its root credentials are
generated at ``up`` and put, with the CA certificate, in the Secret
``default/stateward-objectstore`` that a PostgresCluster's ``spec.backup`` refers to.

Production clusters use their own object store (AWS S3, GCS in S3 mode, Ceph RGW, MinIO...);
nothing in the operator depends on this one.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
from pathlib import Path
from typing import Any, Final

from stateward_local.nodes import layout

PORT: Final = 7070
"""versitygw's own default port, on the bridge address only."""
SERVICE_PORT: Final = 443
SERVICE_NAME: Final = "stateward-objectstore"
SERVICE_NAMESPACE: Final = "kube-system"
SECRET_NAME: Final = "stateward-objectstore"  # noqa: S105 - a name
SECRET_NAMESPACE: Final = "default"  # noqa: S105 - a namespace
BUCKET: Final = "stateward"
"""Created at ``up``; clusters keep their repositories under their own path in it."""
REGION: Final = "us-east-1"
ACCESS_KEY_KEY: Final = "accessKeyId"
SECRET_KEY_KEY: Final = "secretAccessKey"  # noqa: S105 - a key name
CA_KEY: Final = "ca.crt"
MANAGED_BY: Final = "local.stateward.io"
"""EndpointSlice owner label: the EndpointSlice controller leaves slices it does not manage
alone (the Service has no selector)."""


def endpoint() -> str:
    """The host name pods connect to; the serving certificate names it."""
    return f"{SERVICE_NAME}.{SERVICE_NAMESPACE}.svc"


def certificate_hosts(slot: layout.Slot) -> tuple[str, ...]:
    return (
        endpoint(),
        f"{endpoint()}.{layout.CLUSTER_DOMAIN}",
        f"{SERVICE_NAME}.{SERVICE_NAMESPACE}",
        slot.host_ip,
    )


@dataclasses.dataclass(frozen=True)
class Credentials:
    access_key_id: str
    secret_access_key: str = dataclasses.field(repr=False)

    @classmethod
    def generate(cls) -> Credentials:
        # S3 access keys are upper-case alphanumerics by convention; secrets are free-form.
        return cls(
            access_key_id="SW" + secrets.token_hex(9).upper(),
            secret_access_key=secrets.token_urlsafe(30),
        )

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.chmod(0o600)
        path.write_text(json.dumps(dataclasses.asdict(self)))

    @classmethod
    def load(cls, path: Path) -> Credentials:
        data = json.loads(path.read_text())
        return cls(data["access_key_id"], data["secret_access_key"])

    def environment(self) -> dict[str, str]:
        """versitygw's root account, from its environment rather than its command line
        (which every user of the host can read in /proc)."""
        return {
            "ROOT_ACCESS_KEY_ID": self.access_key_id,
            "ROOT_SECRET_ACCESS_KEY": self.secret_access_key,
        }


def argv(binary: Path, *, root: Path, cert: Path, key: Path, slot: layout.Slot) -> list[str]:
    """versitygw serving on the host's address on the slot's bridge."""
    return [
        str(binary),
        "--port",
        f"{slot.host_ip}:{PORT}",
        "--cert",
        str(cert),
        "--key",
        str(key),
        "--region",
        REGION,
        "--quiet",
        "posix",
        str(root),
    ]


def service() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": SERVICE_NAME, "namespace": SERVICE_NAMESPACE},
        "spec": {
            "ports": [
                {"name": "https", "port": SERVICE_PORT, "targetPort": PORT, "protocol": "TCP"}
            ]
        },
    }


def endpoint_slice(slot: layout.Slot) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": SERVICE_NAME,
            "namespace": SERVICE_NAMESPACE,
            "labels": {
                "kubernetes.io/service-name": SERVICE_NAME,
                "endpointslice.kubernetes.io/managed-by": MANAGED_BY,
            },
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [slot.host_ip], "conditions": {"ready": True}}],
        "ports": [{"name": "https", "port": PORT, "protocol": "TCP"}],
    }


def secret(credentials: Credentials, *, ca_pem: str) -> dict[str, Any]:
    """What a PostgresCluster's ``spec.backup.repository.s3`` names: keys and the CA."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SECRET_NAME, "namespace": SECRET_NAMESPACE},
        "type": "Opaque",
        "stringData": {
            ACCESS_KEY_KEY: credentials.access_key_id,
            SECRET_KEY_KEY: credentials.secret_access_key,
            CA_KEY: ca_pem,
        },
    }


def repository(path: str) -> dict[str, Any]:
    """A ``spec.backup.repository`` for this store, ``path`` inside the bucket."""
    return {
        "s3": {
            "endpoint": endpoint(),
            "bucket": BUCKET,
            "region": REGION,
            "path": path,
            "credentialsSecret": SECRET_NAME,
            "caKey": CA_KEY,
        }
    }
