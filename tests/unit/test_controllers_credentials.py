"""check_backup_credentials reads the user's Secret only when it may have changed."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from lightkube import ApiError

from stateward.controllers.postgres import backup_phases
from stateward.controllers.postgres import reconcile as postgrescluster
from stateward.controllers.postgres.scope import ROLL_RECHECK
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


async def check(
    kube: Kube,
    memo: dict[Any, Any],
    generation: int = 2,
    *,
    name: str = "demo",
    shared: dict[Any, Any] | None = None,
    backup: dict[str, Any] = BACKUP,
) -> postgrescluster.Scope:
    cluster = make_cluster(backup=backup, metadata={"generation": generation, "name": name})
    scope = postgrescluster.Scope(
        cluster=cluster,
        body={"metadata": {"name": name, "namespace": "db"}},
        kube=kube,  # type: ignore[arg-type]
        store=ObjectStore(),
        now="2026-12-04T00:00:00Z",
        conditions=[],
        credentials_checked=memo,
        credential_keys={} if shared is None else shared,
    )
    await backup_phases.check_backup_credentials(scope)
    return scope


async def test_complete_credentials_are_read_again_only_after_a_while_or_a_spec_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(backup_phases.time, "monotonic", lambda: clock[0])
    kube, memo = Kube(COMPLETE), {}
    for _ in range(5):
        await check(kube, memo)
    assert kube.gets == 1  # reconciles at rest read it once
    await check(kube, memo, generation=3)
    assert kube.gets == 2  # a new spec (another Secret, perhaps) reads it at once
    clock[0] += backup_phases.CREDENTIALS_RECHECK
    await check(kube, memo, generation=3)
    assert kube.gets == 3  # and a slow timer catches a Secret changed since


async def test_clusters_naming_one_secret_share_a_fresh_read_that_found_every_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(backup_phases.time, "monotonic", lambda: clock[0])
    kube, memo, shared = Kube(COMPLETE), {}, {}
    for name in ("a", "b", "c"):
        assert (await check(kube, memo, name=name, shared=shared)).degraded == []
    assert kube.gets == 1, "three new clusters, one read"
    assert shared[("db", "s3-credentials")][0] == {"accessKeyId", "secretAccessKey"}
    assert "QUs=" not in repr(shared), "key names only, never a value"
    clock[0] += backup_phases.SHARED_READ_AGE
    await check(kube, memo, name="d", shared=shared)
    assert kube.gets == 2, "an older read is not shared"
    # A cluster that needs a key the shared read did not find reads for itself.
    with_ca = {"repository": {"s3": {**BACKUP["repository"]["s3"], "caKey": "ca.crt"}}}
    scope = await check(kube, memo, name="e", shared=shared, backup=with_ca)
    assert kube.gets == 3 and [r for r, _ in scope.degraded] == ["BackupCredentialsMissing"]


async def test_a_secret_found_lacking_is_never_shared() -> None:
    kube, memo, shared = Kube(None), {}, {}
    await check(kube, memo, name="a", shared=shared)
    kube.secret = COMPLETE
    assert (await check(kube, memo, name="b", shared=shared)).degraded == []
    assert kube.gets == 2


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
    reconciler.secret_cache._data[("db", "demo", "demo-patroni-api", None)] = (
        "1",
        {"password": "x"},
    )
    reconciler.data_plane._primaries[("db", "demo")] = "demo-0"
    reconciler.forget("db", "demo")
    assert reconciler.credentials_checked == {}
    assert reconciler.secret_cache._data == {}
    assert reconciler.data_plane._primaries == {}


def secret(name: str, owner_uid: str) -> dict[str, Any]:
    return {
        "kind": "Secret",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "namespace": "db",
            "resourceVersion": "7",
            "ownerReferences": [{"uid": owner_uid, "controller": True, "kind": "PostgresCluster"}],
        },
    }


def test_a_child_of_a_previous_object_of_the_same_name_is_not_ours() -> None:
    from stateward.controllers import core

    assert core.controlled_by_another(secret("s", "old-uid"), "new-uid")
    assert not core.controlled_by_another(secret("s", "new-uid"), "new-uid")
    assert not core.controlled_by_another({"metadata": {"name": "s"}}, "new-uid"), "user-made"
    assert not core.controlled_by_another(None, "new-uid")


async def test_a_cluster_made_again_under_a_deleted_one_s_name_waits_for_its_secrets_to_go(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The deleted cluster's credentials are still there (garbage collection has not reached
    # them): taken for the new cluster's, they vanished under its pods, whose credentials
    # volume then never mounted (found by a clean-clone run of the restore story).
    cluster = make_cluster(metadata={"uid": "new-uid"})
    store = ObjectStore()
    store.observe(secret("demo-superuser", "old-uid"))
    scope = postgrescluster.Scope(
        cluster=cluster,
        body={"metadata": {"name": "demo", "namespace": "db", "uid": "new-uid"}},
        kube=Kube(None),  # type: ignore[arg-type]
        store=store,
        now="2026-12-04T00:00:00Z",
        conditions=[],
    )

    async def ca(*_: Any) -> str:
        return "CA"

    monkeypatch.setattr(postgrescluster.certificates, "ca_cert", ca)
    note = await postgrescluster.ensure_secrets(scope)
    assert note == "waiting for the previous cluster's demo-superuser to be garbage-collected"
    assert scope.halted and scope.requeue_after == ROLL_RECHECK


def claim(name: str, *, deleting: bool) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": name, "namespace": "db", "labels": {"stateward.io/cluster": "demo"},
    }  # fmt: skip
    if deleting:
        metadata["deletionTimestamp"] = "2026-12-04T00:00:00Z"
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": metadata}


class Creating(Kube):
    def __init__(self, store: ObjectStore | None = None) -> None:
        super().__init__(None)
        self.created: list[str] = []
        self.store = store

    async def get(self, *args: Any) -> dict[str, Any] | None:
        """What the API server holds (the store, unless told the watch missed a delete)."""
        if self.store is None:
            return None
        return self.store.get(args[1], args[2], args[3])

    async def create(self, body: dict[str, Any]) -> dict[str, Any]:
        self.created.append(body["metadata"]["name"])
        return body


def secrets_scope(
    monkeypatch: pytest.MonkeyPatch, kube: Kube, store: ObjectStore
) -> postgrescluster.Scope:
    """A new cluster's scope for ensure_secrets, its CA already there."""

    async def ca(*_: Any) -> str:
        return "CA"

    async def nothing(*_: Any) -> None:
        return None

    monkeypatch.setattr(postgrescluster.certificates, "ca_cert", ca)
    monkeypatch.setattr(postgrescluster.certificates, "refresh_ca_copy", nothing)
    return postgrescluster.Scope(
        cluster=make_cluster(metadata={"uid": "new-uid"}),
        body={"metadata": {"name": "demo", "namespace": "db", "uid": "new-uid"}},
        kube=kube,  # type: ignore[arg-type]
        store=store,
        now="2026-12-04T00:00:00Z",
        conditions=[],
    )


@pytest.mark.parametrize(
    ("claims", "outcome"),
    [
        # The deleted cluster's volumes, going: wait, make nothing.
        ([("data-demo-0", True)], "wait"),
        # This cluster's data is there and its Secret is not: never new passwords.
        ([("data-demo-0", False)], "refuse"),
        ([("data-demo-0", True), ("data-demo-1", False)], "refuse"),
        # Nothing there: a new cluster gets new credentials.
        ([], "create"),
    ],
)
async def test_missing_secrets_wait_for_a_deleted_clusters_volumes_and_never_override_data(
    monkeypatch: pytest.MonkeyPatch, claims: list[tuple[str, bool]], outcome: str
) -> None:
    store = ObjectStore()
    for name, deleting in claims:
        store.observe(claim(name, deleting=deleting))
    kube = Creating(store)
    scope = secrets_scope(monkeypatch, kube, store)
    note = await postgrescluster.ensure_secrets(scope)
    if outcome == "wait":
        assert note == "waiting for the previous cluster's volumes data-demo-0 to be deleted"
        assert scope.halted and kube.created == []
    elif outcome == "refuse":
        assert not scope.halted
        assert [reason for reason, _ in scope.degraded] == ["SecretMissing"] * 3
        assert kube.created == ["demo-patroni-api"]  # no data depends on it
    else:
        assert not scope.halted and scope.degraded == []
        assert set(kube.created) == {
            "demo-superuser", "demo-replication", "demo-app", "demo-patroni-api",
        }  # fmt: skip


async def test_a_volume_whose_deletion_the_watch_missed_is_asked_about_not_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = ObjectStore()
    store.observe(claim("data-demo-0", deleting=True))  # gone on the server: get() says None
    kube = Creating(None)
    scope = secrets_scope(monkeypatch, kube, store)
    await postgrescluster.ensure_secrets(scope)
    assert not scope.halted and "demo-superuser" in kube.created
    assert store.get("PersistentVolumeClaim", "db", "data-demo-0") is None


class Concurrent(Creating):
    """Each create waits until every one of ``expected`` has been sent: a reconcile that
    made them one after another would never get past the first."""

    def __init__(self, expected: int) -> None:
        super().__init__(None)
        self.expected = expected
        self.all_sent = asyncio.Event()
        self.conflicted = "demo-app"

    async def create(self, body: dict[str, Any]) -> dict[str, Any]:
        self.created.append(body["metadata"]["name"])
        if len(self.created) == self.expected:
            self.all_sent.set()
        await asyncio.wait_for(self.all_sent.wait(), 5)
        if body["metadata"]["name"] == self.conflicted:
            status = type("S", (), {"code": 409, "message": "exists", "reason": "AlreadyExists"})
            raise ApiError(status=status())  # type: ignore[call-arg]
        return body


async def test_a_new_clusters_credentials_are_made_in_one_round_trip(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = ObjectStore()
    kube = Concurrent(expected=4)
    scope = secrets_scope(monkeypatch, kube, store)
    note = await postgrescluster.ensure_secrets(scope)
    # One was made a moment ago by another reconcile (409): the rest count as made here.
    assert note == "created demo-superuser, demo-replication, demo-patroni-api"
    assert store.get("Secret", "db", "demo-superuser") is not None
