"""Polling with a deadline: the only way tests wait."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class Timeout(AssertionError):
    pass


def wait_for(
    probe: Callable[[], T | None],
    *,
    what: str,
    timeout: float = 60.0,
    interval: float = 0.2,
) -> T:
    """Call ``probe`` until it returns something truthy; fail naming ``what`` and the last value.

    Exceptions from the probe count as "not yet" (the API may be briefly unavailable) and
    the last one is reported if the deadline passes.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = probe()
        except Exception as error:
            value, last = None, error
        else:
            last = value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise Timeout(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}")
        time.sleep(interval)
