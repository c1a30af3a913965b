"""Repository paths stay inside their namespace's prefix unless the administrator allows it:
the rule, the webhook's answer, and the operator's phase for objects stored before it."""

from __future__ import annotations

from typing import Any

import pytest

from stateward.api import validation
from stateward.controllers.postgres import backup_phases
from stateward.controllers.postgres import reconcile as postgrescluster
from stateward.controllers.store import ObjectStore
from stateward.runtime import webhook
from tests.support.clusters import BACKUP, make_cluster

pytestmark = pytest.mark.unit


def spec(backup_path: str | None = None, restore_path: str | None = None) -> dict[str, Any]:
    s3 = {**BACKUP["repository"]["s3"]}
    if backup_path is not None:
        s3["path"] = backup_path
    body: dict[str, Any] = {"backup": {"repository": {"s3": s3}}}
    if restore_path is not None:
        body["bootstrap"] = {"restore": {"cluster": "src", "path": restore_path}}
    return body


@pytest.mark.parametrize(
    "path", [None, "/shop", "/shop/orders", "/shop/orders/2026", "/shop/a-b_c"]
)
def test_paths_inside_the_namespace_pass(path: str | None) -> None:
    assert validation.repository_path_problems("shop", spec(path, path)) == []


@pytest.mark.parametrize("path", ["/", "/other/orders", "/shopping/orders", "/sho", "/x/shop"])
def test_a_path_outside_the_namespace_is_refused_naming_field_and_fix(path: str) -> None:
    (problem,) = validation.repository_path_problems("shop", spec(backup_path=path))
    assert problem.startswith(f"spec.backup.repository.s3.path: {path} is outside")
    assert "/shop/" in problem and "--allow-foreign-repository-paths" in problem
    (problem,) = validation.repository_path_problems("shop", spec(restore_path=path))
    assert problem.startswith(f"spec.bootstrap.restore.path: {path} is outside")


def review(namespace: str, body_spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "request": {
            "uid": "u1",
            "namespace": namespace,
            "object": {"metadata": {"name": "orders", "namespace": namespace}, "spec": {
                "version": "16", "replicas": 1, "storageSize": "1Gi", **body_spec,
            }},
        }
    }  # fmt: skip


def test_the_webhook_refuses_another_namespaces_path_unless_allowed() -> None:
    foreign = review("shop", spec(restore_path="/bank/ledger"))
    answer = webhook.review_response(foreign)["response"]
    assert answer["allowed"] is False
    assert "spec.bootstrap.restore.path: /bank/ledger" in answer["status"]["message"]
    allowed = webhook.review_response(foreign, foreign_repository_paths=True)["response"]
    assert allowed["allowed"] is True
    assert webhook.review_response(review("shop", spec("/shop/x")))["response"]["allowed"]


def test_the_webhook_is_asked_about_repository_paths() -> None:
    (condition,) = webhook.MATCH_CONDITIONS
    for path in ("spec.backup.repository.s3.path", "spec.bootstrap.restore.path"):
        assert f"has(object.{path})" in condition["expression"]


class Kube:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, bool]] = []

    async def event(self, body: Any, *, reason: str, message: str, warning: bool = False) -> None:
        self.events.append((reason, message, warning))


async def test_a_stored_foreign_path_halts_the_cluster_with_a_condition_and_one_event() -> None:
    cluster = make_cluster(backup={"repository": {"s3": {**BACKUP["repository"]["s3"],
                                                         "path": "/bank/ledger"}}})  # fmt: skip
    kube = Kube()

    def scope(conditions: list[dict[str, Any]]) -> postgrescluster.Scope:
        return postgrescluster.Scope(
            cluster=cluster,
            body=cluster.model_dump(by_alias=True, exclude_none=True),
            kube=kube,  # type: ignore[arg-type]
            store=ObjectStore(),
            now="2026-12-04T00:00:00Z",
            conditions=conditions,
        )

    first = scope([])
    assert await backup_phases.check_repository_paths(first) is not None
    assert first.halted
    ((reason, message),) = first.degraded
    assert reason == "RepositoryPathOutsideNamespace" and "/bank/ledger" in message
    assert kube.events == [("RepositoryPathOutsideNamespace", message, True)]
    # Told once: the next reconcile finds the condition and sends no second Event.
    again = scope([{"type": "Degraded", "status": "True", "reason": reason, "message": message}])
    await backup_phases.check_repository_paths(again)
    assert again.halted and len(kube.events) == 1
