"""The validating admission webhook, served by every operator replica.

Validation is stateless (``api.validation.validate_spec``), so every replica answers it,
leader or standby: admission does not depend on who holds the Lease, and a standby is Ready.

Certificates: one CA and serving certificate shared by all replicas through the Secret
``stateward-webhook-cert`` in the operator's namespace. The first replica to start makes it
(create; a conflict means another replica won, and its Secret is used). The leader keeps the
``ValidatingWebhookConfiguration`` ``stateward.io`` pointing at the webhook with that CA.

The Secret can change under a running replica (another replica renewed it, someone replaced
it). Every replica re-reads it periodically (:class:`CertificateMonitor`): a servable new
certificate is loaded into the live TLS context (new handshakes get it), and what the port
really serves — read back by a TLS handshake with itself — is compared with the Secret. A
difference is the gauge ``stateward_webhook_certificate_mismatch`` = 1, a log line and a
Warning Event on the Secret: a replica whose answers the API server can no longer trust
refuses every request that needs it.

Admission never admits what it could not check. The CRD's CEL rules hold without the
operator and say everything CEL can; the webhook checks only what CEL cannot (a schedule
that can never fire, the fenced-instances annotation's JSON). Its ``matchConditions`` send it
exactly the requests that set or change one of those, and ``failurePolicy: Fail`` refuses
them while no replica answers; every other PostgresCluster write never waits for the
operator.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import dataclasses
import datetime
import hashlib
import logging
import ssl
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

from aiohttp import web
from lightkube import ApiError, AsyncClient, codecs
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Secret

from stateward import pki
from stateward.api import v1alpha1, validation
from stateward.controllers import diff
from stateward.controllers.kube import Kube, event_body
from stateward.runtime import metrics

logger = logging.getLogger(__name__)

CONFIGURATION_NAME = "stateward.io"
OWNER_CLUSTER_ROLE = "stateward-operator"
"""The operator's ClusterRole owns the webhook configuration: whatever removes the operator
(``helm uninstall``, ``make undeploy``, ``kubectl delete -k``) removes its ClusterRole, and the
garbage collector then removes a configuration that no replica would serve any more."""
WEBHOOK_NAME = "postgresclusters.validation.stateward.io"
PATH = "/validate/postgresclusters"
CERT_SECRET = "stateward-webhook-cert"  # noqa: S105 - a Secret name, not a secret
RENEW_BEFORE = datetime.timedelta(days=30)
CA_NAME = "stateward-webhook-ca"
SECRET_KEYS = ("ca.crt", "tls.crt", "tls.key")
HANDSHAKE_TIMEOUT = 5.0


def review_response(
    review: dict[str, Any], *, foreign_repository_paths: bool = False
) -> dict[str, Any]:
    """The AdmissionReview answer for one request (pure). ``foreign_repository_paths``: the
    operator's administrator lets repository paths leave their namespace's prefix."""
    request = review.get("request") or {}
    new_object = request.get("object") or {}
    new = new_object.get("spec") or {}
    old_object = request.get("oldObject")
    problems = validation.validate_spec(new, (old_object or {}).get("spec") if old_object else None)
    if not foreign_repository_paths:
        namespace = request.get("namespace") or (new_object.get("metadata") or {}).get(
            "namespace", ""
        )
        problems += validation.repository_path_problems(str(namespace), new)
    problems += validation.validate_annotations(
        (new_object.get("metadata") or {}).get("annotations")
    )
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


def _sets_or_changes(path: str, key: str | None = None) -> str:
    """CEL (a webhook match condition): ``object`` has the field at ``path`` (or the map entry
    ``key`` there), and it is new (CREATE) or differs from ``oldObject``'s."""
    parts = path.split(".")

    def present(root: str) -> str:
        checks = [f"has({root}.{'.'.join(parts[: i + 1])})" for i in range(len(parts))]
        if key is not None:
            checks.append(f"{key!r} in {root}.{path}")
        return " && ".join(checks)

    def value(root: str) -> str:
        return f"{root}.{path}[{key!r}]" if key is not None else f"{root}.{path}"

    return (
        f"({present('object')}) && (oldObject == null || !({present('oldObject')})"
        f" || {value('oldObject')} != {value('object')})"
    )


MATCH_CONDITIONS = [
    {
        "name": "sets-what-only-the-webhook-checks",
        "expression": " || ".join(
            f"({condition})"
            for condition in (
                _sets_or_changes("spec.backupSchedule"),
                _sets_or_changes("spec.backup.repository.s3.path"),
                _sets_or_changes("spec.bootstrap.restore.path"),
                _sets_or_changes("metadata.annotations", v1alpha1.FENCED_INSTANCES_ANNOTATION),
            )
        ),
    }
]
"""The webhook sees only writes that set or change what CEL cannot check: the backup schedule
(a schedule that never fires), a repository path (it must stay in the namespace's prefix, and
CEL cannot read the namespace) and the fenced-instances annotation (JSON). With ``Fail``, an
operator outage blocks just those, and every other write is checked by CEL alone."""


def webhook_configuration(
    endpoint: Endpoint, ca: bytes, *, owner_uid: str | None = None
) -> dict[str, Any]:
    """The ValidatingWebhookConfiguration that routes PostgresCluster writes to us (pure);
    owned by the ClusterRole :data:`OWNER_CLUSTER_ROLE` when its uid is known."""
    metadata: dict[str, Any] = {
        "name": CONFIGURATION_NAME,
        "labels": {"app.kubernetes.io/managed-by": "stateward"},
    }
    if owner_uid:
        metadata["ownerReferences"] = [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "name": OWNER_CLUSTER_ROLE,
                "uid": owner_uid,
            }
        ]
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": metadata,
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
                "matchConditions": MATCH_CONDITIONS,
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                # Only the requests the match conditions select: those CEL cannot check.
                "failurePolicy": "Fail",
                "matchPolicy": "Equivalent",
                "timeoutSeconds": 5,
            }
        ],
    }


@dataclasses.dataclass(frozen=True)
class Certificate:
    """The webhook's CA, serving certificate and key, PEM. The key never appears in a repr."""

    ca: bytes
    cert: bytes
    key: bytes = dataclasses.field(repr=False)

    @classmethod
    def from_secret(cls, secret: Secret | None) -> Certificate | None:
        """The Secret's certificate; None when there is no Secret or it holds no data. A key
        that is missing or not base64 reads as empty, which :meth:`problem` refuses."""
        if secret is None or not secret.data:
            return None
        values: list[bytes] = []
        for name in SECRET_KEYS:
            try:
                values.append(base64.b64decode(secret.data.get(name) or "", validate=True))
            except (binascii.Error, ValueError):
                values.append(b"")
        return cls(*values)

    def secret_data(self) -> dict[str, str]:
        return {
            name: base64.b64encode(value).decode()
            for name, value in zip(SECRET_KEYS, (self.ca, self.cert, self.key), strict=True)
        }

    @property
    def fingerprint(self) -> str | None:
        """SHA-256 of the serving certificate (hex), None if it is not a certificate."""
        try:
            return pki.fingerprint(self.cert)
        except ValueError:
            return None

    def not_after(self) -> datetime.datetime | None:
        try:
            return pki.not_after(self.cert)
        except ValueError:
            return None

    def problem(
        self, hosts: tuple[str, ...], *, now: datetime.datetime | None = None
    ) -> str | None:
        """Why a replica reached at ``hosts`` cannot serve this certificate, or None."""
        now = now or datetime.datetime.now(datetime.UTC)
        try:
            covered = pki.subject_alt_names(self.cert)
            expiry = pki.not_after(self.cert)
            own_key = pki.key_matches(self.cert, self.key)
        except (ValueError, TypeError):
            return "it does not hold a PEM certificate and private key"
        if not own_key:
            return "its private key does not belong to its certificate"
        missing = set(hosts) - covered
        if missing:
            return f"it does not cover {', '.join(sorted(missing))}"
        if expiry <= now:
            return f"it expired at {expiry.isoformat()}"
        return None

    def due_for_renewal(self, *, now: datetime.datetime | None = None) -> bool:
        expiry = self.not_after()
        now = now or datetime.datetime.now(datetime.UTC)
        return expiry is None or expiry - now <= RENEW_BEFORE

    def usable_for(self, hosts: tuple[str, ...]) -> bool:
        """Servable at ``hosts`` and not yet due for renewal: what a starting replica keeps."""
        return self.problem(hosts) is None and not self.due_for_renewal()


def make_certificate(hosts: tuple[str, ...]) -> Certificate:
    """A new CA and a serving certificate for ``hosts`` (the first one is the CN)."""
    authority = pki.Authority.new(CA_NAME)
    issued = authority.issue(common_name=hosts[0], hosts=hosts, server=True)
    return Certificate(ca=authority.cert_pem, cert=issued.cert, key=issued.key)


Action = Literal["keep", "reload", "renew", "refuse"]


def plan(
    stored: Certificate | None,
    served: Certificate,
    hosts: tuple[str, ...],
    *,
    now: datetime.datetime | None = None,
) -> tuple[Action, str]:
    """What a running replica does about the Secret's certificate (pure), and why.

    A running replica writes the Secret only when it is gone, or when it holds exactly what
    the replica serves and that is due for renewal. A different certificate is loaded when it
    is servable here, and otherwise refused (kept serving the previous one, and reported):
    two replicas that disagree about the hosts would otherwise replace each other's
    certificate at every check, forever. A starting replica still replaces a certificate it
    cannot use (:func:`ensure_certificate`).
    """
    if stored is None:
        return "renew", f"Secret {CERT_SECRET} is missing"
    if stored == served:
        if served.due_for_renewal(now=now):
            return "renew", f"the certificate expires at {served.not_after()}"
        return "keep", ""
    problem = stored.problem(hosts, now=now)
    if problem is not None:
        return "refuse", f"the certificate in Secret {CERT_SECRET} is not servable here: {problem}"
    return "reload", "Secret changed"


async def read_secret(client: AsyncClient, namespace: str) -> Secret | None:
    try:
        return await client.get(Secret, CERT_SECRET, namespace=namespace)
    except ApiError as error:
        if error.status.code != 404:
            raise
        return None


async def ensure_certificate(client: AsyncClient, endpoint: Endpoint) -> Certificate:
    """The shared webhook certificate: read from its Secret, or made and stored there."""
    hosts = endpoint.hosts()
    for _ in range(5):
        secret = await read_secret(client, endpoint.namespace)
        found = Certificate.from_secret(secret)
        if found is not None and found.usable_for(hosts):
            return found
        made = make_certificate(hosts)
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
                        data=made.secret_data(),
                    )
                )
            else:
                secret.data = made.secret_data()
                await client.replace(secret)  # carries resourceVersion: racing replicas conflict
            logger.info(
                "stored a new webhook certificate for %s (sha256 %s)",
                ", ".join(hosts),
                made.fingerprint,
            )
            return made
        except ApiError as error:
            if error.status.code != 409:
                raise
            # Another replica stored one first: use it.
    raise RuntimeError("could not agree on a webhook certificate after 5 attempts")


async def ensure_configuration(kube: Kube, endpoint: Endpoint, certificate: Certificate) -> bool:
    """Point the webhook configuration at us (leader only). True if it had to be written."""
    owner = await kube.get("rbac.authorization.k8s.io/v1", "ClusterRole", "", OWNER_CLUSTER_ROLE)
    owner_uid = owner["metadata"]["uid"] if owner is not None else None
    desired = diff.stamped(webhook_configuration(endpoint, certificate.ca, owner_uid=owner_uid))
    observed = await kube.get(
        "admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration", "", CONFIGURATION_NAME
    )
    if observed is not None and not diff.drift(observed, desired):
        return False
    await kube.apply(desired)
    return True


def _load_chain(context: ssl.SSLContext, certificate: Certificate) -> None:
    # load_cert_chain reads files only; they live for the call, in a private directory.
    with tempfile.TemporaryDirectory(prefix="stateward-webhook-") as directory:
        cert, key = Path(directory) / "tls.crt", Path(directory) / "tls.key"
        cert.write_bytes(certificate.cert)
        key.touch(mode=0o600)
        key.write_bytes(certificate.key)
        context.load_cert_chain(cert, key)


class AdmissionServer:
    """HTTPS server answering AdmissionReviews; runs for the whole life of the process."""

    def __init__(
        self,
        *,
        address: str,
        port: int,
        certificate: Certificate,
        foreign_repository_paths: bool = False,
    ) -> None:
        self.address, self.port, self.certificate = address, port, certificate
        self.foreign_repository_paths = foreign_repository_paths
        self._runner: web.AppRunner | None = None
        self._context: ssl.SSLContext | None = None

    def _ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        _load_chain(context, self.certificate)
        return context

    def reload(self, certificate: Certificate) -> None:
        """Serve ``certificate`` from the next handshake on, in place: the listening socket
        and open connections stay. Raises ``ssl.SSLError`` (and changes nothing) for a pair
        OpenSSL refuses: it is tried on a scratch context first, because a failed load can
        leave a context half-replaced."""
        _load_chain(ssl.create_default_context(ssl.Purpose.CLIENT_AUTH), certificate)
        if self._context is not None:
            _load_chain(self._context, certificate)
        self.certificate = certificate

    async def served_fingerprint(self) -> str | None:
        """SHA-256 of the certificate the port presents right now, read by a TLS handshake
        with ourselves; None if the handshake fails."""
        host = self.address
        if host in ("", "0.0.0.0"):  # noqa: S104 - the wildcard we bind, not one we serve
            host = "127.0.0.1"
        elif host == "::":
            host = "::1"
        # We read the certificate presented to us; we do not trust it, so nothing to verify.
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        try:
            _reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, self.port, ssl=context), HANDSHAKE_TIMEOUT
            )
        except (OSError, ssl.SSLError, TimeoutError) as error:
            logger.warning("TLS handshake with our own webhook port failed: %s", error)
            return None
        try:
            ssl_object = writer.get_extra_info("ssl_object")
            der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        finally:
            writer.close()
            with contextlib.suppress(OSError, ssl.SSLError):
                await writer.wait_closed()
        return hashlib.sha256(der).hexdigest() if der else None

    async def start(self) -> None:
        async def validate(request: web.Request) -> web.Response:
            try:
                review = await request.json()
            except ValueError:
                return web.json_response({"error": "not an AdmissionReview"}, status=400)
            return web.json_response(
                review_response(review, foreign_repository_paths=self.foreign_repository_paths)
            )

        app = web.Application()
        app.router.add_post(PATH, validate)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        self._context = self._ssl_context()
        site = web.TCPSite(self._runner, self.address, self.port, ssl_context=self._context)
        await site.start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


class CertificateMonitor:
    """Keeps one replica's webhook serving the Secret's certificate, and says when it does not.

    :meth:`check` runs at start and then every ``--webhook-certificate-interval`` seconds:
    read the Secret, act on :func:`plan`, then compare what the port serves (a handshake) with
    the Secret. ``on_change`` is told of every certificate loaded (the leader points the
    webhook configuration's CA bundle at it).
    """

    def __init__(
        self,
        client: AsyncClient,
        endpoint: Endpoint,
        server: AdmissionServer,
        *,
        identity: str,
        on_change: Callable[[Certificate], Awaitable[None]],
    ) -> None:
        self.client, self.endpoint, self.server = client, endpoint, server
        self.identity = identity
        self.on_change = on_change
        self._reported: tuple[str, str | None, str | None] | None = None

    async def check(self) -> bool | None:
        """One check. True when the port serves the Secret's certificate, False when not,
        None when the Secret could not be read (the previous verdict stands)."""
        hosts = self.endpoint.hosts()
        try:
            secret = await read_secret(self.client, self.endpoint.namespace)
        except (ApiError, OSError) as error:
            logger.warning(
                "could not read Secret %s to check the webhook certificate: %s",
                CERT_SECRET,
                _reason(error),
            )
            return None
        stored = Certificate.from_secret(secret)
        action, why = plan(stored, self.server.certificate, hosts)
        if action == "renew":
            try:
                stored = await ensure_certificate(self.client, self.endpoint)
                secret = await read_secret(self.client, self.endpoint.namespace)
            except (ApiError, OSError, RuntimeError) as error:
                logger.warning(
                    "could not renew the webhook certificate (%s): %s", why, _reason(error)
                )
                return None
            action = "keep" if stored == self.server.certificate else "reload"
        if action == "reload" and stored is not None:
            previous = self.server.certificate.fingerprint
            try:
                self.server.reload(stored)
            except ssl.SSLError as error:
                why = f"the certificate in Secret {CERT_SECRET} could not be loaded: {error}"
            else:
                why = ""
                metrics.WEBHOOK_CERT_RELOADS.inc()
                logger.info(
                    "webhook now serves the certificate from Secret %s (sha256 %s, was %s)",
                    CERT_SECRET,
                    stored.fingerprint,
                    previous,
                )
                await self.on_change(stored)
        served = await self.server.served_fingerprint()
        wanted = stored.fingerprint if stored is not None else None
        expiry = self.server.certificate.not_after()
        if expiry is not None:
            metrics.WEBHOOK_CERT_EXPIRY.set(expiry.timestamp())
        matching = served is not None and served == wanted
        metrics.WEBHOOK_CERT_MISMATCH.set(0 if matching else 1)
        if matching:
            if self._reported is not None:
                logger.info("webhook serves the certificate of Secret %s again", CERT_SECRET)
                self._reported = None
            return True
        if served is None:
            why = why or "a TLS handshake with the webhook port failed"
        why = why or "the webhook port does not serve the Secret's certificate"
        await self._report(secret, why, served, wanted)
        return False

    async def _report(
        self, secret: Secret | None, why: str, served: str | None, wanted: str | None
    ) -> None:
        """A log line and a Warning Event, once per distinct situation (the gauge stays)."""
        key = (why, served, wanted)
        if key == self._reported:
            return
        self._reported = key
        message = (
            f"replica {self.identity} serves webhook certificate sha256 {served or 'none'}"
            f" but Secret {CERT_SECRET} holds sha256 {wanted or 'none'}: {why}; admission"
            " requests to this replica may fail, and failurePolicy Ignore admits them"
            " unvalidated"
        )
        logger.warning("%s", message)
        metadata = secret.metadata if secret is not None else None
        involved = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": CERT_SECRET,
                "namespace": self.endpoint.namespace,
                "uid": metadata.uid if metadata is not None else None,
            },
        }
        body = event_body(
            involved,
            reason="WebhookCertificateMismatch",
            message=message,
            warning=True,
            component="stateward-operator",
        )
        try:
            await self.client.create(codecs.from_dict(body))
        except (ApiError, OSError) as error:
            logger.warning("could not record the certificate mismatch Event: %s", _reason(error))


def _reason(error: BaseException) -> str:
    if isinstance(error, ApiError):
        return f"{error.status.code} {error.status.reason}: {error.status.message}"
    return type(error).__name__
