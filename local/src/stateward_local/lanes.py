"""Two pieces of work side by side: one in a thread, one in the caller's thread."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
U = TypeVar("U")


def side_by_side(
    background: Callable[[], T], foreground: Callable[[], U], *, name: str
) -> tuple[T, U]:
    """Run ``background`` in a daemon thread called ``name`` while ``foreground`` runs here;
    return both results. The foreground stays in the caller's thread so that its cleanup
    runs on any interruption; an exception of the background is re-raised here once both
    are done (one of the foreground propagates at once, leaving the daemon thread behind)."""
    results: list[T] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            results.append(background())
        except BaseException as error:  # re-raised below, in the caller's thread
            failed.append(error)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    ahead = foreground()
    thread.join()
    if failed:
        raise failed[0]
    return results[0], ahead
