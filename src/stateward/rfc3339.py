"""RFC 3339 timestamps as Kubernetes writes them (``2026-12-04T12:00:00Z``): the one parser
and the one formatter every layer uses. A leaf: it imports nothing else of Stateward."""

from __future__ import annotations

import datetime

__all__ = ["format", "now", "parse", "seconds_between", "seconds_since"]


def format(moment: datetime.datetime) -> str:
    """``moment`` in UTC, to the second, with ``Z``."""
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now() -> str:
    return format(datetime.datetime.now(datetime.UTC))


def parse(value: object) -> datetime.datetime | None:
    """An RFC 3339 time (``Z`` or an offset, fractions allowed) as an aware datetime; None
    for anything else, a time without a zone among it."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


def seconds_between(earlier: str, later: str) -> float:
    """Seconds from ``earlier`` to ``later``; ValueError naming one that is no RFC 3339 time."""
    return (_strict(later) - _strict(earlier)).total_seconds()


def seconds_since(stamp: str, now: datetime.datetime | None = None) -> float:
    return ((now or datetime.datetime.now(datetime.UTC)) - _strict(stamp)).total_seconds()


def _strict(stamp: str) -> datetime.datetime:
    parsed = parse(stamp)
    if parsed is None:
        raise ValueError(f"{stamp!r} is not an RFC 3339 time")
    return parsed
