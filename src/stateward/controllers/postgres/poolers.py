"""A cluster's PgBouncer pods around a switchover: ``PAUSE`` before the primary steps down,
``RESUME`` once the primary Service leads to the new one.

Paused, PgBouncer lets the transactions running finish, closes its server connections and
holds every new query; resumed, it opens new ones through the primary Service. So a client
of the pooler sees a switchover as a pause, not as an error: nothing reaches the old primary
while it steps down, and nothing is sent on before the Service's endpoint is the new primary
(``EndpointSlice``) and kube-proxy had a moment to follow. The reconcile that asked for the
switchover waits for that itself (:data:`INLINE_SECONDS`), so the pause ends as soon as the
Service follows rather than at a later reconcile.

What is paused is kept in ``status.switchover.poolerPaused`` and in the reconciler's memory;
an operator that starts and finds no switchover running resumes every pooler pod once, so a
pause is never left behind by a crash between the ``PAUSE`` and the status write.
"""

from __future__ import annotations

import asyncio
import time
from typing import Final

from stateward.controllers import certificates
from stateward.controllers.kube import Body
from stateward.controllers.postgres import pgbouncer
from stateward.controllers.postgres.scope import Scope
from stateward.instance import pooler
from stateward.specs import meta
from stateward.specs.postgres import pooler as pooler_spec

PAUSE_SECONDS: Final = 10.0
"""PAUSE waits for the transactions running through PgBouncer; one longer than this is not
waited for: the pods are resumed and the switchover goes on unpaused (such a transaction
would have failed as the primary stepped down anyway)."""
RESUME_SECONDS: Final = 5.0
SETTLE_SECONDS: Final = 1.0
"""After the primary Service's endpoint moved: kube-proxy's own sync (its minimum period is
one second) before PgBouncer opens connections through the Service again."""
RETRY: Final = 0.5
"""While a switchover waits to resume the pooler."""
INLINE_SECONDS: Final = 10.0
"""How long the reconcile that started a switchover watches the primary Service for the new
primary before it leaves the resume to the reconciles that follow (every :data:`RETRY`)."""
POLL: Final = 0.2
"""Between two looks at the primary Service's EndpointSlice within :data:`INLINE_SECONDS`."""
LEFT_BEHIND_RETRY: Final = 30.0
"""While a pause left behind cannot be resumed (a pod not answering)."""
ALREADY: Final = ("already suspended/paused", "not paused")
"""PgBouncer's answers to a PAUSE of a paused pooler and a RESUME of a running one: done."""


def pooler_pods(scope: Scope) -> list[Body]:
    return [
        pod
        for pod in scope.owned("Pod")
        if not pod["metadata"].get("deletionTimestamp")
        and (pod["metadata"].get("labels") or {}).get(meta.COMPONENT_LABEL) == pooler_spec.COMPONENT
        and (pod.get("status") or {}).get("podIP")
        and meta.pod_ready(pod)  # one not ready yet serves nobody and may not listen yet
    ]


def _key(scope: Scope) -> tuple[str, str]:
    return scope.namespace, scope.name


async def _each(scope: Scope, pods: list[Body], command: str, seconds: float) -> dict[str, str]:
    """``command`` on every pod at once: the pods that did not do it, with why."""
    context = await certificates.console_context(scope, scope.cluster, pooler.ADMIN_ROLE)
    if context is None:
        return {p["metadata"]["name"]: "no certificate for the console yet" for p in pods}
    answers = await asyncio.gather(
        *(
            pgbouncer.console(p["status"]["podIP"], pooler.PORT, context, command, seconds=seconds)
            for p in pods
        ),
        return_exceptions=True,
    )
    failed = {}
    for pod, answer in zip(pods, answers, strict=True):
        if isinstance(answer, BaseException) and not any(a in str(answer) for a in ALREADY):
            if not isinstance(answer, pgbouncer.ConsoleError):
                raise answer
            failed[pod["metadata"]["name"]] = str(answer)
    return failed


async def pause(scope: Scope) -> list[str]:
    """PAUSE every pooler pod before a switchover; the names paused, or [] when there is no
    pooler or one pod could not be paused (then none stays paused, and an Event says why)."""
    if scope.cluster.spec.pooler is None:
        return []
    pods = pooler_pods(scope)
    if not pods:
        return []
    failed = await _each(scope, pods, "PAUSE", PAUSE_SECONDS)
    names = sorted(p["metadata"]["name"] for p in pods)
    if failed:
        await resume(scope, names)
        first, why = next(iter(sorted(failed.items())))
        await scope.event(
            "PoolerNotPaused",
            f"The switchover goes on without pausing the pooler: {first}: {why}",
            warning=True,
        )
        return []
    scope.paused_poolers[_key(scope)] = names
    return names


async def resume(scope: Scope, names: list[str] | None = None) -> bool:
    """RESUME the pooler pods ``names`` (default: every one); True once none is paused."""
    pods = pooler_pods(scope)
    if names is not None:
        pods = [p for p in pods if p["metadata"]["name"] in names]
    failed = await _each(scope, pods, "RESUME", RESUME_SECONDS) if pods else {}
    if failed:
        return False
    scope.paused_poolers[_key(scope)] = []
    return True


async def _served_only_by(scope: Scope, address: str) -> bool:
    """Whether the primary Service's ready endpoints are ``address`` and nothing else."""
    slices = await scope.kube.list_objects(
        "discovery.k8s.io/v1",
        "EndpointSlice",
        scope.namespace,
        {"kubernetes.io/service-name": scope.cluster.primary_service_name},
    )
    serving = {
        found
        for s in slices
        for endpoint in s.get("endpoints") or []
        if (endpoint.get("conditions") or {}).get("ready") is not False
        for found in endpoint.get("addresses") or []
    }
    return serving == {address}


async def resume_once_served(scope: Scope, primary_address: str, names: list[str]) -> bool:
    """RESUME ``names`` once the primary Service leads only to ``primary_address`` (and
    kube-proxy had :data:`SETTLE_SECONDS`); False while it does not yet, or a pod did not
    answer (the caller asks again shortly)."""
    if not await _served_only_by(scope, primary_address):
        scope.requeue(RETRY)
        return False
    await asyncio.sleep(SETTLE_SECONDS)
    if not await resume(scope, names):
        scope.requeue(RETRY)
        return False
    return True


async def resume_when_served(scope: Scope, primary_address: str, names: list[str]) -> bool:
    """As :func:`resume_once_served`, watching the Service for up to :data:`INLINE_SECONDS`
    instead of once; False if it did not lead to ``primary_address`` alone by then or a pod
    did not answer."""
    deadline = time.monotonic() + INLINE_SECONDS
    while not await _served_only_by(scope, primary_address):
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(POLL)
    await asyncio.sleep(SETTLE_SECONDS)
    return await resume(scope, names)


async def resume_left_behind(scope: Scope, running: bool) -> str | None:
    """With no switchover running: RESUME what this operator paused and has not resumed, and
    once after it starts, every pooler pod (a pause a crash may have left behind)."""
    if running or scope.cluster.spec.pooler is None:
        return None
    left = scope.paused_poolers.get(_key(scope))
    if left == []:
        return None
    if not pooler_pods(scope):
        return None
    if await resume(scope, left):
        return "resumed the pooler" if left else None
    scope.requeue(LEFT_BEHIND_RETRY)
    return "the pooler did not answer RESUME; retrying"
