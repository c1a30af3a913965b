"""How many round trips, one after another, a new cluster's first reconcile waits for.

The API server answers every request in flight together, a round at a time (the fake's
``answer_round``), so the number of rounds until the reconcile returns is the length of its
longest chain of requests that each waited for the one before. Overlapping what nothing
reads (the finalizer, the first serving certificate) and binding each Role as soon as it
exists took a new cluster from seven rounds to five."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from lightkube import ApiError

from stateward.controllers import core
from stateward.controllers.kube import Ref
from stateward.controllers.postgres.reconcile import Reconciler
from stateward.controllers.store import ObjectStore
from tests.support.clusters import make_cluster

pytestmark = pytest.mark.unit


class RoundKube:
    """Answers requests only when the test says so, all those in flight at once."""

    def __init__(self) -> None:
        self.waiting: list[tuple[asyncio.Future[None], str]] = []
        self.log: list[tuple[int, str]] = []
        """(round it was answered in, request) in the order answered."""
        self.round = 0
        self.version = 0
        self.fail: set[str] = set()
        """Requests answered with a 409 instead."""

    def may_write(self) -> bool:
        return True

    async def _answer(self, what: str) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.append((future, what))
        await future
        if what in self.fail:
            raise ApiError(request=None, response=_Conflict())  # type: ignore[arg-type]

    def _versioned(self, body: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        body = copy.deepcopy(body)
        body["metadata"]["resourceVersion"] = str(self.version)
        body["metadata"].setdefault("uid", f"uid-{self.version}")
        return body

    async def create(self, body: dict[str, Any]) -> dict[str, Any]:
        await self._answer(f"create {body['kind']} {body['metadata']['name']}")
        return self._versioned(body)

    async def apply(self, body: dict[str, Any]) -> dict[str, Any]:
        await self._answer(f"apply {body['kind']} {body['metadata']['name']}")
        return self._versioned(body)

    async def patch(
        self, ref: Ref, patch: Any, *, status: bool = False, **_: Any
    ) -> dict[str, Any]:
        await self._answer(f"patch {ref.kind}{'/status' if status else ''} {ref.name}")
        body = copy.deepcopy(self.body)
        if status:
            body["status"] = {k: v for k, v in patch["status"].items() if v is not None}
        else:
            body["metadata"]["finalizers"] = patch["metadata"]["finalizers"]
        self.body = self._versioned(body)
        return self.body

    async def get(self, *args: Any) -> None:
        await self._answer(f"get {args[1]} {args[3]}")

    async def event(self, body: Any, **_: Any) -> None:
        return None  # sent in the background by the real client: no round of its own

    async def settle_events(self, involved: Any = None) -> None:
        return None

    async def answer_round(self) -> None:
        """Answer every request in flight at once."""
        answering, self.waiting = self.waiting, []
        self.round += 1
        for future, what in answering:
            self.log.append((self.round, what))
            future.set_result(None)


class _Conflict:
    status_code = 409

    def json(self) -> dict[str, Any]:
        return {"code": 409, "reason": "Conflict", "message": "conflict"}


def _new_cluster() -> tuple[Reconciler, RoundKube, ObjectStore]:
    cluster = make_cluster(replicas=1)
    body = cluster.model_dump(by_alias=True, exclude_none=True)
    body["metadata"].update(resourceVersion="1", generation=1)
    store = ObjectStore()
    store.observe(body)
    kube = RoundKube()
    kube.body = body  # type: ignore[attr-defined]
    return Reconciler(kube, store), kube, store  # type: ignore[arg-type]


async def _reconcile(reconciler: Reconciler, kube: RoundKube) -> Any:
    task = asyncio.ensure_future(reconciler.reconcile(("db", "demo")))
    while True:
        for _ in range(50):  # the reconcile's own computing between requests
            await asyncio.sleep(0)
        if task.done():
            return task.result()
        assert kube.waiting, f"the reconcile waits for nothing the fake holds: {kube.log}"
        await kube.answer_round()


def _round_of(kube: RoundKube, what: str) -> int:
    (found,) = [r for r, request in kube.log if request == what]
    return found


async def test_a_new_cluster_is_made_in_five_round_trips_with_nothing_out_of_order() -> None:
    reconciler, kube, store = _new_cluster()
    await _reconcile(reconciler, kube)
    assert kube.round == 5, kube.log
    finalizer = _round_of(kube, "patch PostgresCluster demo")
    ca = _round_of(kube, "create Secret demo-ca")
    serving = _round_of(kube, "apply Secret demo-tls")
    superuser = _round_of(kube, "create Secret demo-superuser")
    statefulset = _round_of(kube, "apply StatefulSet demo")
    role = _round_of(kube, "apply Role demo-instance")
    binding = _round_of(kube, "apply RoleBinding demo-instance")
    status = _round_of(kube, "patch PostgresCluster/status demo")
    assert finalizer == ca == 1  # the finalizer overlaps the first write, which needs nothing
    assert serving == superuser == 2  # the certificate and the credentials, both need the CA
    # No child before the finalizer that guards its data and the certificate its pods mount;
    # each RoleBinding after the Role it binds; the status last.
    assert statefulset == role == 3 and binding == 4 and status == 5
    body = store.get("PostgresCluster", "db", "demo")
    assert body is not None and body["metadata"]["finalizers"], "the finalizer is remembered"
    assert store.get("Secret", "db", "demo-tls") is not None  # the deferred write observed


async def test_a_failed_deferred_write_fails_the_reconcile_after_the_rest_is_observed() -> None:
    reconciler, kube, store = _new_cluster()
    kube.fail.add("patch PostgresCluster demo")  # the finalizer lost a race
    with pytest.raises(ApiError):
        await _reconcile(reconciler, kube)
    requests = [what for _, what in kube.log]
    assert not any(what.startswith("apply StatefulSet") for what in requests), (
        "no child is made while the finalizer is not in place"
    )
    # What went out beside it, the deferred certificate among it, is not forgotten: the
    # retry does not make it again.
    for name in ("demo-ca", "demo-tls", "demo-superuser"):
        assert store.get("Secret", "db", name) is not None, name


async def test_settle_raises_the_first_failure_once_every_deferred_write_ended() -> None:
    ended: list[str] = []

    async def write(name: str, fail: bool) -> None:
        await asyncio.sleep(0)
        ended.append(name)
        if fail:
            raise RuntimeError(name)

    scope = core.Scope(body={"metadata": {"name": "x"}}, kube=None, store=ObjectStore(),  # type: ignore[arg-type]
                       now="t", conditions=[])  # fmt: skip
    scope.defer(write("a", True))
    scope.defer(write("b", False))
    with pytest.raises(RuntimeError, match="a"):
        await scope.settle()
    assert sorted(ended) == ["a", "b"] and scope.deferred == []
    await scope.settle()  # nothing left: no failure raised twice
