"""The superuser and replication Secrets, and password generation."""

from __future__ import annotations

import base64

import pytest

from stateward.specs import meta, passwords
from stateward.specs.postgres import secrets
from tests.support.clusters import make_cluster

pytestmark = pytest.mark.unit


def decoded(secret: dict[str, object]) -> dict[str, str]:
    data = secret["data"]
    assert isinstance(data, dict)
    return {key: base64.b64decode(value).decode() for key, value in data.items()}


def test_superuser_secret() -> None:
    cluster = make_cluster()
    secret = secrets.superuser_secret(cluster, password="s3cret-one")
    assert secret["apiVersion"] == "v1"
    assert secret["kind"] == "Secret"
    assert secret["type"] == "kubernetes.io/basic-auth"
    assert secret["metadata"] == {
        "name": "demo-superuser",
        "namespace": "db",
        "labels": meta.labels(cluster),
        "ownerReferences": [meta.owner_reference(cluster)],
    }
    assert decoded(secret) == {"username": "postgres", "password": "s3cret-one"}
    assert "stringData" not in secret


def test_replication_secret() -> None:
    cluster = make_cluster()
    secret = secrets.replication_secret(cluster, password="s3cret-two")
    assert secret["metadata"]["name"] == "demo-replication"
    assert secret["type"] == "kubernetes.io/basic-auth"
    assert decoded(secret) == {"username": "replicator", "password": "s3cret-two"}


def test_password_is_not_stored_in_clear() -> None:
    secret = secrets.superuser_secret(make_cluster(), password="s3cret-one")
    assert "s3cret-one" not in repr(secret)


def test_empty_password_is_refused() -> None:
    with pytest.raises(ValueError, match="password"):
        secrets.replication_secret(make_cluster(), password="")


def test_secrets_are_deterministic_for_one_password() -> None:
    cluster = make_cluster()
    assert secrets.superuser_secret(cluster, password="x") == secrets.superuser_secret(
        cluster, password="x"
    )


def test_generate_password() -> None:
    first, second = passwords.generate_password(), passwords.generate_password()
    assert first != second
    assert len(first) >= 43
    assert all(char.isalnum() or char in "-_" for char in first)


def test_restapi_secret_holds_what_patroni_asks_for() -> None:
    cluster = make_cluster()
    secret = secrets.restapi_secret(cluster, password="s3cret-api")
    assert secret["metadata"]["name"] == "demo-patroni-api"
    assert secret["type"] == "kubernetes.io/basic-auth"
    assert decoded(secret) == {"username": "stateward", "password": "s3cret-api"}
