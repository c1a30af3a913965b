"""The one RFC 3339 parser and formatter."""

from __future__ import annotations

import datetime

import pytest

from stateward import rfc3339

pytestmark = pytest.mark.unit

UTC = datetime.UTC


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-12-04T12:00:00Z", datetime.datetime(2026, 12, 4, 12, tzinfo=UTC)),
        ("2026-12-04T13:00:00+01:00", datetime.datetime(2026, 12, 4, 12, tzinfo=UTC)),
        ("2026-12-04T12:00:00.25Z", datetime.datetime(2026, 12, 4, 12, 0, 0, 250000, tzinfo=UTC)),
    ],
)
def test_kubernetes_and_patroni_times_parse(text: str, expected: datetime.datetime) -> None:
    assert rfc3339.parse(text) == expected


@pytest.mark.parametrize(
    "value", [None, "", "yesterday", "2026-12-04T12:00:00", 5, "2026-13-01T00:00:00Z"]
)
def test_anything_else_is_none(value: object) -> None:
    assert rfc3339.parse(value) is None


def test_format_is_utc_to_the_second_with_z() -> None:
    moment = datetime.datetime(
        2026, 12, 4, 13, 0, 0, 999, tzinfo=datetime.timezone(datetime.timedelta(hours=1))
    )
    assert rfc3339.format(moment) == "2026-12-04T12:00:00Z"
    assert rfc3339.parse(rfc3339.now()) is not None


def test_seconds_between_and_since() -> None:
    assert rfc3339.seconds_between("2026-12-04T12:00:00Z", "2026-12-04T12:01:30Z") == 90
    now = datetime.datetime(2026, 12, 4, 12, 0, 10, tzinfo=UTC)
    assert rfc3339.seconds_since("2026-12-04T12:00:00Z", now) == 10
    with pytest.raises(ValueError, match="'soon' is not an RFC 3339 time"):
        rfc3339.seconds_since("soon", now)
