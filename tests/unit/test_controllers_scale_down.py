"""core.hold_scale_down: what a StatefulSet scale-down may remove, for both engines."""

from __future__ import annotations

from typing import Any

import pytest

from stateward.controllers import core
from stateward.controllers.store import ObjectStore

pytestmark = pytest.mark.unit


def pod(name: str, phase: str = "Running") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "db"}, "status": {"phase": phase}}


def hold(
    have: int, wanted: int, primary: str | None, pods: list[dict[str, Any]]
) -> tuple[int, int | None, list[tuple[str, str]]]:
    store = ObjectStore()
    store.observe(
        {"apiVersion": "apps/v1", "kind": "StatefulSet",
         "metadata": {"name": "ha", "namespace": "db"}, "spec": {"replicas": have}}
    )  # fmt: skip
    scope = core.Scope(
        body={"kind": "Database", "metadata": {"name": "ha", "namespace": "db"}},
        kube=None,  # type: ignore[arg-type]
        store=store,
        now="t",
        conditions=[],
    )
    desired = [{"kind": "StatefulSet", "spec": {"replicas": wanted}}]
    move = core.hold_scale_down(scope, desired, wanted=wanted, primary=primary, pods=pods)
    return desired[0]["spec"]["replicas"], move, scope.progressing


def test_a_primary_below_the_cut_lets_the_scale_down_go() -> None:
    assert hold(3, 1, "ha-0", [pod("ha-0"), pod("ha-1"), pod("ha-2")]) == (1, None, [])


def test_a_primary_above_the_cut_keeps_the_ordinals_up_to_it_and_moves_first() -> None:
    replicas, move, progressing = hold(5, 2, "ha-3", [pod(f"ha-{i}") for i in range(5)])
    assert (replicas, move) == (4, 2)  # ha-4 goes now; ha-2 and ha-3 after the move
    assert progressing == [("Scaling", "scaling to 2 waits for the primary ha-3 to move below"
                                       " ordinal 2")]  # fmt: skip


def test_while_the_primary_is_unknown_no_running_server_above_the_cut_is_removed() -> None:
    pods = [pod("ha-0"), pod("ha-1"), pod("ha-2"), pod("ha-3", "Pending")]
    replicas, move, progressing = hold(4, 1, None, pods)
    assert (replicas, move) == (3, None)  # ha-3 never ran: it cannot be the primary
    assert "a known primary (ha-1, ha-2 may be it)" in progressing[0][1]


def test_pods_that_never_ran_hold_nothing() -> None:
    assert hold(3, 1, None, [pod("ha-0"), pod("ha-1", "Pending")])[:2] == (1, None)


def test_growing_or_staying_is_never_held() -> None:
    assert hold(3, 3, "ha-2", [pod("ha-2")]) == (3, None, [])
    assert hold(3, 5, None, [pod("ha-2")]) == (5, None, [])
