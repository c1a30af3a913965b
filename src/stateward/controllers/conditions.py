"""Status conditions by Kubernetes API conventions: the transition time moves only on change."""

from __future__ import annotations

from typing import Any

Condition = dict[str, Any]


def set_condition(
    conditions: list[Condition],
    *,
    type: str,
    status: bool | None,
    reason: str,
    message: str,
    generation: int,
    now: str,
) -> list[Condition]:
    """A new list with ``type`` set; ``lastTransitionTime`` kept when the status is unchanged."""
    wanted = {True: "True", False: "False", None: "Unknown"}[status]
    previous = next((c for c in conditions if c.get("type") == type), None)
    transition = (
        previous["lastTransitionTime"]
        if previous is not None
        and previous.get("status") == wanted
        and previous.get("lastTransitionTime")
        else now
    )
    updated = {
        "type": type,
        "status": wanted,
        "reason": reason,
        "message": message,
        "lastTransitionTime": transition,
        "observedGeneration": generation,
    }
    if previous is None:
        return [*conditions, updated]
    return [updated if c is previous else c for c in conditions]


def get_condition(conditions: list[Condition], type: str) -> Condition | None:
    return next((c for c in conditions if c.get("type") == type), None)


def is_true(conditions: list[Condition], type: str) -> bool:
    condition = get_condition(conditions, type)
    return condition is not None and condition.get("status") == "True"
