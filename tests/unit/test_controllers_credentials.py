"""check_backup_credentials reads the user's Secret only when it may have changed."""

from __future__ import annotations

from typing import Any

import pytest

from stateward.controllers import postgrescluster
from stateward.controllers.store import ObjectStore
from tests.support.clusters import BACKUP, make_cluster

pytestmark = pytest.mark.unit


class Kube:
    def __init__(self, secret: dict[str, Any] | None) -> None:
        self.secret, self.gets = secret, 0

    async def get(self, *_: Any) -> dict[str, Any] | None:
        self.gets += 1
        return self.secret

    async def event(self, body: Any, **_: Any) -> None:
        pass


COMPLETE = {"data": {"accessKeyId": "QUs=", "secretAccessKey": "U0s="}}


async def check(kube: Kube, memo: dict[Any, Any], generation: int = 2) -> postgrescluster.Scope:
    cluster = make_cluster(backup=BACKUP, metadata={"generation": generation})
    scope = postgrescluster.Scope(
        cluster=cluster,
        body={"metadata": {"name": "demo", "namespace": "db"}},
        kube=kube,  # type: ignore[arg-type]
        store=ObjectStore(),
        now="2026-12-04T00:00:00Z",
        conditions=[],
        credentials_checked=memo,
    )
    await postgrescluster.check_backup_credentials(scope)
    return scope


async def test_complete_credentials_are_read_again_only_after_a_while_or_a_spec_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(postgrescluster.time, "monotonic", lambda: clock[0])
    kube, memo = Kube(COMPLETE), {}
    for _ in range(5):
        await check(kube, memo)
    assert kube.gets == 1  # reconciles at rest read it once
    await check(kube, memo, generation=3)
    assert kube.gets == 2  # a new spec (another Secret, perhaps) reads it at once
    clock[0] += postgrescluster.CREDENTIALS_RECHECK
    await check(kube, memo, generation=3)
    assert kube.gets == 3  # and a slow timer catches a Secret changed since


async def test_missing_credentials_are_read_at_every_look_until_they_are_there() -> None:
    kube, memo = Kube(None), {}
    scope = await check(kube, memo)
    assert [reason for reason, _ in scope.degraded] == ["BackupCredentialsMissing"]
    await check(kube, memo)
    assert kube.gets == 2
    kube.secret = COMPLETE
    assert (await check(kube, memo)).degraded == []


def test_a_deleted_cluster_leaves_nothing_in_memory() -> None:
    reconciler = postgrescluster.Reconciler(None, ObjectStore())  # type: ignore[arg-type]
    reconciler.credentials_checked[("db", "demo")] = (2, 1.0)
    reconciler.secret_cache._data[("db", "demo", "demo-patroni-api")] = ("1", {"password": "x"})
    reconciler.data_plane._primaries[("db", "demo")] = "demo-0"
    reconciler.forget("db", "demo")
    assert reconciler.credentials_checked == {}
    assert reconciler.secret_cache._data == {}
    assert reconciler.data_plane._primaries == {}
