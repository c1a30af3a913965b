"""apply_children: one reconcile builds the Patroni configuration once."""

from __future__ import annotations

from typing import Any

import pytest

from stateward.controllers.postgres import reconcile as postgrescluster
from stateward.controllers.store import ObjectStore
from stateward.instance import patroni
from stateward.specs.postgres import config as config_spec
from tests.support.clusters import make_cluster

pytestmark = pytest.mark.unit


class FakeKube:
    def __init__(self) -> None:
        self.applied: list[dict[str, Any]] = []

    async def apply(self, body: dict[str, Any]) -> dict[str, Any]:
        self.applied.append(body)
        return body

    async def event(self, body: Any, **fields: Any) -> None:
        pass


async def test_apply_children_builds_patroni_yaml_once(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[str] = []
    configuration = config_spec.configuration

    def counting(cluster: Any, **kwargs: Any) -> dict[str, Any]:
        built.append(cluster.name)
        return configuration(cluster, **kwargs)

    monkeypatch.setattr(config_spec, "configuration", counting)
    cluster = make_cluster()
    kube = FakeKube()
    scope = postgrescluster.Scope(
        cluster=cluster,
        body={"metadata": {"name": cluster.name, "namespace": cluster.namespace}},
        kube=kube,  # type: ignore[arg-type]
        store=ObjectStore(),
        now="2025-01-01T00:00:00Z",
        conditions=[],
    )
    await postgrescluster.apply_children(scope)
    assert built == [cluster.name]  # the ConfigMap's text and the pod template's hash share it
    (config_map,) = [
        b for b in kube.applied if b["metadata"]["name"] == cluster.patroni_config_map_name
    ]
    (sts,) = [b for b in kube.applied if b["kind"] == "StatefulSet"]
    document = configuration(cluster, labels=sts["spec"]["selector"]["matchLabels"])
    assert config_map["data"]["patroni.yaml"] == patroni.dump(document)


def test_a_status_patch_replaces_nested_records_instead_of_merging_them() -> None:
    current = {
        "phase": "Ready",
        "lastFailover": {"fromPod": "pg-1", "toPod": "pg-0", "cause": "its node went out"},
        "switchover": {"phase": "Succeeded", "finishedAt": "t1", "message": "done"},
        "gone": 1,
    }
    desired = {
        "phase": "Ready",
        "lastFailover": {"fromPod": "pg-0", "toPod": "pg-2"},
        "switchover": {"phase": "Running", "startedAt": "t2"},
    }
    patch = postgrescluster.replacing_patch(current, desired)
    assert patch == {
        "gone": None,
        "phase": "Ready",
        "lastFailover": {"fromPod": "pg-0", "toPod": "pg-2", "cause": None},
        "switchover": {"phase": "Running", "startedAt": "t2", "finishedAt": None, "message": None},
    }
