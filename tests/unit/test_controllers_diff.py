"""Containment: API-server defaults are not drift, our own fields are."""

from __future__ import annotations

import pytest

from stateward.controllers.diff import differences

pytestmark = pytest.mark.unit


def test_defaults_added_by_the_server_are_not_drift() -> None:
    desired = {"spec": {"ports": [{"port": 5432}], "selector": {"a": "b"}}}
    observed = {
        "spec": {
            "ports": [{"port": 5432, "protocol": "TCP", "targetPort": 5432}],
            "selector": {"a": "b"},
            "clusterIP": "10.96.0.7",
        },
        "status": {},
    }
    assert differences(observed, desired) == []


@pytest.mark.parametrize(
    ("observed", "path"),
    [
        ({"spec": {"selector": {"a": "c"}}}, ".spec.selector.a"),
        ({"spec": {}}, ".spec.selector"),
        ({"spec": {"selector": "text"}}, ".spec.selector"),
        ({}, ".spec"),
    ],
)
def test_changed_or_missing_fields_are_drift(observed: dict[str, object], path: str) -> None:
    assert differences(observed, {"spec": {"selector": {"a": "b"}}}) == [path]


def test_lists_must_match_in_length_and_order() -> None:
    desired = {"args": ["a", "b"]}
    assert differences({"args": ["a", "b"]}, desired) == []
    assert differences({"args": ["b", "a"]}, desired) == [".args[0]", ".args[1]"]
    assert differences({"args": ["a"]}, desired) == [".args"]
    assert differences({"args": ["a", "b", "c"]}, desired) == [".args"]


def test_every_difference_is_named() -> None:
    desired = {"a": 1, "b": {"c": 2, "d": [{"e": 3}]}}
    observed = {"a": 2, "b": {"c": 2, "d": [{"e": 4, "f": 5}]}}
    assert differences(observed, desired) == [".a", ".b.d[0].e"]


def test_scalars_compare_by_value_and_type() -> None:
    assert differences(1, 1) == []
    assert differences("1", 1) == ["."]


@pytest.mark.parametrize(
    ("observed", "desired"),
    [("1Gi", "1024Mi"), ("1", "1000m"), ("500m", "0.5"), ("2G", "2000M")],
)
def test_quantities_compare_by_value(observed: str, desired: str) -> None:
    # The API server canonicalizes quantities; that is not drift.
    have = {"resources": {"requests": {"memory": observed}}}
    want = {"resources": {"requests": {"memory": desired}}}
    assert differences(have, want) == []


def test_a_changed_quantity_is_drift_and_other_strings_compare_exactly() -> None:
    assert differences({"r": {"limits": {"cpu": "1"}}}, {"r": {"limits": {"cpu": "2"}}}) == [
        ".r.limits.cpu"
    ]
    assert differences({"image": "pg:1"}, {"image": "pg:1.0"}) == [".image"]
