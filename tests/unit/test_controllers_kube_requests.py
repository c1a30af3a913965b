"""What Kube sends the API server for each call, and how it reads the answers."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from lightkube import ApiError

from stateward.controllers.kube import Kube, Ref, path, transient

pytestmark = pytest.mark.unit

STS = {
    "apiVersion": "apps/v1",
    "kind": "StatefulSet",
    "metadata": {"name": "pg", "namespace": "n"},
    "spec": {"replicas": 3},
}


class Recording:
    """Kube's transport: records each request and gives the next canned answer."""

    def __init__(self, *answers: tuple[int, Any]) -> None:
        self.answers = list(answers)
        self.sent: list[dict[str, Any]] = []

    async def request(
        self,
        method: str,
        url: str,
        *,
        params: Any = None,
        body: bytes | None = None,
        content_type: str | None = None,
    ) -> tuple[int, bytes]:
        self.sent.append(
            {
                "method": method,
                "url": url,
                "params": dict(params or {}),
                "body": None if body is None else json.loads(body),
                "content_type": content_type,
            }
        )
        status, answer = self.answers.pop(0)
        return status, answer if isinstance(answer, bytes) else json.dumps(answer).encode()


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Status",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def test_paths_of_objects_and_collections_core_grouped_ours_and_cluster_scoped() -> None:
    assert path("v1", "Secret", "n", "s") == "/api/v1/namespaces/n/secrets/s"
    assert path("v1", "Event", "n") == "/api/v1/namespaces/n/events"
    assert path("apps/v1", "StatefulSet", "n", "pg") == "/apis/apps/v1/namespaces/n/statefulsets/pg"
    assert (
        path("stateward.io/v1alpha1", "PostgresCluster", "n", "pg")
        == "/apis/stateward.io/v1alpha1/namespaces/n/postgresclusters/pg"
    )
    assert (
        path("rbac.authorization.k8s.io/v1", "ClusterRole", "", "r")
        == "/apis/rbac.authorization.k8s.io/v1/clusterroles/r"
    )


def test_apply_is_a_forced_server_side_apply_under_our_field_manager() -> None:
    transport = Recording((200, {**STS, "metadata": {**STS["metadata"], "uid": "u"}}))
    applied = run(Kube(transport).apply(STS))
    assert applied["metadata"]["uid"] == "u"
    assert transport.sent == [
        {
            "method": "PATCH",
            "url": "/apis/apps/v1/namespaces/n/statefulsets/pg",
            "params": {"fieldManager": "stateward", "force": "true"},
            "body": STS,
            "content_type": "application/apply-patch+yaml",
        }
    ]


def test_create_posts_to_the_collection() -> None:
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "n"}}
    transport = Recording((201, secret))
    assert run(Kube(transport).create(secret)) == secret
    sent = transport.sent[0]
    assert (sent["method"], sent["url"]) == ("POST", "/api/v1/namespaces/n/secrets")
    assert sent["params"] == {"fieldManager": "stateward"} and sent["body"] == secret


def test_patches_merge_json_and_status() -> None:
    ref = Ref("stateward.io/v1alpha1", "PostgresCluster", "n", "pg")
    transport = Recording((200, {}), (200, {}))
    kube = Kube(transport)
    run(kube.patch(ref, {"status": {"phase": "Ready"}}, status=True))
    run(kube.patch(ref, [{"op": "remove", "path": "/metadata/finalizers/0"}], json_patch=True))
    merge, json_patch = transport.sent
    assert merge["url"] == "/apis/stateward.io/v1alpha1/namespaces/n/postgresclusters/pg/status"
    assert merge["content_type"] == "application/merge-patch+json"
    assert json_patch["url"] == "/apis/stateward.io/v1alpha1/namespaces/n/postgresclusters/pg"
    assert json_patch["content_type"] == "application/json-patch+json"
    assert json_patch["body"] == [{"op": "remove", "path": "/metadata/finalizers/0"}]


def test_delete_chooses_propagation_and_a_missing_object_counts_as_deleted() -> None:
    gone = status(404, "NotFound", 'statefulsets.apps "pg" not found')
    transport = Recording((200, {}), (404, gone))
    kube = Kube(transport)
    run(kube.delete(Ref.of(STS), orphan=True))
    run(kube.delete(Ref.of(STS)))
    assert [s["params"] for s in transport.sent] == [
        {"propagationPolicy": "Orphan"},
        {"propagationPolicy": "Background"},
    ]
    assert {s["method"] for s in transport.sent} == {"DELETE"}


def test_get_returns_the_object_or_none_when_missing() -> None:
    gone = status(404, "NotFound", 'secrets "s" not found')
    transport = Recording((200, {"kind": "Secret"}), (404, gone))
    kube = Kube(transport)
    assert run(kube.get("v1", "Secret", "n", "s")) == {"kind": "Secret"}
    assert run(kube.get("v1", "Secret", "n", "s")) is None
    assert transport.sent[0]["method"] == "GET" and transport.sent[0]["body"] is None


def test_list_selects_by_labels_and_types_each_item() -> None:
    items = {"items": [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}]}
    transport = Recording((200, items), (200, {"items": None}))
    kube = Kube(transport)
    found = run(kube.list_objects("v1", "ConfigMap", "n", {"a": "1", "b": "2"}))
    assert [(f["apiVersion"], f["kind"], f["metadata"]["name"]) for f in found] == [
        ("v1", "ConfigMap", "a"),
        ("v1", "ConfigMap", "b"),
    ]
    assert transport.sent[0]["params"] == {"labelSelector": "a=1,b=2"}
    assert run(kube.list_objects("v1", "ConfigMap", "n", {})) == []
    assert transport.sent[1]["params"] == {}


def test_a_refusal_raises_the_api_servers_status() -> None:
    conflict = status(409, "Conflict", 'Operation cannot be fulfilled on statefulsets "pg"')
    with pytest.raises(ApiError) as raised:
        run(Kube(Recording((409, conflict))).apply(STS))
    assert raised.value.status.code == 409
    assert raised.value.status.reason == "Conflict"
    assert "cannot be fulfilled" in str(raised.value.status.message)
    assert not transient(raised.value)


def test_a_refusal_that_is_no_status_still_carries_its_code_and_is_transient() -> None:
    with pytest.raises(ApiError) as raised:
        run(Kube(Recording((503, b"storage is (re)initializing"))).get("v1", "Secret", "n", "s"))
    assert raised.value.status.code == 503
    assert "storage is (re)initializing" in str(raised.value.status.message)
    assert transient(raised.value)


def test_a_write_is_counted_and_refused_without_leadership() -> None:
    counted: list[tuple[str, str]] = []
    transport = Recording((200, STS))
    run(Kube(transport, on_write=lambda verb, kind: counted.append((verb, kind))).apply(STS))
    assert counted == [("apply", "StatefulSet")]
    idle = Recording()
    with pytest.raises(Exception, match="not the leader"):
        run(Kube(idle, may_write=lambda: False).apply(STS))
    assert idle.sent == []
