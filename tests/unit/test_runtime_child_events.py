"""Which watch events of a child wake its cluster's reconcile (Operator.on_child_event)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from stateward.runtime.operator import Operator, Options

pytestmark = pytest.mark.unit

CLUSTER = ("PostgresCluster", "db", "demo")


def service(version: str, *, port: int = 5432) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "demo-primary",
            "namespace": "db",
            "uid": "s1",
            "resourceVersion": version,
            "labels": {"stateward.io/cluster": "demo"},
        },
        "spec": {"ports": [{"port": port}]},
    }


@pytest.fixture
def operator() -> Operator:
    op = Operator(Options(), client=None, transport=None)  # type: ignore[arg-type]  # nothing is sent
    op.store.observe(
        {
            "apiVersion": "stateward.io/v1alpha1",
            "kind": "PostgresCluster",
            "metadata": {"name": "demo", "namespace": "db", "uid": "c1", "resourceVersion": "1"},
        }
    )
    return op


def queued(op: Operator) -> set[Any]:
    return set(op.queue._queued)


async def test_the_echo_of_a_write_already_observed_wakes_nothing(operator: Operator) -> None:
    operator.store.observe(service("10"))  # the apply's response
    operator.on_child_event("MODIFIED", copy.deepcopy(service("10")))  # its watch event
    assert queued(operator) == set()


async def test_a_change_made_by_someone_else_wakes_the_cluster(operator: Operator) -> None:
    operator.store.observe(service("10"))
    operator.on_child_event("MODIFIED", service("11", port=5433))
    assert queued(operator) == {CLUSTER}
    assert operator.store.get("Service", "db", "demo-primary")["spec"]["ports"] == [  # type: ignore[index]
        {"port": 5433}
    ]


async def test_a_child_seen_for_the_first_time_and_its_deletion_wake_the_cluster(
    operator: Operator,
) -> None:
    operator.on_child_event("ADDED", service("10"))
    assert queued(operator) == {CLUSTER}
    operator.queue._queued.clear()
    operator.on_child_event("DELETED", service("12"))
    assert queued(operator) == {CLUSTER}
    assert operator.store.get("Service", "db", "demo-primary") is None
