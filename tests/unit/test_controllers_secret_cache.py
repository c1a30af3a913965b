"""Secret data the store does not keep: read once per change, never shown, freed with its owner."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest

from stateward.controllers import core
from stateward.controllers.kube import PatroniAccess
from stateward.controllers.store import ObjectStore

pytestmark = pytest.mark.unit


class FakeKube:
    """Only ``get``: the Secrets by name, counting the reads."""

    def __init__(self) -> None:
        self.secrets: dict[str, dict[str, Any]] = {}
        self.reads = 0

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Any:
        self.reads += 1
        return self.secrets.get(name)


def secret(name: str, version: str, password: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": "db", "resourceVersion": version},
        "data": {"password": base64.b64encode(password.encode()).decode()},
    }


def scope(kube: FakeKube, store: ObjectStore, cache: core.SecretCache) -> core.Scope:
    body = {"metadata": {"name": "demo", "namespace": "db"}}
    return core.Scope(
        body=body,
        kube=kube,
        store=store,
        now="",
        conditions=[],
        secrets=cache,  # type: ignore[arg-type]
    )


def test_a_secret_is_read_once_per_change_and_forgotten_with_its_owner() -> None:
    kube, store, cache = FakeKube(), ObjectStore(), core.SecretCache()

    async def read() -> dict[str, str] | None:
        return await cache.read(scope(kube, store, cache), "demo-patroni-api")

    assert asyncio.run(read()) is None  # not observed yet: no request
    assert kube.reads == 0
    kube.secrets["demo-patroni-api"] = secret("demo-patroni-api", "1", "one")
    store.observe(kube.secrets["demo-patroni-api"])
    assert asyncio.run(read()) == {"password": "one"}
    assert asyncio.run(read()) == {"password": "one"}
    assert kube.reads == 1  # the second reconcile reuses it
    kube.secrets["demo-patroni-api"] = secret("demo-patroni-api", "2", "two")
    store.observe(kube.secrets["demo-patroni-api"])
    assert asyncio.run(read()) == {"password": "two"}
    assert kube.reads == 2
    cache.forget("db", "demo")
    assert asyncio.run(read()) == {"password": "two"}
    assert kube.reads == 3


def test_credentials_never_show_in_a_repr() -> None:
    auth = PatroniAccess("stateward", "s3cret", "-----BEGIN CERTIFICATE-----")
    assert "s3cret" not in repr(auth) and "s3cret" not in str(auth)
    assert "CERTIFICATE" not in repr(auth)
    assert auth.httpx()._auth_header.startswith("Basic ")


def test_a_secret_the_operator_just_wrote_is_not_read_back_and_keys_are_kept_apart() -> None:
    kube, store, cache = FakeKube(), ObjectStore(), core.SecretCache()
    written = secret("demo-tls", "5", "pem")
    written["data"]["tls.key"] = base64.b64encode(b"private").decode()
    store.observe(written)
    the_scope = scope(kube, store, cache)
    # What the write's response carried, as a reader of only "password" keeps it.
    assert cache.remember(the_scope, written, keys=frozenset({"password"})) == {"password": "pem"}

    async def read(keys: frozenset[str] | None) -> dict[str, str] | None:
        return await cache.read(the_scope, "demo-tls", keys=keys)

    assert asyncio.run(read(frozenset({"password"}))) == {"password": "pem"}
    assert kube.reads == 0, "the operator's own write is not read back"
    # A reader that wants other keys is not handed the narrower copy: it reads them.
    kube.secrets["demo-tls"] = written
    assert asyncio.run(read(frozenset({"password", "tls.key"}))) == {
        "password": "pem",
        "tls.key": "private",
    }
    assert kube.reads == 1
