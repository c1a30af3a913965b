"""Leader election on a ``coordination.k8s.io/v1`` Lease, in the manner of client-go.

Atomicity: every acquire and renew is a replace that carries the resourceVersion we read, so
of two candidates writing the same Lease at once the API server accepts exactly one and
refuses the other with a conflict.

Expiry is judged by the local monotonic clock, never by comparing our wall clock with the
holder's ``renewTime``: a candidate takes over only after it has watched the Lease stay
unchanged for a whole ``leaseDurationSeconds``. The holder, in turn, counts itself leader
only while its last successful renew is younger than ``renew_deadline`` (shorter than the
lease duration), so after any pause — a stalled process, a partition — it stops writing
before anyone else may have started. A renew's age counts from when it was sent, and
:meth:`LeaderElector.term_left` says how long the Lease surely stays ours.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import time
from collections.abc import Callable
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease

from stateward.controllers.kube import UNREACHABLE

logger = logging.getLogger(__name__)


def _wall() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class LeaderElector:
    def __init__(
        self,
        client: AsyncClient,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not retry_period < renew_deadline < lease_duration:
            raise ValueError("need retry_period < renew_deadline < lease_duration")
        self.client = client
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.clock = clock
        self._last_renew: float | None = None
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self.acquired = asyncio.Event()
        self.lost = asyncio.Event()

    def is_leader(self) -> bool:
        """True only while a renew succeeded less than ``renew_deadline`` ago."""
        return (
            self._last_renew is not None
            and not self.lost.is_set()
            and self.clock() - self._last_renew < self.renew_deadline
        )

    def term_left(self) -> float:
        """Seconds for which no other candidate can hold the Lease (0 unless leader).

        A candidate takes over only after it has seen the Lease unchanged for a whole
        ``leaseDurationSeconds``, and it can have seen our last renew no earlier than we sent
        it: until that send plus the duration, the Lease is ours. What must not outlive the
        term (a failover statement to a database server) is given a deadline inside it."""
        if not self.is_leader() or self._last_renew is None:
            return 0.0
        return max(0.0, int(self.lease_duration) - (self.clock() - self._last_renew))

    def reset(self) -> None:
        """Back to candidate after a lost term (called once the term's work has stopped)."""
        self._last_renew = None
        self.acquired.clear()
        self.lost.clear()

    async def run(self, stop: asyncio.Event) -> None:
        """Campaign and renew until ``stop`` is set; ``acquired``/``lost`` mark each term."""
        while not stop.is_set():
            sent = self.clock()  # a term counts from when its renew was sent, not answered
            try:
                renewed = await asyncio.wait_for(self._try_acquire_or_renew(), self.retry_period)
            except (ApiError, *UNREACHABLE) as error:  # the API server down or refusing
                logger.warning("leader election: lease %s/%s: %s", self.namespace, self.name, error)
                renewed = False
            except Exception:
                logger.exception("leader election: unexpected error")
                renewed = False
            if renewed and self.lost.is_set():
                renewed = False  # the old term is still being torn down; renew after reset()
            if renewed:
                self._last_renew = sent
                if not self.acquired.is_set():
                    logger.info("became leader as %s", self.identity)
                    self.acquired.set()
            elif self.acquired.is_set() and not self.lost.is_set() and not self.is_leader():
                logger.warning("lost leadership: could not renew within %.0fs", self.renew_deadline)
                self.lost.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.retry_period)
        if self.is_leader():
            await self._release()

    async def _try_acquire_or_renew(self) -> bool:
        now = _wall()
        try:
            lease = await self.client.get(Lease, self.name, namespace=self.namespace)
        except ApiError as error:
            if error.status.code != 404:
                raise
            await self.client.create(
                Lease(
                    metadata=ObjectMeta(name=self.name, namespace=self.namespace),
                    spec=LeaseSpec(
                        holderIdentity=self.identity,
                        leaseDurationSeconds=int(self.lease_duration),
                        acquireTime=now,
                        renewTime=now,
                        leaseTransitions=0,
                    ),
                )
            )
            return True
        spec = lease.spec or LeaseSpec()
        record = (spec.holderIdentity, spec.renewTime, spec.leaseTransitions)
        if record != self._observed:
            self._observed, self._observed_at = record, self.clock()
        holder = spec.holderIdentity
        if holder and holder != self.identity:
            duration = float(spec.leaseDurationSeconds or self.lease_duration)
            if self.clock() - self._observed_at < duration:
                return False
            logger.info("lease held by %s expired; taking over", holder)
        if holder != self.identity:
            spec.leaseTransitions = (spec.leaseTransitions or 0) + 1
            spec.acquireTime = now
        spec.holderIdentity = self.identity
        spec.leaseDurationSeconds = int(self.lease_duration)
        spec.renewTime = now
        lease.spec = spec
        # replace() sends metadata.resourceVersion: a concurrent writer makes this a conflict.
        updated = await self.client.replace(lease)
        updated_spec = updated.spec or LeaseSpec()
        self._observed = (
            updated_spec.holderIdentity,
            updated_spec.renewTime,
            updated_spec.leaseTransitions,
        )
        self._observed_at = self.clock()
        return True

    async def _release(self) -> None:
        """Hand the Lease back on a clean stop so a standby need not wait for expiry."""
        with contextlib.suppress(Exception):
            lease = await self.client.get(Lease, self.name, namespace=self.namespace)
            if lease.spec and lease.spec.holderIdentity == self.identity:
                lease.spec.holderIdentity = None
                lease.spec.leaseDurationSeconds = 1
                await self.client.replace(lease)
                logger.info("released the leader lease")
