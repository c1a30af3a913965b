"""Conditions follow API conventions: transition times move only when the status does."""

from __future__ import annotations

import httpx
import pytest
from lightkube import ApiError

from stateward.controllers.conditions import get_condition, is_true, set_condition
from stateward.controllers.postgres.reconcile import failure_message
from stateward.controllers.postgres.status import pod_problem

pytestmark = pytest.mark.unit


def _set(
    conditions: list[dict[str, object]], status: bool | None, now: str, **kw: str
) -> list[dict[str, object]]:
    return set_condition(
        conditions,
        type="Ready",
        status=status,
        reason=kw.get("reason", "R"),
        message=kw.get("message", "m"),
        generation=3,
        now=now,
    )


def test_new_condition_gets_the_current_time_and_generation() -> None:
    (ready,) = _set([], True, "t1")
    assert ready == {
        "type": "Ready",
        "status": "True",
        "reason": "R",
        "message": "m",
        "lastTransitionTime": "t1",
        "observedGeneration": 3,
    }


def test_same_status_keeps_the_transition_time_even_if_the_message_changes() -> None:
    first = _set([], True, "t1")
    second = _set(first, True, "t2", message="other")
    assert second[0]["lastTransitionTime"] == "t1"
    assert second[0]["message"] == "other"


def test_status_change_moves_the_transition_time() -> None:
    first = _set([], True, "t1")
    assert _set(first, False, "t2")[0]["lastTransitionTime"] == "t2"
    assert _set(first, None, "t3")[0]["status"] == "Unknown"


def test_order_of_other_conditions_is_kept() -> None:
    others = [
        {"type": "A", "status": "True"},
        {"type": "Ready", "status": "False", "lastTransitionTime": "t0"},
        {"type": "B", "status": "False"},
    ]
    updated = _set(others, True, "t1")
    assert [c["type"] for c in updated] == ["A", "Ready", "B"]
    assert others[1]["status"] == "False", "the input list is not mutated"


def test_lookups() -> None:
    conditions = _set([], True, "t1")
    assert is_true(conditions, "Ready")
    assert not is_true(conditions, "Degraded")
    assert get_condition(conditions, "Degraded") is None


def test_a_failed_reconcile_reports_the_api_servers_words_or_only_the_error_type() -> None:
    response = httpx.Response(
        403,
        json={
            "kind": "Status",
            "code": 403,
            "reason": "Forbidden",
            "message": 'services "pg-primary" is forbidden: exceeded quota: no-services',
        },
        request=httpx.Request("PATCH", "https://k8s/api/v1/namespaces/ns/services/pg-primary"),
    )
    assert failure_message(ApiError(response=response)) == (
        "the API server refused a write: 403 Forbidden:"
        ' services "pg-primary" is forbidden: exceeded quota: no-services'
    )
    # Any other exception's text could carry anything (a password in a connection string):
    # only its type is reported.
    message = failure_message(ValueError("postgres://app:s3cret@db"))
    assert "s3cret" not in message and message.startswith("ValueError")


def _pod(**status: object) -> dict[str, object]:
    return {"metadata": {"name": "pg-final-backup-x"}, "status": status}


def test_pod_problems_name_the_pod_and_the_reason() -> None:
    unschedulable = _pod(
        phase="Pending",
        conditions=[
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient memory.",
            }
        ],
    )
    assert pod_problem(unschedulable) == (
        "pod pg-final-backup-x Unschedulable: 0/3 nodes are available: 3 Insufficient memory."
    )
    pulling = _pod(
        phase="Pending",
        containerStatuses=[
            {
                "name": "backup",
                "state": {
                    "waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling "x"'}
                },
            }
        ],
    )
    assert pod_problem(pulling) == 'pod pg-final-backup-x ImagePullBackOff: Back-off pulling "x"'
    # Starting normally is not a problem.
    creating = _pod(
        phase="Pending",
        containerStatuses=[
            {"name": "backup", "state": {"waiting": {"reason": "ContainerCreating"}}}
        ],
    )
    assert pod_problem(creating) is None
    assert pod_problem(_pod(phase="Running")) is None
