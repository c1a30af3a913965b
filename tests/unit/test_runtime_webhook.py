"""The admission webhook's pure parts: reviews, where the API server reaches us, certificates."""

from __future__ import annotations

import base64

import pytest

from stateward.runtime import webhook

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


def test_configuration_covers_postgresclusters_and_fails_open() -> None:
    configuration = webhook.webhook_configuration(
        webhook.Endpoint(namespace="ops", port=1, service="s"), b"CA"
    )
    (hook,) = configuration["webhooks"]
    assert configuration["metadata"]["name"] == "stateward.io"
    assert hook["rules"][0]["resources"] == ["postgresclusters"]
    assert hook["rules"][0]["operations"] == ["CREATE", "UPDATE"]
    assert hook["failurePolicy"] == "Ignore"
    assert hook["sideEffects"] == "None"


def test_a_certificate_must_cover_every_host() -> None:
    endpoint = webhook.Endpoint(namespace="ops", port=1, service="s")
    made = webhook._make_certificate(endpoint.hosts())
    assert made.usable_for(endpoint.hosts())
    assert not made.usable_for((*endpoint.hosts(), "other.example"))
