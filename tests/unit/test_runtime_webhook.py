"""The admission webhook's pure parts: reviews, where the API server reaches us, certificates."""

from __future__ import annotations

import base64
import datetime
import socket
import ssl
from typing import Any

import pytest
from lightkube import ApiError
from lightkube.models.meta_v1 import ObjectMeta, Status
from lightkube.resources.core_v1 import Secret

from stateward import pki
from stateward.runtime import metrics, webhook

pytestmark = pytest.mark.unit


def review(spec: dict[str, object], old: dict[str, object] | None = None) -> dict[str, object]:
    request: dict[str, object] = {"uid": "abc", "object": {"spec": spec}}
    if old is not None:
        request["oldObject"] = {"spec": old}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


GOOD = {"version": "16", "replicas": 3, "storageSize": "1Gi"}


def test_a_valid_spec_is_allowed_and_the_uid_echoed() -> None:
    answer = webhook.review_response(review(GOOD))
    assert answer["kind"] == "AdmissionReview"
    assert answer["response"] == {"uid": "abc", "allowed": True}


def test_a_schedule_that_never_fires_is_refused_naming_the_field() -> None:
    answer = webhook.review_response(review({**GOOD, "backupSchedule": "0 0 30 2 *"}))
    response = answer["response"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 422
    assert response["status"]["message"].startswith("spec.backupSchedule")


def test_updates_are_checked_against_the_old_spec() -> None:
    answer = webhook.review_response(
        review({**GOOD, "storageSize": "1Gi"}, {**GOOD, "storageSize": "2Gi"})
    )
    assert answer["response"]["allowed"] is False
    assert "storageSize" in answer["response"]["status"]["message"]


def test_in_cluster_endpoint_is_a_service_reference() -> None:
    endpoint = webhook.Endpoint(namespace="ops", port=9443, service="stateward-webhook")
    config = endpoint.client_config(b"CA")
    assert config["service"] == {
        "namespace": "ops",
        "name": "stateward-webhook",
        "port": 443,
        "path": webhook.PATH,
    }
    assert base64.b64decode(config["caBundle"]) == b"CA"
    assert "stateward-webhook.ops.svc" in endpoint.hosts()


def test_local_endpoint_is_a_url() -> None:
    endpoint = webhook.Endpoint(namespace="ops", port=30001, host="127.0.0.1")
    assert endpoint.client_config(b"CA")["url"] == f"https://127.0.0.1:30001{webhook.PATH}"


def test_configuration_covers_postgresclusters_and_fails_closed_for_what_it_checks() -> None:
    configuration = webhook.webhook_configuration(
        webhook.Endpoint(namespace="ops", port=1, service="s"), b"CA"
    )
    (hook,) = configuration["webhooks"]
    assert configuration["metadata"]["name"] == "stateward.io"
    assert hook["rules"][0]["resources"] == ["postgresclusters"]
    assert hook["rules"][0]["operations"] == ["CREATE", "UPDATE"]
    # Never admits what it could not check, and sees only what CEL cannot check.
    assert hook["failurePolicy"] == "Fail"
    (condition,) = hook["matchConditions"]
    assert "object.spec.backupSchedule" in condition["expression"]
    assert (
        "'stateward.io/fenced-instances' in object.metadata.annotations"
        in (condition["expression"])
    )
    assert hook["sideEffects"] == "None"


def test_a_certificate_must_cover_every_host() -> None:
    endpoint = webhook.Endpoint(namespace="ops", port=1, service="s")
    made = webhook.make_certificate(endpoint.hosts())
    assert made.usable_for(endpoint.hosts())
    assert not made.usable_for((*endpoint.hosts(), "other.example"))


# --- the certificate in the Secret, and what a running replica does about it ---------------

HOSTS = ("127.0.0.1", "localhost")
NOW = datetime.datetime.now(datetime.UTC)


def secret_of(certificate: webhook.Certificate | None, **data: str) -> Secret:
    values = certificate.secret_data() if certificate is not None else {}
    return Secret(
        metadata=ObjectMeta(name=webhook.CERT_SECRET, namespace="ops", uid="uid-1"),
        data={**values, **data},
    )


def test_a_certificate_never_shows_its_key() -> None:
    made = webhook.make_certificate(HOSTS)
    assert b"PRIVATE KEY" in made.key
    assert "PRIVATE" not in repr(made) and made.key.decode() not in repr(made)


def test_the_secret_round_trips_and_a_broken_one_reads_as_unservable() -> None:
    made = webhook.make_certificate(HOSTS)
    assert webhook.Certificate.from_secret(secret_of(made)) == made
    assert webhook.Certificate.from_secret(None) is None
    assert webhook.Certificate.from_secret(secret_of(None)) is None
    partial = webhook.Certificate.from_secret(secret_of(made, **{"tls.key": "!!not base64"}))
    assert partial is not None and partial.key == b""
    assert partial.problem(HOSTS) == "it does not hold a PEM certificate and private key"
    assert partial.fingerprint == made.fingerprint


def test_problems_name_what_is_wrong() -> None:
    made = webhook.make_certificate(HOSTS)
    other = webhook.make_certificate(HOSTS)
    assert made.problem(HOSTS) is None
    assert webhook.Certificate(made.ca, made.cert, other.key).problem(HOSTS) == (
        "its private key does not belong to its certificate"
    )
    assert made.problem((*HOSTS, "svc.ops.svc")) == "it does not cover svc.ops.svc"
    later = NOW + datetime.timedelta(days=400)
    problem = made.problem(HOSTS, now=later)
    assert problem is not None and problem.startswith("it expired at ")
    assert made.due_for_renewal(now=NOW + datetime.timedelta(days=340))
    assert not made.due_for_renewal(now=NOW)


def test_plan_keeps_reloads_renews_and_refuses() -> None:
    served = webhook.make_certificate(HOSTS)
    rotated = webhook.make_certificate(HOSTS)
    foreign = webhook.make_certificate(("example.invalid",))
    assert webhook.plan(served, served, HOSTS, now=NOW) == ("keep", "")
    assert webhook.plan(rotated, served, HOSTS, now=NOW) == ("reload", "Secret changed")
    action, why = webhook.plan(None, served, HOSTS, now=NOW)
    assert action == "renew" and "missing" in why
    action, why = webhook.plan(served, served, HOSTS, now=NOW + datetime.timedelta(days=340))
    assert action == "renew" and "expires" in why
    action, why = webhook.plan(foreign, served, HOSTS, now=NOW)
    assert action == "refuse" and "does not cover 127.0.0.1, localhost" in why
    garbage = webhook.Certificate(b"ca", b"not a certificate", b"nor a key")
    assert webhook.plan(garbage, served, HOSTS, now=NOW)[0] == "refuse"


def test_pki_fingerprint_is_the_sha256_of_the_der_form() -> None:
    import hashlib

    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    authority = pki.Authority.new("test-ca")
    issued = authority.issue(common_name="x", hosts=HOSTS, server=True)
    der = x509.load_pem_x509_certificate(issued.cert).public_bytes(serialization.Encoding.DER)
    assert pki.fingerprint(issued.cert) == pki.fingerprint(der) == hashlib.sha256(der).hexdigest()
    assert pki.subject_alt_names(issued.cert) == set(HOSTS)
    assert pki.key_matches(issued.cert, issued.key)
    assert not pki.key_matches(issued.cert, authority.key_pem)
    again = pki.Authority.load(authority.cert_pem, authority.key_pem)
    assert again.cert_pem == authority.cert_pem


# --- the live server: reload in place, read back by a handshake -----------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def test_the_live_server_serves_a_reloaded_certificate_from_the_next_handshake() -> None:
    first = webhook.make_certificate(HOSTS)
    second = webhook.make_certificate(HOSTS)
    server = webhook.AdmissionServer(address="127.0.0.1", port=_free_port(), certificate=first)
    await server.start()
    try:
        assert await server.served_fingerprint() == first.fingerprint
        server.reload(second)
        assert await server.served_fingerprint() == second.fingerprint
        # A pair OpenSSL refuses changes nothing: the live context keeps the last good one.
        with pytest.raises(ssl.SSLError):
            server.reload(webhook.Certificate(first.ca, first.cert, second.key))
        assert server.certificate == second
        assert await server.served_fingerprint() == second.fingerprint
    finally:
        await server.stop()


class FakeClient:
    """Enough of lightkube's AsyncClient for the monitor: one Secret, Events recorded."""

    def __init__(self, secret: Secret | None) -> None:
        self.secret, self.replaced = secret, 0
        self.events: list[Any] = []

    async def get(self, _resource: Any, _name: str, namespace: str) -> Secret:
        if self.secret is None:
            raise ApiError(status=Status(code=404, message="not found", reason="NotFound"))
        return self.secret

    async def create(self, obj: Any) -> Any:
        if isinstance(obj, Secret):
            self.secret = obj
        else:
            self.events.append(obj)
        return obj

    async def replace(self, obj: Any) -> Any:
        self.replaced += 1
        self.secret = obj
        return obj


async def test_the_monitor_reloads_a_rotated_certificate_and_reports_one_it_cannot_serve() -> None:
    endpoint = webhook.Endpoint(namespace="ops", port=_free_port(), host="127.0.0.1")
    served = webhook.make_certificate(endpoint.hosts())
    server = webhook.AdmissionServer(address="127.0.0.1", port=endpoint.port, certificate=served)
    client = FakeClient(secret_of(served))
    changed: list[webhook.Certificate] = []

    async def on_change(certificate: webhook.Certificate) -> None:
        changed.append(certificate)

    monitor = webhook.CertificateMonitor(
        client,  # type: ignore[arg-type]
        endpoint,
        server,
        identity="replica-a",
        on_change=on_change,
    )
    await server.start()
    try:
        assert await monitor.check() is True
        assert metrics.WEBHOOK_CERT_MISMATCH._value.get() == 0  # type: ignore[attr-defined]

        rotated = webhook.make_certificate(endpoint.hosts())
        client.secret = secret_of(rotated)
        assert await monitor.check() is True
        assert changed == [rotated]
        assert await server.served_fingerprint() == rotated.fingerprint

        foreign = webhook.make_certificate(("example.invalid",))
        client.secret = secret_of(foreign)
        assert await monitor.check() is False
        assert await monitor.check() is False
        assert metrics.WEBHOOK_CERT_MISMATCH._value.get() == 1  # type: ignore[attr-defined]
        assert await server.served_fingerprint() == rotated.fingerprint  # kept serving
        assert client.replaced == 0  # a running replica does not fight over the Secret
        (event,) = client.events  # once per distinct situation
        assert event.type == "Warning" and event.reason == "WebhookCertificateMismatch"
        assert event.involvedObject.name == webhook.CERT_SECRET
        assert rotated.fingerprint in event.message and foreign.fingerprint in event.message
        assert b"PRIVATE" not in event.message.encode()

        client.secret = secret_of(rotated)
        assert await monitor.check() is True
        assert metrics.WEBHOOK_CERT_MISMATCH._value.get() == 0  # type: ignore[attr-defined]

        client.secret = None  # deleted: made anew, as a starting replica would
        assert await monitor.check() is True
        assert client.secret is not None and changed[-1] != rotated
    finally:
        await server.stop()


def test_an_unreadable_fencing_annotation_is_refused_at_admission() -> None:
    request = review(GOOD)
    request["request"]["object"]["metadata"] = {  # type: ignore[index]
        "annotations": {"stateward.io/fenced-instances": "pg-1"}
    }
    answer = webhook.review_response(request)
    assert answer["response"]["allowed"] is False
    assert "stateward.io/fenced-instances" in answer["response"]["status"]["message"]
    request["request"]["object"]["metadata"]["annotations"] = {  # type: ignore[index]
        "stateward.io/fenced-instances": '["pg-1"]'
    }
    assert webhook.review_response(request)["response"]["allowed"] is True


def test_configuration_is_owned_by_the_operators_cluster_role_when_its_uid_is_known() -> None:
    endpoint = webhook.Endpoint(namespace="ops", port=1, service="s")
    unowned = webhook.webhook_configuration(endpoint, b"CA")
    owned = webhook.webhook_configuration(endpoint, b"CA", owner_uid="uid-7")

    assert "ownerReferences" not in unowned["metadata"]
    (owner,) = owned["metadata"]["ownerReferences"]
    assert owner == {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "name": "stateward-operator",
        "uid": "uid-7",
    }
