"""A work queue of object keys: deduplicated, serialized per key, with per-key backoff.

The shape is client-go's workqueue: a key added many times while waiting is processed once;
a key is never processed by two workers at once (an add during processing marks it dirty and
it runs again afterwards); failures requeue with exponential backoff that resets on success.
A key waiting out its backoff is not run early by the events its own children send (they
are folded into the retry); only an urgent add — the object itself changed — runs it now.

Keys added in the ``background`` (the periodic resync of every object) wait behind every
other: a changed spec or a pod that died is processed next, not after a thousand
reconciles that find nothing to do. A background key added again in the foreground moves
ahead.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a processed key asks for next: nothing, or another run after ``requeue_after``."""

    requeue_after: float | None = None


class Backoff:
    """Exponential per-key delays: base, 2*base, 4*base ... capped at ``cap``."""

    def __init__(self, *, base: float = 0.5, cap: float = 60.0) -> None:
        self.base, self.cap = base, cap
        self._failures: dict[Hashable, int] = {}

    def next(self, key: Hashable) -> float:
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        return float(min(self.cap, self.base * (2**failures)))

    def reset(self, key: Hashable) -> None:
        self._failures.pop(key, None)

    def failures(self, key: Hashable) -> int:
        return self._failures.get(key, 0)


class WorkQueue(Generic[K]):
    def __init__(
        self,
        handler: Callable[[K], Awaitable[Outcome]],
        *,
        workers: int = 4,
        backoff: Backoff | None = None,
        transient: Callable[[BaseException], bool] = lambda error: False,
    ) -> None:
        self._handler = handler
        self._transient = transient
        """Failures that are an outage to ride out (the API server down): logged as a
        warning, without the traceback every retry would otherwise repeat."""
        self._workers = workers
        self.backoff = backoff or Backoff()
        self._ready: asyncio.PriorityQueue[tuple[int, int, K]] = asyncio.PriorityQueue()
        """(lane, arrival, key): the foreground lane (0) before the background (1), each in
        order of arrival. A key moved ahead leaves a stale entry behind, skipped when met."""
        self._queued: dict[K, int] = {}
        """Keys waiting, and the lane of their live entry."""
        self._arrivals = itertools.count()
        self._processing: set[K] = set()
        self._dirty: dict[K, bool] = {}
        """Keys added while processing, and whether urgently."""
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self._backing_off: set[K] = set()
        """Keys whose pending timer is a retry after a failure."""
        self._tasks: list[asyncio.Task[None]] = []

    def add(self, key: K, *, urgent: bool = False, background: bool = False) -> None:
        """Process ``key`` soon; a no-op if it is already waiting (in the background lane: it
        moves ahead unless this add is ``background`` too). A key waiting out a failure's
        backoff stays waiting unless ``urgent``: a failing reconcile must not run at the
        rate of its children's events (every pod update of a crash-looping cluster). A
        ``background`` add (a resync) runs after every other key waiting."""
        if key in self._backing_off and key in self._timers and (background or not urgent):
            return
        self._backing_off.discard(key)
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        if key in self._processing:
            self._dirty[key] = self._dirty.get(key, False) or urgent
            return
        lane = 1 if background else 0
        waiting = self._queued.get(key)
        if waiting is None or lane < waiting:
            self._queued[key] = lane
            self._ready.put_nowait((lane, next(self._arrivals), key))

    def add_after(self, key: K, delay: float, *, retry: bool = False) -> None:
        """Process ``key`` after ``delay`` seconds, unless an earlier run is already due;
        ``retry``: the delay is a failure's backoff (see :meth:`add`)."""
        existing = self._timers.get(key)
        loop = asyncio.get_running_loop()
        when = loop.time() + delay
        if key in self._queued or (existing is not None and existing.when() <= when):
            return
        if existing is not None:
            existing.cancel()
        self._timers[key] = loop.call_at(when, self._fire, key)
        if retry:
            self._backing_off.add(key)
        else:
            self._backing_off.discard(key)

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key, urgent=True)

    def forget(self, key: K) -> None:
        """Drop pending timers and backoff state of a key whose object is gone."""
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        self._backing_off.discard(key)
        self.backoff.reset(key)

    def __len__(self) -> int:
        return len(self._queued)

    async def _work(self) -> None:
        while True:
            lane, _, key = await self._ready.get()
            if self._queued.get(key) != lane:
                continue  # stale: the key moved to the foreground lane, or ran already
            del self._queued[key]
            self._processing.add(key)
            try:
                outcome = await self._handler(key)
            except asyncio.CancelledError:
                raise
            except Exception as error:
                delay = self.backoff.next(key)
                if self._transient(error):
                    logger.warning(
                        "processing %s failed (%s: %s); retrying in %.1fs",
                        key, type(error).__name__, error, delay,
                    )  # fmt: skip
                else:
                    logger.exception("processing %s failed; retrying in %.1fs", key, delay)
                self.add_after(key, delay, retry=True)
            else:
                self.backoff.reset(key)
                if outcome.requeue_after is not None:
                    self.add_after(key, outcome.requeue_after)
            finally:
                self._processing.discard(key)
                if key in self._dirty:
                    # After a failure only an urgent add runs before the retry is due.
                    self.add(key, urgent=self._dirty.pop(key))
            # Queue.get() does not suspend while keys are waiting, and a reconcile that finds
            # nothing to do awaits no I/O: without this, a backlog of no-op reconciles holds
            # the event loop for seconds, starving Lease renewal, watches and probes.
            await asyncio.sleep(0)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._work()) for _ in range(self._workers)]

    async def stop(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._backing_off.clear()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
