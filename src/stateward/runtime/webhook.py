"""The validating admission webhook, served by every operator replica.

Validation is stateless (``api.validation.validate_spec``), so every replica answers it,
leader or standby: admission does not depend on who holds the Lease, and a standby is Ready.

Certificates: one CA and serving certificate shared by all replicas through the Secret
``stateward-webhook-cert`` in the operator's namespace. The first replica to start makes it
(create; a conflict means another replica won, and its Secret is used). The leader keeps the
``ValidatingWebhookConfiguration`` ``stateward.io`` pointing at the webhook with that CA.

Admission is a second line behind the CRD's CEL rules, which hold even without the operator;
``failurePolicy: Ignore`` keeps PostgresCluster writes possible while no replica answers.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import logging
import ssl
import tempfile
from pathlib import Path
from typing import Any

from aiohttp import web
from cryptography import x509
from lightkube import ApiError, AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Secret

from stateward.api import v1alpha1, validation
from stateward.controllers import diff
from stateward.controllers.kube import Kube
from stateward.local import pki

logger = logging.getLogger(__name__)

CONFIGURATION_NAME = "stateward.io"
WEBHOOK_NAME = "postgresclusters.validation.stateward.io"
PATH = "/validate/postgresclusters"
CERT_SECRET = "stateward-webhook-cert"  # noqa: S105 - a Secret name, not a secret
RENEW_BEFORE = datetime.timedelta(days=30)


def review_response(review: dict[str, Any]) -> dict[str, Any]:
    """The AdmissionReview answer for one request (pure)."""
    request = review.get("request") or {}
    new = (request.get("object") or {}).get("spec") or {}
    old_object = request.get("oldObject")
    problems = validation.validate_spec(new, (old_object or {}).get("spec") if old_object else None)
    response: dict[str, Any] = {"uid": request.get("uid", ""), "allowed": not problems}
    if problems:
        response["status"] = {"code": 422, "reason": "Invalid", "message": "; ".join(problems)}
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": response,
    }


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """Where the API server reaches the webhook: a Service in-cluster, or a URL (local)."""

    namespace: str
    port: int
    service: str | None = None
    host: str | None = None

    def hosts(self) -> tuple[str, ...]:
        names = {"localhost", "127.0.0.1"}
        if self.service:
            base = f"{self.service}.{self.namespace}.svc"
            names |= {base, f"{base}.cluster.local", self.service}
        if self.host:
            names.add(self.host)
        return tuple(sorted(names))

    def client_config(self, ca: bytes) -> dict[str, Any]:
        bundle = base64.b64encode(ca).decode()
        if self.service:
            return {
                "service": {
                    "namespace": self.namespace,
                    "name": self.service,
                    "port": 443,
                    "path": PATH,
                },
                "caBundle": bundle,
            }
        return {"url": f"https://{self.host or '127.0.0.1'}:{self.port}{PATH}", "caBundle": bundle}


def webhook_configuration(endpoint: Endpoint, ca: bytes) -> dict[str, Any]:
    """The ValidatingWebhookConfiguration that routes PostgresCluster writes to us (pure)."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {
            "name": CONFIGURATION_NAME,
            "labels": {"app.kubernetes.io/managed-by": "stateward"},
        },
        "webhooks": [
            {
                "name": WEBHOOK_NAME,
                "clientConfig": endpoint.client_config(ca),
                "rules": [
                    {
                        "apiGroups": [v1alpha1.GROUP],
                        "apiVersions": [v1alpha1.VERSION],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": [v1alpha1.PLURAL],
                        "scope": "Namespaced",
                    }
                ],
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Ignore",
                "matchPolicy": "Equivalent",
                "timeoutSeconds": 5,
            }
        ],
    }


@dataclasses.dataclass(frozen=True)
class Certificate:
    ca: bytes
    cert: bytes
    key: bytes

    def usable_for(self, hosts: tuple[str, ...]) -> bool:
        parsed = x509.load_pem_x509_certificate(self.cert)
        try:
            names = parsed.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        except x509.ExtensionNotFound:
            return False
        covered = {str(n) for n in names.get_values_for_type(x509.DNSName)}
        covered |= {str(ip) for ip in names.get_values_for_type(x509.IPAddress)}
        fresh = parsed.not_valid_after_utc - datetime.datetime.now(datetime.UTC) > RENEW_BEFORE
        return fresh and set(hosts) <= covered


def _make_certificate(hosts: tuple[str, ...]) -> Certificate:
    with tempfile.TemporaryDirectory(prefix="stateward-webhook-") as directory:
        authority = pki.Authority(Path(directory))
        pair = authority.issue("webhook", common_name=hosts[0], hosts=hosts, server=True)
        return Certificate(
            ca=authority.cert_path.read_bytes(),
            cert=pair.cert.read_bytes(),
            key=pair.key.read_bytes(),
        )


async def ensure_certificate(client: AsyncClient, endpoint: Endpoint) -> Certificate:
    """The shared webhook certificate: read from its Secret, or made and stored there."""
    hosts = endpoint.hosts()
    for _ in range(5):
        try:
            secret = await client.get(Secret, CERT_SECRET, namespace=endpoint.namespace)
        except ApiError as error:
            if error.status.code != 404:
                raise
            secret = None
        if secret is not None and secret.data:
            found = Certificate(
                *(base64.b64decode(secret.data[k]) for k in ("ca.crt", "tls.crt", "tls.key"))
            )
            if found.usable_for(hosts):
                return found
        made = _make_certificate(hosts)
        data = {
            "ca.crt": base64.b64encode(made.ca).decode(),
            "tls.crt": base64.b64encode(made.cert).decode(),
            "tls.key": base64.b64encode(made.key).decode(),
        }
        try:
            if secret is None:
                await client.create(
                    Secret(
                        metadata=ObjectMeta(
                            name=CERT_SECRET,
                            namespace=endpoint.namespace,
                            labels={"app.kubernetes.io/managed-by": "stateward"},
                        ),
                        type="kubernetes.io/tls",
                        data=data,
                    )
                )
            else:
                secret.data = data
                await client.replace(secret)  # carries resourceVersion: racing replicas conflict
            logger.info("stored a new webhook certificate for %s", ", ".join(hosts))
            return made
        except ApiError as error:
            if error.status.code != 409:
                raise
            # Another replica stored one first: use it.
    raise RuntimeError("could not agree on a webhook certificate after 5 attempts")


async def ensure_configuration(kube: Kube, endpoint: Endpoint, certificate: Certificate) -> bool:
    """Point the webhook configuration at us (leader only). True if it had to be written."""
    desired = diff.stamped(webhook_configuration(endpoint, certificate.ca))
    observed = await kube.get(
        "admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration", "", CONFIGURATION_NAME
    )
    if observed is not None and not diff.drift(observed, desired):
        return False
    await kube.apply(desired)
    return True


class AdmissionServer:
    """HTTPS server answering AdmissionReviews; runs for the whole life of the process."""

    def __init__(self, *, address: str, port: int, certificate: Certificate) -> None:
        self.address, self.port, self.certificate = address, port, certificate
        self._runner: web.AppRunner | None = None

    def _ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        with tempfile.TemporaryDirectory(prefix="stateward-webhook-") as directory:
            cert, key = Path(directory) / "tls.crt", Path(directory) / "tls.key"
            cert.write_bytes(self.certificate.cert)
            key.write_bytes(self.certificate.key)
            context.load_cert_chain(cert, key)
        return context

    async def start(self) -> None:
        async def validate(request: web.Request) -> web.Response:
            try:
                review = await request.json()
            except ValueError:
                return web.json_response({"error": "not an AdmissionReview"}, status=400)
            return web.json_response(review_response(review))

        app = web.Application()
        app.router.add_post(PATH, validate)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.address, self.port, ssl_context=self._ssl_context())
        await site.start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
