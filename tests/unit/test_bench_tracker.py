"""The benchmark's observer (bench.run.Tracker): a light poll, and each cluster converged
when its status was current and every child had been made, from the audit log's times."""

from __future__ import annotations

import json
import types
from typing import Any

import httpx
import pytest
from bench import probes
from bench.run import CHILD_PATHS, PGC_PATH, RESOURCES, ClusterWatch, Tracker, expected_children

pytestmark = pytest.mark.unit


class Api:
    """The API server as the tracker sees it: clusters with a status, children by kind."""

    def __init__(self) -> None:
        self.clusters: list[dict[str, Any]] = []
        self.children: dict[str, set[str]] = {kind: set() for kind in CHILD_PATHS}
        self.paths: list[str] = []

    def items(self, path: str) -> list[dict[str, Any]]:
        self.paths.append(path)
        assert path == PGC_PATH
        return self.clusters

    def names(self, path: str) -> set[str]:
        self.paths.append(path)
        (kind,) = [kind for kind, at in CHILD_PATHS.items() if at == path]
        return self.children[kind]

    def status(self, name: str, phase: str | None, observed: int = 1) -> None:
        self.clusters = [c for c in self.clusters if c["metadata"]["name"] != name]
        self.clusters.append(
            {"metadata": {"name": name, "generation": 1},
             "status": {"observedGeneration": observed, "phase": phase}}
        )  # fmt: skip

    def make_children(self, name: str) -> None:
        for kind, child in expected_children(name, 1):
            self.children[kind].add(child)


def test_children_are_listed_only_every_few_rounds_and_once_every_status_is_current() -> None:
    api, tracker = Api(), Tracker(["pg-0", "pg-1"], 1, children_every=3)
    api.status("pg-0", "Creating")
    api.make_children("pg-0")
    tracker.poll(api)
    tracker.poll(api)
    assert api.paths == [PGC_PATH, PGC_PATH], "no child LIST before the third round"
    assert tracker.converged_at == {}
    tracker.poll(api)  # the third: pg-0's children confirmed
    assert set(tracker.converged_at) == {"pg-0"}
    api.paths.clear()
    api.status("pg-1", "Creating")
    tracker.poll(api)  # every status current: confirmed at once, however due
    assert len(api.paths) > 1 and not tracker.all_converged(), "pg-1 has no children yet"
    api.make_children("pg-1")
    tracker.poll(api)
    assert tracker.all_converged()


def test_a_status_without_a_current_generation_or_phase_is_not_converged() -> None:
    api, tracker = Api(), Tracker(["pg-0"], 1, children_every=1)
    api.make_children("pg-0")
    api.status("pg-0", None)
    tracker.poll(api)
    api.status("pg-0", "Creating", observed=0)
    tracker.poll(api)
    assert tracker.converged_at == {}


def test_the_audit_log_dates_the_children_and_a_status_seen_late_still_counts() -> None:
    api, tracker = Api(), Tracker(["pg-0", "pg-1"], 1, children_every=1)
    for name in ("pg-0", "pg-1"):
        api.make_children(name)
        api.status(name, "Creating")
    tracker.poll(api)
    seen = tracker.status_at["pg-0"]
    made = {(RESOURCES[kind], child): seen - 5 for kind, child in expected_children("pg-0", 1)}
    made[("statefulsets", "pg-0")] = seen - 1  # the last child; the status came after it
    later = {(RESOURCES[kind], child): seen + 3 for kind, child in expected_children("pg-1", 1)}
    partial = dict(list(later.items())[1:])  # pg-1 lacks one: its LIST time stays
    tracker.refine({**made, **partial})
    assert tracker.converged_at["pg-0"] == seen, "its status was seen after every child"
    assert tracker.converged_at["pg-1"] == tracker.children_at["pg-1"]
    tracker.refine({**made, **later})
    assert tracker.converged_at["pg-1"] == seen + 3, "a child made after the status was seen"


def audit(verb: str, name: str, at: str, *, code: int = 201, **ref: str) -> str:
    return json.dumps(
        {
            "stage": ref.pop("stage", "ResponseComplete"),
            "verb": verb,
            "user": {"username": ref.pop("user", probes.OPERATOR_USER)},
            "objectRef": {"namespace": "bench", "resource": "secrets", "name": name, **ref},
            "stageTimestamp": at,
            "responseStatus": {"code": code},
        }
    )


def test_the_first_successful_write_of_each_object_is_when_it_was_made() -> None:
    found: dict[tuple[str, str], float] = {}
    probes.found_in(
        [
            audit("create", "pg-0-ca", "2026-12-06T10:00:02Z"),
            audit("patch", "pg-0-ca", "2026-12-06T10:00:09Z"),  # a later write: not its making
            audit("create", "pg-0-app", "2026-12-06T10:00:01Z", code=409),  # refused
            audit("create", "pg-0-app", "2026-12-06T10:00:03Z"),
            audit("create", "pg-0-tls", "2026-12-06T10:00:01Z", stage="ResponseStarted"),
            audit("create", "pg-0-x", "2026-12-06T10:00:01Z", user="admin"),
            audit("create", "pg-0-y", "2026-12-06T10:00:01Z", namespace="other"),
            audit(
                "patch",
                "pg-0",
                "2026-12-06T10:00:01Z",
                resource="postgresclusters",
                subresource="status",
            ),
            audit("get", "pg-0-z", "2026-12-06T10:00:01Z"),
            "not json",
        ],
        "bench",
        found,
    )
    base = 1796551200.0  # 2026-12-06T10:00:00Z
    assert found == {("secrets", "pg-0-ca"): base + 2, ("secrets", "pg-0-app"): base + 3}


def cluster(name: str, phase: str | None, version: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "generation": 1, "resourceVersion": version},
        "status": {"observedGeneration": 1, "phase": phase} if phase else {},
    }


def test_the_watch_feeds_each_change_and_relists_when_its_version_is_gone() -> None:
    """The clusters come from one LIST and then a watch stream, each change as it happens;
    a watch the server ended with 410 Gone starts again from a new LIST."""

    tracker = Tracker(["pg-0", "pg-1"], 1)
    requests: list[str] = []
    streams = [
        [
            {"type": "ADDED", "object": cluster("pg-1", None, "11")},
            {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "12"}}},
            {"type": "MODIFIED", "object": cluster("pg-1", "Creating", "13")},
            {"type": "ERROR", "object": {"code": 410, "reason": "Expired"}},
        ],
        [{"type": "MODIFIED", "object": cluster("pg-1", "Ready", "21")}],
    ]
    lists = [("10", [cluster("pg-0", "Ready", "9")]), ("20", [])]

    def answer(request: httpx.Request) -> httpx.Response:
        params = dict(request.url.params)
        requests.append(params.get("resourceVersion", "list"))
        if params.get("watch") != "1":
            version, items = lists.pop(0)
            return httpx.Response(
                200, json={"metadata": {"resourceVersion": version}, "items": items}
            )
        if not streams:
            watch.stop_event.set()
            return httpx.Response(200, content=b"")
        lines = "\n".join(json.dumps(e) for e in streams.pop(0)) + "\n"
        return httpx.Response(200, content=lines.encode())

    api = types.SimpleNamespace(
        http=httpx.Client(base_url="https://api.test", transport=httpx.MockTransport(answer))
    )
    watch = ClusterWatch(api, tracker, timeout=1)  # type: ignore[arg-type]
    watch._run()
    watch.check()
    assert requests == ["list", "10", "list", "20", "21"]
    assert set(tracker.ready_at) == {"pg-0", "pg-1"} and tracker.all_ready()
    assert tracker.status_at["pg-1"] < tracker.ready_at["pg-1"], "Creating was seen first"
    assert watch.lists == 2


def test_a_watch_that_keeps_failing_is_reported_not_waited_on() -> None:

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    api = types.SimpleNamespace(
        http=httpx.Client(base_url="https://api.test", transport=httpx.MockTransport(refuse))
    )
    watch = ClusterWatch(api, Tracker(["pg-0"], 1), timeout=1)  # type: ignore[arg-type]
    watch.stop_event.wait = lambda timeout=None: False  # type: ignore[method-assign]
    watch._run()
    with pytest.raises(RuntimeError, match="the clusters' watch failed"):
        watch.check()
