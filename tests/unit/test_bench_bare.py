"""The bare-client limit (bench.bare): which recorded writes are replayed, how a body is
moved to the new namespace and owner, and that each cluster's writes go in their order."""

from __future__ import annotations

import datetime
import json
import threading
from typing import Any

import pytest
from bench import bare

pytestmark = pytest.mark.unit

USER = "stateward-operator"


def entry(
    audit_id: str,
    verb: str,
    name: str,
    at: str = "2026-12-04T10:00:01.000000Z",
    *,
    user: str = USER,
    namespace: str = "bench",
    code: int = 201,
    uri: str = "/api/v1/namespaces/bench/secrets",
    body: Any = None,
) -> str:
    return json.dumps(
        {
            "auditID": audit_id,
            "verb": verb,
            "user": {"username": user},
            "objectRef": {"namespace": namespace, "name": name, "resource": "secrets"},
            "requestReceivedTimestamp": at,
            "responseStatus": {"code": code},
            "requestURI": uri,
            "requestObject": body,
        }
    )


START = datetime.datetime(2026, 12, 4, 10, tzinfo=datetime.UTC).timestamp()


def test_the_operators_successful_writes_in_the_window_are_kept_by_cluster_in_order() -> None:
    lines = [
        entry("a", "create", "pg-0001-app", "2026-12-04T10:00:03Z", body={"kind": "Secret"}),
        entry("b", "create", "pg-0001-ca", "2026-12-04T10:00:02Z"),
        entry("b", "create", "pg-0001-ca", "2026-12-04T10:00:02Z"),  # a second stage: once
        entry("c", "patch", "pg-0002", "2026-12-04T10:00:02Z"),
        entry("d", "create", "pg-0003.1a2b3c", "2026-12-04T10:00:02Z"),  # an Event
        entry("e", "get", "pg-0001", "2026-12-04T10:00:02Z"),  # a read
        entry("f", "create", "pg-0001-x", "2026-12-04T10:00:02Z", user="admin"),
        entry("g", "create", "pg-0001-y", "2026-12-04T10:00:02Z", namespace="other"),
        entry("h", "create", "pg-0001-z", "2026-12-04T10:00:02Z", code=409),
        entry("i", "create", "pg-0001-late", "2026-12-04T10:20:00Z"),
        entry("j", "update", "stateward-operator-leader", "2026-12-04T10:00:02Z"),
        "not json",
    ]
    found = bare.recorded_writes(lines, USER, "bench", START, START + 60)
    assert {name: [w.uri for w in writes] for name, writes in found.items()} == {
        "pg-0001": ["/api/v1/namespaces/bench/secrets"] * 2,
        "pg-0002": ["/api/v1/namespaces/bench/secrets"],
        "pg-0003": ["/api/v1/namespaces/bench/secrets"],
    }
    assert [w.body for w in found["pg-0001"]] == [None, {"kind": "Secret"}]  # by time sent


@pytest.mark.parametrize(
    ("verb", "uri", "body", "content_type"),
    [
        ("create", "/api/v1/namespaces/b/secrets", {}, "application/json"),
        ("patch", "/apis/apps/v1/x?fieldManager=stateward&force=true", {}, bare.APPLY),
        ("patch", "/apis/stateward.io/v1alpha1/x/status", {"status": {}}, bare.MERGE),
        ("patch", "/apis/stateward.io/v1alpha1/x", [{"op": "add"}], bare.JSON_PATCH),
    ],
)
def test_each_write_is_sent_as_it_was(verb: str, uri: str, body: Any, content_type: str) -> None:
    assert bare.Write(0.0, verb, uri, body).content_type == content_type


def test_a_body_moves_to_the_new_namespace_and_owner() -> None:
    body = {
        "metadata": {
            "name": "pg-0001-app",
            "namespace": "bench",
            "resourceVersion": "17",
            "ownerReferences": [{"kind": "PostgresCluster", "name": "pg-0001", "uid": "old"}],
        },
        "involvedObject": {"kind": "PostgresCluster", "namespace": "bench", "uid": "old"},
        "data": {"namespace": "bench-like text stays"},
    }
    moved = bare.rewrite(body, source="bench", target="bench-bare", uid="new")
    assert moved["metadata"]["namespace"] == "bench-bare"
    assert "resourceVersion" not in moved["metadata"]
    assert moved["metadata"]["ownerReferences"][0]["uid"] == "new"
    assert moved["involvedObject"] == {
        "kind": "PostgresCluster", "namespace": "bench-bare", "uid": "new"
    }  # fmt: skip
    assert moved["data"] == {"namespace": "bench-like text stays"}
    uri = "/api/v1/namespaces/bench/secrets?fieldManager=stateward"
    assert bare.rewrite(uri, source="bench", target="bench-bare", uid="new") == (
        "/api/v1/namespaces/bench-bare/secrets?fieldManager=stateward"
    )


class Response:
    def __init__(self, status_code: int) -> None:
        self.status_code = status_code


class Http:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, bytes, str]] = []
        self.lock = threading.Lock()

    def request(self, method: str, url: str, *, content: bytes, headers: dict[str, str]) -> Any:
        with self.lock:
            self.sent.append((method, url, content, headers["Content-Type"]))
        return Response(409 if b"taken" in content else 201)


def test_each_cluster_is_created_then_gets_its_writes_in_order() -> None:
    owner = [{"kind": "PostgresCluster", "name": "x", "uid": "recorded"}]
    writes = {
        name: [
            bare.Write(1.0, "create", "/api/v1/namespaces/bench/secrets",
                       {"metadata": {"namespace": "bench", "ownerReferences": owner}}),
            bare.Write(2.0, "patch", "/apis/x/namespaces/bench/y?fieldManager=s&force=true",
                       {"metadata": {"name": "taken", "ownerReferences": owner}}),
        ]
        for name in ("pg-0000", "pg-0001")
    }  # fmt: skip
    created: list[str] = []

    def create_cluster(name: str) -> str:
        created.append(name)
        return f"uid-{name}"

    http = Http()
    done = bare.replay(
        http, create_cluster, ["pg-0000", "pg-0001"], writes,
        source="bench", target="bench-bare", workers=2,
    )  # fmt: skip
    assert sorted(created) == ["pg-0000", "pg-0001"]
    assert done.writes == 4 and done.refused == {"patch 409": 2}
    assert done.last_answered >= done.first_sent
    for name in ("pg-0000", "pg-0001"):
        mine = [s for s in http.sent if f"uid-{name}".encode() in s[2]]
        assert [(method, content_type) for method, _, _, content_type in mine] == [
            ("POST", "application/json"),
            ("PATCH", bare.APPLY),
        ]
        assert mine[0][1] == "/api/v1/namespaces/bench-bare/secrets"
        assert json.loads(mine[0][2])["metadata"]["namespace"] == "bench-bare"


def test_a_cluster_without_recorded_writes_stops_the_replay() -> None:
    with pytest.raises(RuntimeError, match="no recorded write"):
        bare.replay(Http(), lambda name: "u", ["pg-0000"], {}, source="a", target="b", workers=1)


def test_a_statefulset_counts_once_every_replica_is_ready() -> None:
    def sts(name: str, replicas: int, ready: int | None) -> dict[str, Any]:
        status = {} if ready is None else {"readyReplicas": ready}
        return {"metadata": {"name": name}, "spec": {"replicas": replicas}, "status": status}

    items = [sts("pg-0000", 3, 3), sts("pg-0001", 3, 2), sts("pg-0002", 1, None),
             sts("other", 1, 1)]  # fmt: skip
    assert bare.statefulsets_ready(items, ["pg-0000", "pg-0001", "pg-0002"]) == 1


def test_status_patches_are_counted_per_cluster_up_to_the_one_that_says_ready() -> None:
    status = "/apis/stateward.io/v1alpha1/namespaces/bench/postgresclusters/pg-000{}/status"

    def patch(cluster: int, phase: str) -> bare.Write:
        return bare.Write(0.0, "patch", status.format(cluster), {"status": {"phase": phase}})

    other = bare.Write(0.0, "patch", "/apis/apps/v1/namespaces/bench/statefulsets/pg-0001", {})
    found = bare.status_patches_until_ready(
        {
            "pg-0001": [patch(1, "Creating"), other, patch(1, "Ready"), patch(1, "Updating")],
            "pg-0002": [patch(2, "Ready")],
            "pg-0003": [patch(3, "Creating"), patch(3, "Failing"), patch(3, "Creating")],
        }
    )
    # After Ready nothing counts; a cluster never Ready counts all it had. Between its
    # first and its Ready, pg-0003 said a problem once and progress once.
    assert found == {"mean": 2.0, "max": 3, "between": {"problem": 1, "progress": 1}}
    assert bare.status_patches_until_ready({})["max"] == 0


def test_a_degraded_condition_between_first_and_ready_is_a_problem() -> None:
    uri = "/apis/stateward.io/v1alpha1/namespaces/bench/postgresclusters/pg-0001/status"
    degraded = {"type": "Degraded", "status": "True", "reason": "InstancesNotRunning"}
    calm = {"type": "Degraded", "status": "False", "reason": "AsExpected"}
    writes = [
        bare.Write(0.0, "patch", uri, {"status": {"phase": "Creating"}}),
        bare.Write(1.0, "patch", uri, {"status": {"conditions": [degraded]}}),
        bare.Write(2.0, "patch", uri, {"status": {"conditions": [calm]}}),
        bare.Write(3.0, "patch", uri, {"status": {"phase": "Ready"}}),
    ]
    found = bare.status_patches_until_ready({"pg-0001": writes})
    assert found["between"] == {"problem": 1, "progress": 1}
