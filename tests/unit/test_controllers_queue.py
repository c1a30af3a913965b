"""The work queue: one run per burst of adds, never two at once per key, backoff on failure."""

from __future__ import annotations

import asyncio
import itertools
import logging

import pytest

from stateward.controllers.queue import Backoff, Outcome, WorkQueue

pytestmark = [pytest.mark.unit, pytest.mark.timeout(20)]


async def _until(predicate: object, within: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not predicate():  # type: ignore[operator]
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.01)


def test_backoff_doubles_up_to_the_cap_and_resets() -> None:
    backoff = Backoff(base=1, cap=5)
    assert [backoff.next("k") for _ in range(5)] == [1, 2, 4, 5, 5]
    assert backoff.failures("k") == 5
    backoff.reset("k")
    assert backoff.next("k") == 1


async def test_adds_while_waiting_collapse_into_one_run() -> None:
    runs: list[str] = []
    gate = asyncio.Event()

    async def handle(key: str) -> Outcome:
        await gate.wait()
        runs.append(key)
        return Outcome()

    queue: WorkQueue[str] = WorkQueue(handle, workers=2)
    for _ in range(5):
        queue.add("a")
    queue.add("b")
    assert len(queue) == 2
    queue.start()
    gate.set()
    await _until(lambda: len(runs) == 2)
    await asyncio.sleep(0.05)
    await queue.stop()
    assert sorted(runs) == ["a", "b"]


async def test_a_key_is_never_processed_twice_at_once_and_reruns_if_dirty() -> None:
    active = 0
    peak = 0
    runs = 0
    release = asyncio.Event()

    async def handle(_: str) -> Outcome:
        nonlocal active, peak, runs
        active += 1
        peak = max(peak, active)
        runs += 1
        if runs == 1:
            await release.wait()
        active -= 1
        return Outcome()

    queue: WorkQueue[str] = WorkQueue(handle, workers=4)
    queue.start()
    queue.add("k")
    await _until(lambda: runs == 1)
    queue.add("k")  # arrives while the first run is in progress
    queue.add("k")
    release.set()
    await _until(lambda: runs == 2)
    await asyncio.sleep(0.05)
    await queue.stop()
    assert peak == 1
    assert runs == 2


async def test_failures_retry_with_backoff_and_success_resets_it() -> None:
    attempts: list[float] = []

    async def handle(_: str) -> Outcome:
        attempts.append(asyncio.get_running_loop().time())
        if len(attempts) < 3:
            raise RuntimeError("transient")
        return Outcome()

    queue: WorkQueue[str] = WorkQueue(handle, workers=1, backoff=Backoff(base=0.05, cap=1))
    queue.start()
    queue.add("k")
    await _until(lambda: len(attempts) == 3)
    await queue.stop()
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert gaps[0] >= 0.04 and gaps[1] >= 0.09, gaps
    assert queue.backoff.failures("k") == 0


async def test_an_outage_is_logged_as_a_warning_and_a_defect_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The API server down fails every reconcile for as long as it lasts: a warning a retry,
    # not an error with a traceback; anything else is a defect and keeps its traceback.
    errors = [ConnectionRefusedError("All connection attempts failed"), KeyError("spec")]

    async def handle(_: str) -> Outcome:
        if errors:
            raise errors.pop(0)
        return Outcome()

    caplog.set_level(logging.WARNING, logger="stateward.controllers.queue")
    queue: WorkQueue[str] = WorkQueue(
        handle,
        workers=1,
        backoff=Backoff(base=0.01, cap=0.05),
        transient=lambda error: isinstance(error, OSError),
    )
    queue.start()
    queue.add("k")
    await _until(lambda: not errors and queue.backoff.failures("k") == 0)
    await queue.stop()
    outage, defect = caplog.records
    assert outage.levelno == logging.WARNING and outage.exc_info is None
    assert "ConnectionRefusedError: All connection attempts failed" in outage.getMessage()
    assert defect.levelno == logging.ERROR and defect.exc_info is not None


async def test_events_during_a_backoff_wait_for_the_retry_and_an_urgent_add_does_not() -> None:
    """A failing key's children keep sending events (a crash-looping pod): they must not run
    it at their rate. The retry runs when due; a change of the object itself runs at once."""
    attempts: list[str] = []

    async def handle(_: str) -> Outcome:
        attempts.append("run")
        raise RuntimeError("still failing")

    # A first retry 1 s away: far longer than the adds below take.
    queue: WorkQueue[str] = WorkQueue(handle, workers=1, backoff=Backoff(base=1.0, cap=10))
    queue.start()
    queue.add("k")
    await _until(lambda: len(attempts) == 1)
    await asyncio.sleep(0.02)  # the failure has scheduled its retry
    for _ in range(20):
        queue.add("k")  # child events
        await asyncio.sleep(0.005)
    assert len(attempts) == 1, "events ran a key that is backing off"
    assert len(queue) == 0
    queue.add("k", urgent=True)  # the object's spec changed
    await _until(lambda: len(attempts) == 2, within=0.5)
    await queue.stop()


async def test_a_requeue_timer_is_no_backoff_an_event_runs_the_key_at_once() -> None:
    runs = 0

    async def handle(_: str) -> Outcome:
        nonlocal runs
        runs += 1
        return Outcome(requeue_after=30)

    queue: WorkQueue[str] = WorkQueue(handle, workers=1)
    queue.start()
    queue.add("k")
    await _until(lambda: runs == 1)
    queue.add("k")  # a child changed: no need to wait the 30 s re-check
    await _until(lambda: runs == 2, within=1.0)
    await queue.stop()


async def test_requeue_after_runs_again_and_forget_cancels_it() -> None:
    runs = 0

    async def handle(_: str) -> Outcome:
        nonlocal runs
        runs += 1
        return Outcome(requeue_after=0.05)

    queue: WorkQueue[str] = WorkQueue(handle, workers=1)
    queue.start()
    queue.add("k")
    await _until(lambda: runs >= 2)
    queue.forget("k")
    seen = runs
    await asyncio.sleep(0.2)
    await queue.stop()
    assert runs <= seen + 1


async def test_a_backlog_of_cpu_only_work_does_not_starve_the_event_loop() -> None:
    # A converged cluster's reconcile awaits no I/O. A thousand of them queued must still
    # let other tasks (Lease renewal, watches, probes) run between them.
    def busy(seconds: float) -> None:
        end = asyncio.get_running_loop().time() + seconds
        while asyncio.get_running_loop().time() < end:
            pass

    async def handle(_: int) -> Outcome:
        busy(0.002)
        return Outcome()

    queue: WorkQueue[int] = WorkQueue(handle, workers=4)
    for key in range(1000):
        queue.add(key)
    loop = asyncio.get_running_loop()
    asked = loop.time()
    late: list[float] = []
    loop.call_later(0.05, lambda: late.append(loop.time() - asked - 0.05))
    queue.start()
    await _until(lambda: bool(late), within=10)
    await queue.stop()
    assert late[0] < 0.5, f"a 50 ms timer fired {late[0]:.2f}s late"


async def test_a_change_runs_before_a_resync_backlog_and_each_key_runs_once() -> None:
    runs: list[str] = []
    done = asyncio.Event()

    async def handle(key: str) -> Outcome:
        runs.append(key)
        if len(runs) == 6:
            done.set()
        return Outcome()

    queue: WorkQueue[str] = WorkQueue(handle, workers=1)
    for key in ("r1", "r2", "r3", "changed"):
        queue.add(key, background=True)  # a resync of every object
    queue.add("changed", urgent=True)  # its spec changed: ahead of the resync
    queue.add("pod-died")  # a child's event: ahead of the resync too
    queue.add("r2", background=True)  # a second resync add changes nothing
    queue.add("r3")  # a foreground event for a key the resync queued: moves ahead
    assert len(queue) == 5
    queue.start()
    await _until(lambda: len(runs) == 5)
    await asyncio.sleep(0.05)
    await queue.stop()
    assert runs == ["changed", "pod-died", "r3", "r1", "r2"]
    assert not done.is_set()  # nothing ran twice


async def test_a_resync_does_not_cut_a_failures_backoff_short() -> None:
    attempts = 0

    async def handle(_: str) -> Outcome:
        nonlocal attempts
        attempts += 1
        raise RuntimeError("broken")

    queue: WorkQueue[str] = WorkQueue(handle, workers=1, backoff=Backoff(base=30, cap=30))
    queue.start()
    queue.add("k")
    await _until(lambda: attempts == 1)
    await asyncio.sleep(0.05)
    queue.add("k", background=True)
    queue.add("k", urgent=True, background=True)
    await asyncio.sleep(0.1)
    assert attempts == 1
    queue.add("k", urgent=True)  # the object itself changed
    await _until(lambda: attempts == 2)
    await queue.stop()
