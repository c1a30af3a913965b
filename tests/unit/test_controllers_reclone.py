"""A diverged MariaDB server gets a new volume, and its old one is kept, never deleted."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from stateward.controllers import database
from stateward.controllers.kube import Ref
from stateward.controllers.mariadb import reconcile as mariadb
from stateward.controllers.store import ObjectStore
from stateward.specs.mariadb import servers as mysql_spec
from tests.unit.test_specs_database import make_database

pytestmark = pytest.mark.unit


class Recorder:
    """The writes of a reconcile, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, Any]] = []

    async def patch(self, ref: Ref, patch: Any, **_: Any) -> dict[str, Any]:
        self.calls.append(("patch", ref, patch))
        return {}

    async def delete(self, ref: Ref, **_: Any) -> None:
        self.calls.append(("delete", ref, None))

    async def event(self, involved: Any, *, reason: str, message: str, warning: bool) -> None:
        self.calls.append(("event", reason, message))

    volumes: set[str] = set()

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Any:
        self.calls.append(("get", kind, name))
        return {"metadata": {"name": name}} if name in self.volumes else None


def make_scope(kube: Recorder, store: ObjectStore, **status: Any) -> database.Scope:
    db = make_database()
    return database.Scope(
        database=db, body=db.model_dump(by_alias=True), kube=kube, store=store,  # type: ignore[arg-type]
        now="2026-12-04T00:00:00Z", conditions=[], primary="shop-1", **status,
    )  # fmt: skip


def test_the_diverged_volume_is_retained_and_named_before_its_claim_goes() -> None:
    store = ObjectStore()
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": f"{mysql_spec.DATA_VOLUME}-shop-0", "namespace": "apps"},
        "spec": {"volumeName": "pv-17"},
    }
    store.observe(claim)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "shop-0", "namespace": "apps"}}
    kube = Recorder()
    scope = make_scope(kube, store)
    gtids = {"shop-0": "0-1-120", "shop-1": "0-2-118"}
    asyncio.run(mariadb._reclone(scope, pod, gtids))

    verbs = [(verb, getattr(target, "kind", target)) for verb, target, _ in kube.calls]
    assert verbs == [
        ("patch", "PersistentVolume"),  # first: nothing is deleted before the volume is safe
        ("delete", "PersistentVolumeClaim"),
        ("delete", "Pod"),
        ("event", "ServerRecloned"),
    ]
    _, volume, patch = kube.calls[0]
    assert volume.name == "pv-17"
    assert patch["spec"] == {"persistentVolumeReclaimPolicy": "Retain"}
    assert patch["metadata"]["labels"] == {mariadb.DIVERGED_FROM_LABEL: "apps.shop"}
    assert patch["metadata"]["annotations"] == {
        "stateward.io/diverged-pod": "shop-0",
        "stateward.io/diverged-gtid": "0-1-120",
    }
    message = kube.calls[-1][2]
    assert "0-1-120" in message and "0-2-118" in message
    assert "PersistentVolume pv-17" in message and "delete it" in message

    # Listed in the status, and the Diverged condition says what to do with it.
    assert scope.diverged == [
        {"volume": "pv-17", "pod": "shop-0", "gtid": "0-1-120", "at": "2026-12-04T00:00:00Z"}
    ]
    (diverged,) = [c for c in scope.conditions if c["type"] == "Diverged"]
    assert diverged["status"] == "True" and diverged["reason"] == "DivergedVolumeKept"
    assert "pv-17" in diverged["message"] and "0-1-120" in diverged["message"]


class BoundSince(Recorder):
    """The API server knows the claim bound to pv-17; the store has not seen that yet."""

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Any:
        self.calls.append(("get", kind, name))
        return {"metadata": {"name": name}, "spec": {"volumeName": "pv-17"}}


def test_a_claim_seen_unbound_is_asked_afresh_before_it_goes() -> None:
    # Its binding wakes no reconcile (members.READ_ONLY): the store may lag it, and a claim
    # taken for unbound would go with its volume's data.
    store = ObjectStore()
    name = f"{mysql_spec.DATA_VOLUME}-shop-0"
    store.observe(
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
         "metadata": {"name": name, "namespace": "apps"}, "spec": {}}
    )  # fmt: skip
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "shop-0", "namespace": "apps"}}
    kube = BoundSince()
    asyncio.run(mariadb._reclone(make_scope(kube, store), pod, {"shop-0": "0-1-120"}))
    verbs = [(verb, getattr(target, "kind", target)) for verb, target, _ in kube.calls]
    assert verbs[:3] == [
        ("get", "PersistentVolumeClaim"),
        ("patch", "PersistentVolume"),
        ("delete", "PersistentVolumeClaim"),
    ]
    assert kube.calls[1][1].name == "pv-17"


def test_diverged_stays_while_the_volume_exists_and_clears_once_the_user_deletes_it() -> None:
    kube = Recorder()
    kube.volumes = {"pv-17"}
    entries = [
        {"volume": "pv-17", "pod": "shop-0", "gtid": "0-1-120", "at": "t1"},
        {"volume": "pv-20", "pod": "shop-2", "gtid": "0-3-9", "at": "t2"},
    ]
    scope = make_scope(kube, ObjectStore(), diverged=[dict(e) for e in entries])
    note = asyncio.run(mariadb.check_diverged(scope))
    assert note == "diverged volumes deleted: pv-20"
    assert scope.diverged == entries[:1]
    assert [c["status"] for c in scope.conditions if c["type"] == "Diverged"] == ["True"]

    kube.volumes = set()
    asyncio.run(mariadb.check_diverged(scope))
    assert scope.diverged == []
    (diverged,) = [c for c in scope.conditions if c["type"] == "Diverged"]
    assert diverged["status"] == "False" and diverged["reason"] == "NoDivergedVolumes"


def test_a_database_that_never_diverged_reads_no_volume() -> None:
    kube = Recorder()
    scope = make_scope(kube, ObjectStore())
    assert asyncio.run(mariadb.check_diverged(scope)) is None
    assert kube.calls == [] and scope.conditions == []
